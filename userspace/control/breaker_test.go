package control

import (
	"errors"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// breakerRun drives a breaker on a fake timeline and checks its state
// after each step.
type breakerRun struct {
	t   *testing.T
	b   *Breaker
	now time.Time
}

func newBreakerRun(t *testing.T, cfg BreakerParams) *breakerRun {
	t.Helper()
	start := time.Unix(1_000_000, 0)
	b, err := NewBreaker(cfg, start)
	if err != nil {
		t.Fatal(err)
	}
	return &breakerRun{t: t, b: b, now: start}
}

// step advances the clock by d, feeds o and requires the state want.
func (r *breakerRun) step(d time.Duration, o Outcomes, want BreakerState) {
	r.t.Helper()
	r.now = r.now.Add(d)
	tr, changed := r.b.Step(r.now, o)
	if got := r.b.State(); got != want {
		r.t.Fatalf("at +%v after %+v: state %v, want %v (transition %+v)", r.now.Sub(time.Unix(1_000_000, 0)), o, got, want, tr)
	}
	if changed && (tr.From == tr.To || tr.To != want || tr.Reason == "") {
		r.t.Fatalf("transition %+v, want one into %v with a reason", tr, want)
	}
}

var (
	ok1   = Outcomes{Requests: 1}
	err1  = Outcomes{Requests: 1, Errors: 1}
	slow1 = Outcomes{Requests: 1, Timed: 1, Slow: 1}
	fast1 = Outcomes{Requests: 1, Timed: 1}
	none  = Outcomes{}
)

// Sentinel's ExceptionCircuitBreakerTest.testRecordErrorOrSuccess: error
// ratio 0.2 over a 20 s window, min 1 request, retry 10 s. One success,
// then an error (1/2 > 0.2) opens; calls in the next 10 s are refused; the
// half-open probe fails and reopens; 10 s later the probe succeeds and
// closes with a fresh window, in which 1 error in 7 (0.14) stays closed.
func TestBreakerSentinelErrorRatio(t *testing.T) {
	r := newBreakerRun(t, BreakerParams{ErrorRatio: 0.2, MinRequests: 1,
		Window: 20 * time.Second, RetryTimeout: 10 * time.Second, HalfOpenProbes: 1})
	r.step(10*time.Millisecond, ok1, BreakerClosed)
	r.step(50*time.Millisecond, err1, BreakerOpen)
	if g := r.b.Gate(); g.Drop != dataplane.GateAll || g.Probes != 0 {
		t.Fatalf("open gate %+v: want all dropped, no probes", g)
	}
	r.step(100*time.Millisecond, none, BreakerOpen)
	r.step(5*time.Second, none, BreakerOpen)
	r.step(4850*time.Millisecond, none, BreakerOpen) // 9.95 s after opening
	r.step(50*time.Millisecond, none, BreakerHalfOpen)
	g := r.b.Gate()
	if g.Drop != dataplane.GateAll || g.Probes != 1 {
		t.Fatalf("half-open gate %+v: want all dropped but 1 probe", g)
	}
	r.step(50*time.Millisecond, err1, BreakerOpen) // the probe failed
	r.step(100*time.Millisecond, none, BreakerOpen)
	r.step(9850*time.Millisecond, none, BreakerOpen)
	r.step(50*time.Millisecond, none, BreakerHalfOpen)
	if r.b.Gate().Round == g.Round {
		t.Fatalf("a new half-open period kept round %d", g.Round)
	}
	r.step(50*time.Millisecond, ok1, BreakerClosed) // the probe succeeded
	if g := r.b.Gate(); g != (dataplane.Gate{}) {
		t.Fatalf("closed gate %+v: want none", g)
	}
	for range 6 {
		r.step(100*time.Millisecond, ok1, BreakerClosed)
	}
	r.step(100*time.Millisecond, err1, BreakerClosed) // 1/7 ≤ 0.2
	r.step(100*time.Millisecond, ok1, BreakerClosed)
}

// Sentinel's ResponseTimeCircuitBreakerTest.testMaxSlowRatioThreshold:
// slow above 10 ms, slow ratio 1 (a ratio equal to a threshold of 1 trips),
// min 3 requests, window 5 s, retry 5 s. Three slow calls open; the breaker
// still refuses 1 s later and lets the next call through after 5 s.
func TestBreakerSentinelSlowRatioOne(t *testing.T) {
	r := newBreakerRun(t, BreakerParams{SlowLatency: 10 * time.Millisecond, SlowRatio: 1,
		MinRequests: 3, Window: 5 * time.Second, RetryTimeout: 5 * time.Second, HalfOpenProbes: 1})
	r.step(20*time.Millisecond, slow1, BreakerClosed)
	r.step(20*time.Millisecond, slow1, BreakerClosed) // 2 < min_requests
	r.step(20*time.Millisecond, slow1, BreakerOpen)   // 3/3 slow
	r.step(20*time.Millisecond, none, BreakerOpen)
	r.step(time.Second, none, BreakerOpen)
	r.step(4*time.Second, none, BreakerHalfOpen)
	r.step(20*time.Millisecond, fast1, BreakerClosed)
}

// Sentinel's AbstractCircuitBreaker transitions, one by one: a slow probe
// reopens (ResponseTimeCircuitBreaker's half-open check), each reopening
// restarts the retry timeout, and calls completing while open are ignored.
func TestBreakerTransitions(t *testing.T) {
	cfg := BreakerParams{SlowLatency: 100 * time.Millisecond, SlowRatio: 0.5, ErrorRatio: 0.5,
		MinRequests: 5, Window: time.Second, RetryTimeout: 2 * time.Second, HalfOpenProbes: 1}
	r := newBreakerRun(t, cfg)
	// 3 slow of 5 timed: 0.6 > 0.5.
	r.step(50*time.Millisecond, Outcomes{Requests: 2, Timed: 2}, BreakerClosed)
	r.step(50*time.Millisecond, Outcomes{Requests: 3, Timed: 3, Slow: 3}, BreakerOpen)
	// Completions while open change nothing, however bad or good.
	r.step(50*time.Millisecond, Outcomes{Requests: 100}, BreakerOpen)
	r.step(50*time.Millisecond, Outcomes{Requests: 100, Errors: 100}, BreakerOpen)
	r.step(1900*time.Millisecond, none, BreakerHalfOpen)
	r.step(50*time.Millisecond, slow1, BreakerOpen) // a slow probe
	r.step(1950*time.Millisecond, ok1, BreakerOpen) // 1.95 s: still open
	r.step(50*time.Millisecond, none, BreakerHalfOpen)
	r.step(50*time.Millisecond, fast1, BreakerClosed)
	// The window restarted empty at closing: 4 errors are below min 5.
	r.step(50*time.Millisecond, Outcomes{Requests: 4, Errors: 4}, BreakerClosed)
	r.step(50*time.Millisecond, err1, BreakerOpen)
}

// Sentinel compares with '>': a ratio equal to its threshold (below 1)
// does not trip; a threshold of 1 trips only when every call failed; and
// nothing trips below min_requests however bad.
func TestBreakerThresholds(t *testing.T) {
	cfg := BreakerParams{ErrorRatio: 0.5, MinRequests: 4,
		Window: time.Second, RetryTimeout: time.Second, HalfOpenProbes: 1}
	r := newBreakerRun(t, cfg)
	r.step(50*time.Millisecond, Outcomes{Requests: 3, Errors: 3}, BreakerClosed) // 3 < min 4
	r.step(50*time.Millisecond, ok1, BreakerOpen)                                // 3/4

	r = newBreakerRun(t, cfg)
	r.step(50*time.Millisecond, Outcomes{Requests: 4, Errors: 2}, BreakerClosed) // 0.5, not above
	r.step(50*time.Millisecond, err1, BreakerOpen)                               // 3/5

	cfg.ErrorRatio = 1
	r = newBreakerRun(t, cfg)
	r.step(50*time.Millisecond, Outcomes{Requests: 5, Errors: 4}, BreakerClosed)
	r.step(50*time.Millisecond, Outcomes{Requests: 5, Errors: 5}, BreakerClosed) // 9/10
	r = newBreakerRun(t, cfg)
	r.step(50*time.Millisecond, Outcomes{Requests: 4, Errors: 4}, BreakerOpen) // 4/4 = 1
}

// The window slides: failures older than the window are forgotten a tenth
// of the window at a time, while those within it still count.
func TestBreakerSlidingWindow(t *testing.T) {
	cfg := BreakerParams{ErrorRatio: 0.5, MinRequests: 5,
		Window: time.Second, RetryTimeout: time.Second, HalfOpenProbes: 1}
	r := newBreakerRun(t, cfg)
	r.step(50*time.Millisecond, Outcomes{Requests: 4, Errors: 4}, BreakerClosed)
	r.step(850*time.Millisecond, err1, BreakerOpen) // 0.9 s: 5/5

	r = newBreakerRun(t, cfg)
	r.step(50*time.Millisecond, Outcomes{Requests: 4, Errors: 4}, BreakerClosed)
	r.step(time.Second, err1, BreakerClosed) // 1.05 s: the 4 errors left the window
	for range 3 {
		r.step(50*time.Millisecond, err1, BreakerClosed)
	}
	r.step(50*time.Millisecond, err1, BreakerOpen) // 5 within 250 ms

	// Successes within the window dilute errors as they come.
	r = newBreakerRun(t, cfg)
	for range 10 {
		r.step(50*time.Millisecond, ok1, BreakerClosed)
	}
	for range 9 {
		r.step(50*time.Millisecond, err1, BreakerClosed) // at most 9/19
	}
	r.step(50*time.Millisecond, err1, BreakerOpen) // 10 of 19 in the last second
}

// HALF_OPEN needs half_open_probes successes, counted across ticks; a
// round with no outcome for a window gives way to a new round, so the
// kernel lets new probes through; a failure after some successes reopens.
func TestBreakerHalfOpenProbes(t *testing.T) {
	cfg := BreakerParams{ErrorRatio: 0.5, MinRequests: 1,
		Window: time.Second, RetryTimeout: time.Second, HalfOpenProbes: 3}
	r := newBreakerRun(t, cfg)
	r.step(50*time.Millisecond, err1, BreakerOpen)
	r.step(time.Second, none, BreakerHalfOpen)
	g := r.b.Gate()
	if g.Drop != dataplane.GateAll || g.Probes != 3 {
		t.Fatalf("half-open gate %+v: want all dropped but 3 probes", g)
	}
	r.step(50*time.Millisecond, ok1, BreakerHalfOpen)
	r.step(50*time.Millisecond, ok1, BreakerHalfOpen)
	r.step(50*time.Millisecond, err1, BreakerOpen)
	r.step(time.Second, none, BreakerHalfOpen)
	round := r.b.Round()
	r.step(900*time.Millisecond, ok1, BreakerHalfOpen)
	if r.b.Round() != round {
		t.Fatalf("round changed within the window")
	}
	r.step(100*time.Millisecond, none, BreakerHalfOpen) // a window without a verdict
	if r.b.Round() == round || r.b.Gate().Round != r.b.Round() {
		t.Fatalf("no new round after a window undecided: round %d, gate %+v", r.b.Round(), r.b.Gate())
	}
	r.step(50*time.Millisecond, Outcomes{Requests: 3}, BreakerClosed)
}

func TestBreakerInvalid(t *testing.T) {
	good := BreakerParams{SlowLatency: time.Millisecond, SlowRatio: 0.5, ErrorRatio: 0.5,
		MinRequests: 5, Window: time.Second, RetryTimeout: time.Second, HalfOpenProbes: 1}
	if _, err := NewBreaker(good, time.Now()); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*BreakerParams){
		"no check":       func(c *BreakerParams) { c.SlowRatio, c.ErrorRatio = 0, 0 },
		"error ratio":    func(c *BreakerParams) { c.ErrorRatio = 1.5 },
		"slow ratio":     func(c *BreakerParams) { c.SlowRatio = -1 },
		"slow latency":   func(c *BreakerParams) { c.SlowLatency = 0 },
		"min requests":   func(c *BreakerParams) { c.MinRequests = 0 },
		"window":         func(c *BreakerParams) { c.Window = 0 },
		"retry timeout":  func(c *BreakerParams) { c.RetryTimeout = -time.Second },
		"half-open zero": func(c *BreakerParams) { c.HalfOpenProbes = 0 },
	} {
		c := good
		mutate(&c)
		if _, err := NewBreaker(c, time.Now()); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: error %v, want ErrInvalid", name, err)
		}
	}
	// Inconsistent outcomes count as none.
	r := newBreakerRun(t, BreakerParams{ErrorRatio: 0.5, MinRequests: 1,
		Window: time.Second, RetryTimeout: time.Second, HalfOpenProbes: 1})
	r.step(50*time.Millisecond, Outcomes{Requests: 1, Errors: 2}, BreakerClosed)
	r.step(50*time.Millisecond, Outcomes{Requests: -1}, BreakerClosed)
	r.step(50*time.Millisecond, Outcomes{Requests: 1, Timed: 1, Slow: 2}, BreakerClosed)
	// A clock that goes back restarts the window rather than panicking.
	r.step(-time.Hour, err1, BreakerOpen)
}
