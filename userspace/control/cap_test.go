package control

import (
	"testing"
	"time"
)

type fakeCap struct {
	rate, burst float64
	until       time.Time
}

func (c *fakeCap) Cap(rule string, now time.Time) (float64, float64, time.Time, bool) {
	return c.rate, c.burst, c.until, rule == "f"
}

// A capped rule is written at min(its own rate, the cap), no longer than
// the cap's lease, and its offered rate is reported.
func TestLoopCap(t *testing.T) {
	clock := NewFakeClock(time.Unix(1000, 0))
	mono := uint64(5e9)
	l, err := NewLoop(clock, func() uint64 { return mono }, 50*time.Millisecond, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	k := newFakeKernel()
	c := &fakeCap{rate: 400, burst: 40, until: clock.Now().Add(300 * time.Millisecond)}
	l.SetCap(c)
	spec := RuleSpec{Name: "f", Behavior: BehaviorReject, Rate: 1000, Burst: 100, Capped: true}
	if !spec.Dynamic() {
		t.Fatal("a capped rule is not steered")
	}
	if err := l.Configure([]RuleSpec{spec}, map[string][]Target{"f": {{Kernel: k, Slot: 3}}}); err != nil {
		t.Fatal(err)
	}
	l.Tick()
	clock.Advance(100 * time.Millisecond)
	mono += 1e8
	k.admit(3, 50) // 50 passed + 100 dropped in 100 ms: 1500/s offered
	rep := l.Tick()
	lim := k.limits[3]
	if got := lim.Bucket.Rate(); got != 400 {
		t.Fatalf("rate %v, want the cap 400", got)
	}
	if got := lim.Bucket.Burst(); got != 40 {
		t.Fatalf("burst %v, want the cap's 40", got)
	}
	if want := mono + uint64(200*time.Millisecond); lim.DeadlineNS != want {
		t.Fatalf("deadline %d, want the lease's end %d", lim.DeadlineNS, want)
	}
	if r := rep.Rules[0]; r.Demand != 1500 || r.Rate != 400 {
		t.Fatalf("report %+v, want demand 1500 rate 400", r)
	}
	// A cap above the rule's own rate leaves the rate; a cap without a
	// lease leaves the loop's hold.
	c.rate, c.burst, c.until = 5000, 500, time.Time{}
	clock.Advance(50 * time.Millisecond)
	mono += 5e7
	l.Tick()
	if lim := k.limits[3]; lim.Bucket.Rate() != 1000 || lim.DeadlineNS != mono+uint64(time.Second) {
		t.Fatalf("uncapped: rate %v deadline %d", lim.Bucket.Rate(), lim.DeadlineNS-mono)
	}
}
