package control

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// fakeKernel simulates one interface: a saturating source offered more
// than any rate, admitted at exactly the rate in force.
type fakeKernel struct {
	counters map[int]*dataplane.Counters
	limits   map[int]dataplane.Limit
	failRead bool
}

func newFakeKernel() *fakeKernel {
	return &fakeKernel{counters: map[int]*dataplane.Counters{}, limits: map[int]dataplane.Limit{}}
}

func (k *fakeKernel) Counters(slot int) (dataplane.Counters, error) {
	if k.failRead {
		return dataplane.Counters{}, errors.New("injected read failure")
	}
	if c := k.counters[slot]; c != nil {
		return *c, nil
	}
	return dataplane.Counters{}, nil
}

func (k *fakeKernel) SetLimit(slot int, l dataplane.Limit) error {
	k.limits[slot] = l
	return nil
}

// admit adds n passed packets (and some drops) to a slot.
func (k *fakeKernel) admit(slot int, n uint64) {
	c := k.counters[slot]
	if c == nil {
		c = &dataplane.Counters{}
		k.counters[slot] = c
	}
	c.Packets[dataplane.VerdictPass] += n
	c.Packets[dataplane.VerdictDrop] += 100
}

func warmRule() RuleSpec {
	return RuleSpec{Name: "w", Behavior: BehaviorWarmUp, Rate: 10, Burst: 10,
		WarmUp: &WarmUpParams{Period: 10 * time.Second, ColdFactor: 3}}
}

// Under saturating traffic the loop reproduces docs/design.md §5.2's ramp: the
// kernel admits ⌊rate⌋ per second at the rate the loop put in force.
func TestLoopWarmUpRamp(t *testing.T) {
	clock := NewFakeClock(time.Unix(1_000_000, 0))
	var mono uint64 = 5e9
	k := newFakeKernel()
	loop, err := NewLoop(clock, func() uint64 { return mono }, 50*time.Millisecond, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := loop.Configure([]RuleSpec{warmRule()}, map[string][]Target{"w": {{Kernel: k, Slot: 3, Epoch: 7}}}); err != nil {
		t.Fatal(err)
	}
	want := []float64{3.33, 3.47, 3.62, 3.79, 3.97, 4.17, 4.46, 4.81, 5.21, 5.81, 6.58, 7.81, 10, 10}
	var got []float64
	k.admit(3, 0)
	for sec := range len(want) {
		// The rate in force during this second is the one written at its
		// first tick; the kernel admits ⌊rate⌋ over the second.
		var rate float64
		for tick := range 20 {
			rep := loop.Tick()
			if len(rep.Rules) != 1 || rep.Rules[0].Err != nil {
				t.Fatalf("tick: %+v", rep)
			}
			if tick == 0 {
				rate = rep.Rules[0].Rate
				got = append(got, math.Round(rate*100)/100)
			}
			clock.Advance(50 * time.Millisecond)
			mono += 50e6
		}
		k.admit(3, uint64(math.Floor(rate)))
		_ = sec
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("second %d: rate %.2f, want %.2f (all: %v)", i+1, got[i], want[i], got)
			break
		}
	}
	lim := k.limits[3]
	if lim.Epoch != 7 || lim.DeadlineNS != mono-50e6+uint64(time.Second) {
		t.Errorf("limit epoch %d deadline %d (mono %d)", lim.Epoch, lim.DeadlineNS, mono)
	}
	if r := lim.Bucket.Rate(); math.Abs(r-10) > 1e-6 {
		t.Errorf("warm rate in the kernel: %v", r)
	}
}

func TestLoopKeepsStateAcrossConfigure(t *testing.T) {
	clock := NewFakeClock(time.Unix(1_000_000, 0))
	k := newFakeKernel()
	loop, _ := NewLoop(clock, func() uint64 { return 1 }, 50*time.Millisecond, time.Second, nil)
	targets := map[string][]Target{"w": {{Kernel: k, Slot: 0, Epoch: 1}}}
	if err := loop.Configure([]RuleSpec{warmRule(), {Name: "static", Behavior: BehaviorReject, Rate: 5, Burst: 5}}, targets); err != nil {
		t.Fatal(err)
	}
	if len(loop.rules) != 1 {
		t.Fatalf("the loop steers %d rules; a reject rule needs none", len(loop.rules))
	}
	// Warm up fully.
	for range 40 {
		loop.Tick()
		clock.Advance(time.Second)
		k.admit(0, 10)
	}
	if r := loop.Tick().Rules[0].Rate; r != 10 {
		t.Fatalf("not warm after 40 s: %v", r)
	}
	// Unchanged: still warm.
	if err := loop.Configure([]RuleSpec{warmRule()}, targets); err != nil {
		t.Fatal(err)
	}
	if r := loop.Tick().Rules[0].Rate; r != 10 {
		t.Errorf("an unchanged rule lost its warm-up: %v", r)
	}
	// Changed: cold again.
	changed := warmRule()
	changed.WarmUp = &WarmUpParams{Period: 20 * time.Second, ColdFactor: 3}
	if err := loop.Configure([]RuleSpec{changed}, targets); err != nil {
		t.Fatal(err)
	}
	if r := loop.Tick().Rules[0].Rate; math.Abs(r-10.0/3) > 0.01 {
		t.Errorf("a changed rule did not start cold: %v", r)
	}
}

type fakeSampler struct{ sig Signals }

func (f *fakeSampler) Sample(_ *RuleSpec, used float64) Signals {
	s := f.sig
	s.UsedRate = used
	return s
}

// A latency step above the target cuts the rate the kernel gets within two
// ticks; a stale signal holds it; a failed counter read writes nothing.
func TestLoopAdaptive(t *testing.T) {
	clock := NewFakeClock(time.Unix(1_000_000, 0))
	k := newFakeKernel()
	s := &fakeSampler{sig: Signals{Latency: 5 * time.Millisecond, CPU: 0.1}}
	loop, _ := NewLoop(clock, func() uint64 { return 1 }, 50*time.Millisecond, time.Second, s)
	ad := AIMDParams{TargetLatency: 25 * time.Millisecond, MinRate: 1000, MaxRate: 12000,
		KA: 50, KM: 0.5, Gamma: 0.5, Alpha: 0.2, CPUHigh: 0.8, ErrorThreshold: 0.05}
	spec := RuleSpec{Name: "a", Behavior: BehaviorAdaptive, Rate: 4000, Burst: 4000, Adaptive: &ad, Signal: "accept_queue", Law: LawAIMD}
	if err := loop.Configure([]RuleSpec{spec}, map[string][]Target{"a": {{Kernel: k, Slot: 1, Epoch: 9}}}); err != nil {
		t.Fatal(err)
	}
	tick := func() RuleReport {
		k.admit(1, 200) // 4000/s over 50 ms: the rule uses its rate
		clock.Advance(50 * time.Millisecond)
		return loop.Tick().Rules[0]
	}
	for range 20 {
		tick()
	}
	before := k.limits[1].Bucket.Rate()
	if before <= 4000 {
		t.Fatalf("below target and fully used, the rate did not grow: %v", before)
	}
	s.sig.Latency = 100 * time.Millisecond
	tick()
	r2 := tick()
	if after := k.limits[1].Bucket.Rate(); after >= before || r2.State != "decrease" {
		t.Errorf("latency step: rate %v -> %v (%s) within two ticks", before, after, r2.State)
	}
	s.sig.LatencyStale = true
	held := k.limits[1].Bucket.Rate()
	if r := tick(); !r.Stale || math.Abs(k.limits[1].Bucket.Rate()-held) > 1e-6 {
		t.Errorf("stale signal: %+v, rate %v -> %v", r, held, k.limits[1].Bucket.Rate())
	}
	k.failRead = true
	delete(k.limits, 1)
	if r := tick(); r.Err == nil || !r.Stale {
		t.Errorf("failed read: %+v", r)
	}
	if _, wrote := k.limits[1]; wrote {
		t.Error("a tick that could not read its counters wrote a rate")
	}
}

func TestNewLoopRejectsBadPeriods(t *testing.T) {
	for _, c := range []struct{ period, hold time.Duration }{
		{5 * time.Millisecond, time.Second}, {time.Second, 5 * time.Second}, {50 * time.Millisecond, 60 * time.Millisecond},
	} {
		if _, err := NewLoop(RealClock{}, func() uint64 { return 0 }, c.period, c.hold, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewLoop(%v, %v): %v", c.period, c.hold, err)
		}
	}
}

// While the host is overloaded a new-connection rule is capped at the
// best rate it completed over the last seconds; otherwise it keeps its own.
func TestLoopSystemProtection(t *testing.T) {
	clock := NewFakeClock(time.Unix(1_000_000, 0))
	k := newFakeKernel()
	loop, _ := NewLoop(clock, func() uint64 { return 1 }, 50*time.Millisecond, time.Second, nil)
	cpu, fresh := 0.3, true
	loop.SetSystem(&SystemParams{CPUHigh: 0.8}, func() (float64, bool) { return cpu, fresh })
	spec := RuleSpec{Name: "syn", Behavior: BehaviorReject, Rate: 1000, Burst: 100, SynOnly: true}
	other := RuleSpec{Name: "pkts", Behavior: BehaviorReject, Rate: 1000, Burst: 100}
	if err := loop.Configure([]RuleSpec{spec, other}, map[string][]Target{"syn": {{Kernel: k, Slot: 0, Epoch: 1}}}); err != nil {
		t.Fatal(err)
	}
	if len(loop.rules) != 1 {
		t.Fatalf("system protection steers %d rules, want the syn_only one", len(loop.rules))
	}
	// Three seconds completing 300, 400, 250 connections.
	for _, n := range []uint64{300, 400, 250} {
		for range 20 {
			loop.Tick()
			clock.Advance(50 * time.Millisecond)
		}
		k.admit(0, n)
	}
	if r := loop.Tick().Rules[0]; r.Rate != 1000 || r.State != "static" {
		t.Fatalf("healthy host: %+v", r)
	}
	cpu = 0.95
	r := loop.Tick().Rules[0]
	if r.Rate != 400 || r.State != "system_capped" || math.Abs(r.Burst-40) > 1e-9 {
		t.Errorf("overloaded host: %+v, want capped at the 400/s peak", r)
	}
	if got := k.limits[0].Bucket.Rate(); math.Abs(got-400) > 1e-6 {
		t.Errorf("kernel rate %v", got)
	}
	fresh = false
	if r := loop.Tick().Rules[0]; r.Rate != 1000 {
		t.Errorf("stale CPU reading: %+v, want the rule's own rate", r)
	}
}

// The default adaptive law tracks the service rate the sampler reads: the
// loop gives it the demand from the kernel's counters (passed + dropped)
// and the tick's length, and writes its rate. A saturated service of
// 1000/s with a queue above the target is cut below 1000/s at once.
func TestLoopTrack(t *testing.T) {
	clock := NewFakeClock(time.Unix(1_000_000, 0))
	k := newFakeKernel()
	s := &recordingSampler{sig: Signals{Latency: 0, HasQueue: true, QueueDepth: 0, ServiceRate: 1000, HasServiceRate: true}}
	loop, _ := NewLoop(clock, func() uint64 { return 1 }, 50*time.Millisecond, time.Second, s)
	ad := AIMDParams{TargetLatency: 25 * time.Millisecond, MinRate: 100, MaxRate: 12000,
		KA: 50, KM: 0.5, Gamma: 0.5, Alpha: 0.2, CPUHigh: 0.8, ErrorThreshold: 0.05}
	spec := RuleSpec{Name: "a", Behavior: BehaviorAdaptive, Rate: 1000, Burst: 100, Adaptive: &ad, Signal: "accept_queue", SynOnly: true}
	if err := loop.Configure([]RuleSpec{spec}, map[string][]Target{"a": {{Kernel: k, Slot: 1, Epoch: 9}}}); err != nil {
		t.Fatal(err)
	}
	loop.Tick()
	// 40 passed and nothing dropped in 50 ms: the demand (800/s) is
	// all admitted, the queue empty: hold.
	k.counters[1] = &dataplane.Counters{}
	k.counters[1].Packets[dataplane.VerdictPass] += 40
	clock.Advance(50 * time.Millisecond)
	if r := loop.Tick().Rules[0]; r.State != "hold_idle" || r.Rate != 1000 {
		t.Errorf("idle: %+v", r)
	}
	// 50 passed and 100 dropped in 50 ms: demand 3000/s, used 1000/s;
	// an empty queue: probe by 1 + 8.33 ms / 75 ms (the setpoint, a
	// third of the target, over τ).
	sp := 0.025 * setpointFactor
	k.admit(1, 50)
	clock.Advance(50 * time.Millisecond)
	r := loop.Tick().Rules[0]
	if r.State != "probe" || math.Abs(r.Rate-1000*(1+sp/0.075)) > 1e-6 {
		t.Errorf("probe: %+v", r)
	}
	// A queue of 50 at 1000/s, setpoint queue 8.33: R = 1000 − 41.67/0.075,
	// and 60 connections in flight (10 in service) are capped at 10 +
	// 8.33 → 18 in the kernel.
	s.sig.QueueDepth, s.sig.Latency = 50, 50*time.Millisecond
	s.sig.InFlight, s.sig.HasInFlight = 60, true
	k.admit(1, 50)
	clock.Advance(50 * time.Millisecond)
	r = loop.Tick().Rules[0]
	if want := 1000 + (1000*sp-50)/0.075; r.State != "track" || math.Abs(r.Rate-want) > 1e-6 || math.Abs(k.limits[1].Bucket.Rate()-want) > 1e-3 {
		t.Errorf("track: %+v (kernel %v), want %.1f", r, k.limits[1].Bucket.Rate(), want)
	}
	if r.InFlightCap != 18 || k.limits[1].ConcCap != 18 {
		t.Errorf("in-flight cap: report %d, kernel %d, want 18", r.InFlightCap, k.limits[1].ConcCap)
	}
}

type recordingSampler struct{ sig Signals }

func (f *recordingSampler) Sample(_ *RuleSpec, used float64) Signals {
	s := f.sig
	s.UsedRate = used
	return s
}

// System protection on completed work: a flood saturates a static
// new-connection rule at its rate (1000 admitted a second) while the
// service completes only 400 a second. A cap at the best admitted count
// would be 1000 and never engage; the cap at the best service rate is
// 400. Without a service rate the loop falls back to the admitted count.
func TestLoopSystemProtectionOnCompletedWork(t *testing.T) {
	clock := NewFakeClock(time.Unix(1_000_000, 0))
	k := newFakeKernel()
	s := &recordingSampler{sig: Signals{LatencyStale: true, ServiceRate: 300, HasServiceRate: true}}
	loop, _ := NewLoop(clock, func() uint64 { return 1 }, 50*time.Millisecond, time.Second, s)
	cpu := 0.3
	loop.SetSystem(&SystemParams{CPUHigh: 0.8}, func() (float64, bool) { return cpu, true })
	spec := RuleSpec{Name: "syn", Behavior: BehaviorReject, Rate: 1000, Burst: 100, SynOnly: true}
	if err := loop.Configure([]RuleSpec{spec}, map[string][]Target{"syn": {{Kernel: k, Slot: 0, Epoch: 1}}}); err != nil {
		t.Fatal(err)
	}
	for _, served := range []float64{300, 400, 250} {
		s.sig.ServiceRate = served
		for range 20 {
			k.admit(0, 50) // 1000/s: the rule's whole rate
			loop.Tick()
			clock.Advance(50 * time.Millisecond)
		}
	}
	if r := loop.Tick().Rules[0]; r.Rate != 1000 || r.State != "static" {
		t.Fatalf("healthy host: %+v", r)
	}
	cpu = 0.95
	r := loop.Tick().Rules[0]
	if r.State != "system_capped" || math.Abs(r.Rate-400) > 1 {
		t.Errorf("overloaded host: %+v, want capped at the 400/s completed", r)
	}
	// With the accept queue read: 10 % above the best rate, less the
	// queue per 250 ms: 440 with nothing queued,
	s.sig.HasQueue = true
	k.admit(0, 50)
	clock.Advance(50 * time.Millisecond)
	if r := loop.Tick().Rules[0]; r.State != "system_capped" || math.Abs(r.Rate-440) > 1 {
		t.Errorf("overloaded host, empty queue: %+v, want 440", r)
	}
	// and 440 − 30 / 0.25 = 320 with 30 queued.
	s.sig.HasQueue, s.sig.QueueDepth = true, 30
	k.admit(0, 50)
	clock.Advance(50 * time.Millisecond)
	if r := loop.Tick().Rules[0]; r.State != "system_capped" || math.Abs(r.Rate-320) > 1 {
		t.Errorf("overloaded host with a queue: %+v, want 320", r)
	}
	cpu = 0.3
	if r := loop.Tick().Rules[0]; r.Rate != 1000 || r.State != "static" {
		t.Errorf("host healthy again: %+v", r)
	}
}

type fakeOutcomes struct {
	by       map[string]Outcomes
	admitted map[string]uint64
	fresh    bool
}

func (f *fakeOutcomes) Outcomes(rule *RuleSpec, admitted uint64, _ time.Time) (Outcomes, bool) {
	f.admitted[rule.Name] = admitted
	o := f.by[rule.Name]
	delete(f.by, rule.Name) // outcomes are reported once
	return o, f.fresh
}

// A rule with a breaker is steered even when its behavior is reject: each
// tick writes its static rate with the breaker's gate; the breaker opens
// on failures, times out to HALF_OPEN with a new round of probes, closes on
// a successful probe, and keeps its state across an unchanged Configure.
// An adaptive rule with a breaker keeps its AIMD state and reports the
// breaker's apart.
func TestLoopBreaker(t *testing.T) {
	clock := NewFakeClock(time.Unix(1_000_000, 0))
	k := newFakeKernel()
	loop, _ := NewLoop(clock, func() uint64 { return 1 }, 50*time.Millisecond, time.Second, &fakeSampler{sig: Signals{Latency: 5 * time.Millisecond, CPU: 0.1}})
	out := &fakeOutcomes{by: map[string]Outcomes{}, admitted: map[string]uint64{}, fresh: true}
	loop.SetOutcomes(out)
	cb := BreakerParams{ErrorRatio: 0.5, MinRequests: 5, Window: time.Second, RetryTimeout: 2 * time.Second, HalfOpenProbes: 1}
	plain := RuleSpec{Name: "svc", Behavior: BehaviorReject, Rate: 100, Burst: 20, SynOnly: true, CircuitBreaker: &cb}
	ad := AIMDParams{TargetLatency: 25 * time.Millisecond, MinRate: 50, MaxRate: 500,
		KA: 5, KM: 0.5, Gamma: 0.5, Alpha: 0.2, CPUHigh: 0.8, ErrorThreshold: 0.05}
	adaptive := RuleSpec{Name: "ad", Behavior: BehaviorAdaptive, Rate: 100, Burst: 100, Adaptive: &ad, Signal: "accept_queue", CircuitBreaker: &cb}
	specs := []RuleSpec{plain, adaptive}
	targets := map[string][]Target{"svc": {{Kernel: k, Slot: 2, Epoch: 3}}, "ad": {{Kernel: k, Slot: 4, Epoch: 5}}}
	if err := loop.Configure(specs, targets); err != nil {
		t.Fatal(err)
	}
	tick := func() (RuleReport, RuleReport) {
		clock.Advance(50 * time.Millisecond)
		k.admit(4, 5)
		rep := loop.Tick()
		if len(rep.Rules) != 2 {
			t.Fatalf("tick steers %d rules, want 2", len(rep.Rules))
		}
		return rep.Rules[0], rep.Rules[1]
	}
	r, a := tick()
	if r.State != "closed" || r.Breaker != "closed" || r.Signal != "breaker" || r.Rate != 100 || r.Transition != nil {
		t.Fatalf("healthy: %+v", r)
	}
	if a.Breaker != "closed" || a.State == "closed" {
		t.Fatalf("adaptive: %+v, want the AIMD action as state and the breaker apart", a)
	}
	if g := k.limits[2].Gate; g != (dataplane.Gate{}) {
		t.Fatalf("closed gate %+v", g)
	}
	out.by["svc"] = Outcomes{Requests: 6, Errors: 4}
	k.admit(2, 6)
	r, _ = tick()
	if out.admitted["svc"] != 6 {
		t.Errorf("the source got %d admitted connections, want 6", out.admitted["svc"])
	}
	if r.State != "open" || r.Transition == nil || r.Transition.From != BreakerClosed {
		t.Fatalf("4 errors in 6: %+v", r)
	}
	lim := k.limits[2]
	if lim.Gate.Drop != dataplane.GateAll || lim.Epoch != 3 || math.Abs(lim.Bucket.Rate()-100) > 1e-6 {
		t.Fatalf("open: limit %+v, want the static rate with every SYN dropped", lim)
	}
	// Unchanged rules keep their breakers.
	if err := loop.Configure(specs, targets); err != nil {
		t.Fatal(err)
	}
	out.fresh = false // outcomes unreadable: the timeout still runs
	var halfAt int
	for i := 1; i <= 60 && halfAt == 0; i++ {
		if r, _ = tick(); r.State == "half_open" {
			halfAt = i
		}
	}
	if halfAt == 0 || !r.Stale {
		t.Fatalf("not half-open 3 s after opening (or not stale): %+v", r)
	}
	if halfAt < 39 || halfAt > 41 {
		t.Errorf("half-open after %d ticks, want 40 (retry timeout 2 s)", halfAt)
	}
	if g := k.limits[2].Gate; g.Drop != dataplane.GateAll || g.Probes != 1 {
		t.Fatalf("half-open gate %+v", g)
	}
	out.fresh = true
	out.by["svc"] = Outcomes{Requests: 1}
	if r, _ = tick(); r.State != "closed" || r.Transition == nil || r.Transition.From != BreakerHalfOpen {
		t.Fatalf("after a good probe: %+v", r)
	}
	if g := k.limits[2].Gate; g != (dataplane.Gate{}) {
		t.Fatalf("closed again, gate %+v", g)
	}
	// A changed breaker starts closed and afresh.
	out.by["ad"] = Outcomes{Requests: 5, Errors: 5}
	if _, a = tick(); a.Breaker != "open" || k.limits[4].Gate.Drop != dataplane.GateAll || k.limits[4].Bucket.Rate() < 50 {
		t.Fatalf("adaptive rule's breaker: %+v, limit %+v", a, k.limits[4])
	}
	cb2 := cb
	cb2.MinRequests = 6
	specs[1].CircuitBreaker = &cb2
	if err := loop.Configure(specs, targets); err != nil {
		t.Fatal(err)
	}
	if _, a = tick(); a.Breaker != "closed" {
		t.Fatalf("changed breaker: %+v", a)
	}
}

// Where the signals count requests in flight (Signals.InFlightRequests),
// the loop writes the law's cap on them as the kernel's cap on requests
// (Limit.ReqCap), not on connections: a kept-alive connection's next
// request meets it (bpf/request.h), an idle connection is not capped.
func TestLoopRequestCap(t *testing.T) {
	clock := NewFakeClock(time.Unix(1_000_000, 0))
	k := newFakeKernel()
	s := &recordingSampler{sig: Signals{Latency: 20 * time.Millisecond, BaseLatency: 10 * time.Millisecond,
		ServiceRate: 400, HasServiceRate: true, InFlight: 10, HasInFlight: true, InFlightRequests: true}}
	loop, _ := NewLoop(clock, func() uint64 { return 1 }, 50*time.Millisecond, time.Second, s)
	ad := AIMDParams{TargetLatency: 30 * time.Millisecond, MinRate: 10, MaxRate: 100000,
		KA: 50, KM: 0.5, Gamma: 0.5, Alpha: 0.2, CPUHigh: 0.8, ErrorThreshold: 0.05}
	spec := RuleSpec{Name: "a", Behavior: BehaviorAdaptive, Rate: 1000, Burst: 100, Adaptive: &ad, Signal: "response_time", SynOnly: true}
	if err := loop.Configure([]RuleSpec{spec}, map[string][]Target{"a": {{Kernel: k, Slot: 1, Epoch: 9}}}); err != nil {
		t.Fatal(err)
	}
	var r RuleReport
	for range 3 {
		k.admit(1, 20)
		clock.Advance(50 * time.Millisecond)
		r = loop.Tick().Rules[0]
	}
	l := k.limits[1]
	if r.InFlightCap == 0 || l.ReqCap != r.InFlightCap || l.ConcCap != 0 {
		t.Errorf("report cap %d; kernel request cap %d, connection cap %d; want the report's cap on requests only", r.InFlightCap, l.ReqCap, l.ConcCap)
	}
}
