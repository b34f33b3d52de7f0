package fleet

import (
	"context"
	"math"
	"testing"
	"time"
)

// fleetLab runs hosts against a MemStore on a virtual clock, each writing
// its cap every tick as the daemon's loop does.
type fleetLab struct {
	t       *testing.T
	now     time.Time
	store   *MemStore
	hosts   map[string]*Host
	down    map[string]bool // the host is gone: no exchanges, no writes
	lost    bool            // the store does not answer
	offered map[string]float64
}

const labTick = 50 * time.Millisecond

func newFleetLab(t *testing.T, rule Rule, names ...string) *fleetLab {
	l := &fleetLab{t: t, now: time.Date(2026, 1, 1, 0, 0, 0, 7e6, time.UTC), hosts: map[string]*Host{}, down: map[string]bool{}, offered: map[string]float64{}}
	l.store = NewMemStore(func() time.Time { return l.now }, DefaultInterval)
	for _, n := range names {
		l.add(n, rule)
	}
	return l
}

func (l *fleetLab) add(name string, rule Rule) *Host {
	h, err := NewHost(name, Config{Guard: labTick + labTick/2})
	if err != nil {
		l.t.Fatal(err)
	}
	h.SetRules([]Rule{rule})
	l.hosts[name] = h
	return h
}

// run advances the clock by d in steps of 1 ms.
func (l *fleetLab) run(d time.Duration) {
	end := l.now.Add(d)
	for l.now.Before(end) {
		l.now = l.now.Add(time.Millisecond)
		for name, h := range l.hosts {
			if l.down[name] || !h.Due(l.now) {
				continue
			}
			if l.lost {
				h.Fail(l.now)
				continue
			}
			reps := h.Reports()
			ans, err := l.store.Exchange(context.Background(), name, reps)
			if err != nil {
				l.t.Fatal(err)
			}
			if err := h.Apply(l.now, l.now, reps, ans); err != nil {
				l.t.Fatal(err)
			}
		}
		if l.now.UnixMilli()%labTick.Milliseconds() == 0 {
			for name, h := range l.hosts {
				if !l.down[name] {
					h.Observe("web", l.offered[name], labTick)
				}
			}
		}
	}
}

func (l *fleetLab) cap(name string) float64 {
	c, _, _, ok := l.hosts[name].Cap("web", l.now)
	if !ok {
		l.t.Fatalf("%s: no fleet rule web", name)
	}
	return c
}

func (l *fleetLab) state(name string) Status { return l.hosts[name].Status(l.now)[0] }

func near(got, want, tol float64) bool { return math.Abs(got-want) <= tol }

var webRule = Rule{Name: "web", Key: "web", Budget: 3000, Burst: 300}

func TestHostSharesByDemand(t *testing.T) {
	l := newFleetLab(t, webRule, "a", "b", "c")
	l.offered["a"], l.offered["b"] = 10000, 10000
	l.run(2 * time.Second)
	a, b, c := l.cap("a"), l.cap("b"), l.cap("c")
	t.Logf("two flooded, one idle: %.1f %.1f %.1f", a, b, c)
	if !near(a, 1495, 1) || !near(b, 1495, 1) || !near(c, 10, 1) {
		t.Fatalf("shares %.1f %.1f %.1f, want 1495 1495 10 (the idle host keeps 1 %% of an equal share)", a, b, c)
	}
	if st := l.state("a"); st.State != StateLeased || st.Hosts != 3 || st.LeaseAge > 2*DefaultInterval {
		t.Fatalf("status %+v", st)
	}
	l.offered["c"] = 10000
	l.run(time.Second)
	a, b, c = l.cap("a"), l.cap("b"), l.cap("c")
	t.Logf("all three flooded after 1 s: %.1f %.1f %.1f", a, b, c)
	if !near(a, 1000, 1) || !near(b, 1000, 1) || !near(c, 1000, 1) {
		t.Fatalf("shares %.1f %.1f %.1f, want 1000 each within 1 s", a, b, c)
	}
}

func TestHostFaults(t *testing.T) {
	l := newFleetLab(t, webRule, "a", "b", "c")
	for _, n := range []string{"a", "b", "c"} {
		l.offered[n] = 10000
	}
	if got := l.cap("a"); got != 3000 {
		t.Fatalf("before any answer, without safe_rate: %v, want the budget (no host count known)", got)
	}
	l.run(2 * time.Second)
	// A host that disappears frees its share within 2T + L.
	l.down["c"] = true
	l.run(2*DefaultInterval + DefaultInterval + labTick)
	if a, b := l.cap("a"), l.cap("b"); !near(a, 1500, 1) || !near(b, 1500, 1) {
		t.Fatalf("after c left: %.1f %.1f, want 1500 each", a, b)
	}
	// A new host starts at the safe share: the budget ÷ (hosts + 1).
	d := l.add("d", webRule)
	l.offered["d"] = 10000
	l.run(time.Millisecond)
	if got, st := l.cap("d"), l.state("d"); !near(got, 1000, 1e-9) || st.State != StateNew {
		t.Fatalf("new host: %v (%s), want 1000 (new)", got, st.State)
	}
	_ = d
	l.run(time.Second)
	for _, n := range []string{"a", "b", "d"} {
		if got := l.cap(n); !near(got, 1000, 1) {
			t.Fatalf("%s after d joined: %.1f, want 1000", n, got)
		}
	}
	// The store is lost: the leases run out (T + L at most) and every host
	// falls back to the budget ÷ the last known number of hosts.
	l.lost = true
	l.run(2*DefaultInterval + time.Millisecond)
	total := 0.0
	for _, n := range []string{"a", "b", "d"} {
		st := l.state(n)
		if st.State != StateStoreLost {
			t.Fatalf("%s: state %s, want %s", n, st.State, StateStoreLost)
		}
		total += l.cap(n)
	}
	if !near(total, 3000, 1e-6) {
		t.Fatalf("store lost: total %v, want 3000", total)
	}
	// With safe_rate, that is the fallback.
	r := webRule
	r.SafeRate = 700
	for _, h := range l.hosts {
		h.SetRules([]Rule{r})
	}
	if got := l.cap("a"); got != 700 {
		t.Fatalf("safe_rate 700: %v", got)
	}
	// The store comes back: leases again within two epochs.
	l.lost = false
	l.run(3 * DefaultInterval)
	if st := l.state("a"); st.State != StateLeased {
		t.Fatalf("store back: %+v", st)
	}
}

// The lease deadline the cap gives is never after the lease's end, and
// near that end the cap is a safe share without a deadline.
func TestHostCapDeadline(t *testing.T) {
	l := newFleetLab(t, webRule, "a", "b")
	l.offered["a"] = 10000
	l.run(time.Second)
	_, _, until, _ := l.hosts["a"].Cap("web", l.now)
	if until.IsZero() || until.Sub(l.now) > 2*DefaultInterval {
		t.Fatalf("lease deadline %v from now, want within T + L", until.Sub(l.now))
	}
	l.lost = true
	l.run(until.Sub(l.now) - labTick)
	rate, _, until2, _ := l.hosts["a"].Cap("web", l.now)
	if !until2.IsZero() || rate > 1500 {
		t.Fatalf("within the guard of the lease's end: rate %v deadline %v, want ≤ the safe share 1500 without deadline", rate, until2)
	}
}

// The bound (docs/fleet.md): the rates of the hosts holding a lease never
// sum above the budget, whatever the timing, losses and shifts.
func TestSimulationBound(t *testing.T) {
	for _, lost := range []float64{0, 0.2} {
		res, err := Simulate(SimParams{
			Hosts: 40, Rules: 4, Duration: 8 * time.Second, ShiftAt: 4 * time.Second,
			Tick: 50 * time.Millisecond, Interval: DefaultInterval, Step: time.Millisecond,
			Skew: 1.2, Budget: 3000, Load: 2, Lost: lost, Seed: 3, RTT: 5 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("lost %.0f %%: max over %.4f %%, leased %.6f %%, admit error %.3f %%, converge %v, fallback %.2f %%, gaps %d",
			lost*100, res.MaxOver*100, res.MaxOverLeased*100, res.AdmitErr*100, res.Converge, res.Fallback*100, res.Gaps)
		if res.MaxOverLeased > 1e-9 {
			t.Errorf("lost %v: the leased rates exceeded the budget by %.6f %%", lost, res.MaxOverLeased*100)
		}
		if res.Gaps != 0 {
			t.Errorf("lost %v: %d writes after the previous deadline", lost, res.Gaps)
		}
		if lost == 0 && (res.Converge < 0 || res.Converge > time.Second || res.MaxOver > 1e-9) {
			t.Errorf("no losses: converge %v, max over %v", res.Converge, res.MaxOver)
		}
	}
}
