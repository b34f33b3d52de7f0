package control

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
)

const target = 25 * time.Millisecond

// params are the rules file's defaults around docs/design.md §7's scenario:
// target 25 ms, R_min 1000, R_max 12000.
func params() AIMDParams {
	return AIMDParams{
		TargetLatency: target, MinRate: 1000, MaxRate: 12000,
		KA: config.DefaultKA, KM: config.DefaultKM, Gamma: config.DefaultGamma, Alpha: config.DefaultAlpha,
		CPUHigh: config.DefaultCPUHigh, ErrorThreshold: config.DefaultErrorThreshold,
	}
}

func mustAIMD(t *testing.T, p AIMDParams, initial float64) *AIMD {
	t.Helper()
	a, err := NewAIMD(p, initial)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// busy are the signals of a rule that uses its whole rate on an idle CPU.
func busy(a *AIMD, latency time.Duration) Signals {
	return Signals{Latency: latency, CPU: 0.3, UsedRate: a.Rate()}
}

// One tick of each branch from R = 5000 with α = 1 (L is the sample).
func TestAIMDBranches(t *testing.T) {
	for _, c := range []struct {
		name    string
		in      Signals
		want    float64
		action  Action
		clamped bool
	}{
		{"errors above threshold cut by γ", Signals{Latency: 0, ErrorRate: 0.06, CPU: 0.3, UsedRate: 5000}, 2500, ActionCutErrors, false},
		{"errors at threshold do not", Signals{Latency: target / 2, ErrorRate: 0.05, CPU: 0.3, UsedRate: 5000}, 5000 + 50*math.Sqrt(0.5), ActionIncrease, false},
		{"at target: decrease by 0", Signals{Latency: target, CPU: 0.3, UsedRate: 5000}, 5000, ActionDecrease, false},
		{"e = −0.5: ×(1 − 0.5·0.5)", Signals{Latency: target * 3 / 2, CPU: 0.3, UsedRate: 5000}, 3750, ActionDecrease, false},
		{"e = −3: cut capped at K_m", Signals{Latency: 4 * target, CPU: 0.3, UsedRate: 5000}, 2500, ActionDecrease, false},
		{"e = 1: +K_a", Signals{Latency: 0, CPU: 0.3, UsedRate: 5000}, 5050, ActionIncrease, false},
		{"e = 0.25: +K_a·0.5", Signals{Latency: target * 3 / 4, CPU: 0.3, UsedRate: 5000}, 5025, ActionIncrease, false},
		{"e = 0.04: +K_a·0.2", Signals{Latency: target * 24 / 25, CPU: 0.3, UsedRate: 5000}, 5010, ActionIncrease, false},
		{"used exactly R/2 may grow", Signals{Latency: 0, CPU: 0.3, UsedRate: 2500}, 5050, ActionIncrease, false},
		{"used below R/2 holds", Signals{Latency: 0, CPU: 0.3, UsedRate: 2499}, 5000, ActionHoldIdle, false},
		{"CPU at CPU_high holds", Signals{Latency: 0, CPU: 0.8, UsedRate: 5000}, 5000, ActionHoldCPU, false},
		{"CPU high does not stop a decrease", Signals{Latency: 2 * target, CPU: 1, UsedRate: 5000}, 2500, ActionDecrease, false},
		{"idle does not stop a decrease", Signals{Latency: 2 * target, CPU: 0.3, UsedRate: 0}, 2500, ActionDecrease, false},
		{"stale latency holds", Signals{Latency: 0, LatencyStale: true, CPU: 0.3, UsedRate: 5000}, 5000, ActionHoldStale, false},
		{"stale errors hold", Signals{Latency: 0, ErrorRate: 1, ErrorsStale: true, CPU: 0.3, UsedRate: 5000}, 5000, ActionHoldStale, false},
		{"stale CPU holds", Signals{Latency: 0, CPU: 0.3, CPUStale: true, UsedRate: 5000}, 5000, ActionHoldStale, false},
		{"negative latency holds", Signals{Latency: -time.Millisecond, CPU: 0.3, UsedRate: 5000}, 5000, ActionHoldStale, false},
		{"NaN CPU holds", Signals{Latency: 0, CPU: math.NaN(), UsedRate: 5000}, 5000, ActionHoldStale, false},
		{"NaN error rate holds", Signals{Latency: 0, ErrorRate: math.NaN(), CPU: 0.3, UsedRate: 5000}, 5000, ActionHoldStale, false},
		{"infinite used rate holds", Signals{Latency: 0, CPU: 0.3, UsedRate: math.Inf(1)}, 5000, ActionHoldStale, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := params()
			p.Alpha = 1
			a := mustAIMD(t, p, 5000)
			s := a.Step(c.in)
			if math.Abs(s.Rate-c.want) > 1e-9 || s.Action != c.action || s.Clamped != c.clamped || a.Rate() != s.Rate {
				t.Errorf("rate %v (%v, clamped %v), want %v (%v, clamped %v)", s.Rate, s.Action, s.Clamped, c.want, c.action, c.clamped)
			}
		})
	}
}

// L = α·sample + (1 − α)·L, started at the first fresh sample; stale
// samples do not enter it.
func TestAIMDSmoothing(t *testing.T) {
	a := mustAIMD(t, params(), 5000)
	steps := []struct {
		in   Signals
		want time.Duration
	}{
		{Signals{Latency: 10 * time.Millisecond}, 10 * time.Millisecond},
		{Signals{Latency: 60 * time.Millisecond}, 20 * time.Millisecond},
		{Signals{Latency: time.Second, LatencyStale: true}, 20 * time.Millisecond},
		{Signals{Latency: 0}, 16 * time.Millisecond},
		{Signals{Latency: 0, ErrorsStale: true}, 12800 * time.Microsecond},
	}
	for i, s := range steps {
		got := a.Step(s.in)
		if got.Smoothed != s.want || a.Smoothed() != s.want {
			t.Errorf("step %d: L %v, want %v", i, got.Smoothed, s.want)
		}
		if e := (target - s.want).Seconds() / target.Seconds(); math.Abs(got.Error-e) > 1e-12 {
			t.Errorf("step %d: e %v, want %v", i, got.Error, e)
		}
	}
}

// A latency step above the target cuts the rate within two ticks
// (docs/design.md §7) from any earlier latency, with the default α = 0.2, when
// the step reaches (1 − (1 − α)²·L₀/target) / (1 − (1 − α)²) times the
// target: 2.78× from an idle queue. A smaller step takes longer because of
// the smoothing, not the law: to 2× target from an idle queue, four ticks.
func TestAIMDLatencyStep(t *testing.T) {
	for _, c := range []struct {
		name      string
		before    time.Duration
		after     time.Duration
		wantTicks int
	}{
		{"idle queue to 3× target", 0, 3 * target, 2},
		{"half target to 3× target", target / 2, 3 * target, 2},
		{"just below target to 3× target", target * 9 / 10, 3 * target, 1},
		{"idle queue to 2.8× target", 0, target * 28 / 10, 2},
		{"idle queue to 2× target", 0, 2 * target, 4},
		{"idle queue to 10× target", 0, 10 * target, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := mustAIMD(t, params(), 5000)
			for range 100 { // settle L at before (the rate may grow)
				a.Step(busy(a, c.before))
			}
			prev := a.Rate()
			ticks := 0
			for ticks = 1; ticks <= 10; ticks++ {
				s := a.Step(busy(a, c.after))
				if s.Rate < prev {
					break
				}
				prev = s.Rate
			}
			if ticks != c.wantTicks {
				t.Errorf("first cut at tick %d, want %d", ticks, c.wantTicks)
			}
		})
	}
}

// After the latency returns below the target the rate recovers by K_a·√e
// a tick: the recovery slows down as L nears the target (sub-linear), and
// it never adds more than K_a a tick.
func TestAIMDRecoveryIsSubLinear(t *testing.T) {
	a := mustAIMD(t, params(), 5000)
	for range 20 {
		a.Step(busy(a, 4*target)) // overload: cut towards R_min
	}
	low := a.Rate()
	prevL := a.Smoothed()
	for tick := range 200 {
		before := a.Rate()
		s := a.Step(busy(a, target/2)) // back below the target
		if s.Smoothed < target {
			wantInc := 50 * math.Sqrt(s.Error)
			if got := s.Rate - before; math.Abs(got-wantInc) > 1e-9 || got > 50 {
				t.Fatalf("tick %d: increase %v, want K_a·√e = %v ≤ K_a", tick, got, wantInc)
			}
		}
		if s.Smoothed > prevL && tick > 0 {
			t.Fatalf("tick %d: L rose from %v to %v", tick, prevL, s.Smoothed)
		}
		prevL = s.Smoothed
	}
	// L has settled at target/2, e = 1/2: +K_a·√½ = 35.4 a tick, where a
	// law linear in e would add K_a·e = 25.
	before := a.Rate()
	if inc := a.Step(busy(a, target/2)).Rate - before; math.Abs(inc-50*math.Sqrt(0.5)) > 1e-6 {
		t.Errorf("settled increase %v, want %v", inc, 50*math.Sqrt(0.5))
	}
	if a.Rate() <= low {
		t.Errorf("no recovery from %v", low)
	}
}

// An idle rule's rate never grows, however low the latency (docs/design.md §9);
// neither does a busy rule's on a hot CPU.
func TestAIMDNoGrowthWhileIdleOrHot(t *testing.T) {
	for _, c := range []struct {
		name string
		in   func(r float64) Signals
		want Action
	}{
		{"idle", func(r float64) Signals { return Signals{Latency: 0, CPU: 0.1, UsedRate: 0.49 * r} }, ActionHoldIdle},
		{"hot CPU", func(r float64) Signals { return Signals{Latency: 0, CPU: 0.95, UsedRate: r} }, ActionHoldCPU},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := mustAIMD(t, params(), 3000)
			for tick := range 10000 {
				s := a.Step(c.in(a.Rate()))
				if s.Rate != 3000 || s.Action != c.want {
					t.Fatalf("tick %d: rate %v (%v), want 3000 (%v)", tick, s.Rate, s.Action, c.want)
				}
			}
		})
	}
}

// The clamps hold at R_min and R_max, whatever the gains.
func TestAIMDClamps(t *testing.T) {
	for _, c := range []struct {
		name    string
		tweak   func(*AIMDParams)
		initial float64
		in      Signals
		want    float64
		action  Action
	}{
		{"increase stops at R_max", nil, 11990, Signals{Latency: 0, CPU: 0.1, UsedRate: 1e9}, 12000, ActionIncrease},
		{"huge K_a stops at R_max", func(p *AIMDParams) { p.KA = 1e9 }, 1000, Signals{Latency: 0, CPU: 0.1, UsedRate: 1e9}, 12000, ActionIncrease},
		{"decrease stops at R_min", nil, 1500, Signals{Latency: time.Second, CPU: 0.1, UsedRate: 1e9}, 1000, ActionDecrease},
		{"K_m = 1 stops at R_min", func(p *AIMDParams) { p.KM = 1 }, 12000, Signals{Latency: time.Second, CPU: 0.1, UsedRate: 1e9}, 1000, ActionDecrease},
		{"error cut stops at R_min", nil, 1500, Signals{Latency: 0, ErrorRate: 1, CPU: 0.1, UsedRate: 1e9}, 1000, ActionCutErrors},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := params()
			if c.tweak != nil {
				c.tweak(&p)
			}
			a := mustAIMD(t, p, c.initial)
			s := a.Step(c.in)
			if s.Rate != c.want || !s.Clamped || s.Action != c.action {
				t.Errorf("first tick: rate %v (%v, clamped %v), want %v (%v, clamped)", s.Rate, s.Action, s.Clamped, c.want, c.action)
			}
			for tick := range 1000 {
				if s := a.Step(c.in); s.Rate != c.want {
					t.Fatalf("tick %d: rate %v left the clamp %v", tick, s.Rate, c.want)
				}
			}
		})
	}
	// A rule's rate outside the range starts at the nearer bound.
	for _, c := range []struct{ initial, want float64 }{{10, 1000}, {1e6, 12000}} {
		if got := mustAIMD(t, params(), c.initial).Rate(); got != c.want {
			t.Errorf("initial %v: rate %v, want %v", c.initial, got, c.want)
		}
	}
}

func TestNewAIMDRejects(t *testing.T) {
	for _, c := range []struct {
		name    string
		tweak   func(*AIMDParams)
		initial float64
	}{
		{"zero target", func(p *AIMDParams) { p.TargetLatency = 0 }, 5000},
		{"zero min rate", func(p *AIMDParams) { p.MinRate = 0 }, 5000},
		{"max below min", func(p *AIMDParams) { p.MaxRate = 500 }, 5000},
		{"infinite max", func(p *AIMDParams) { p.MaxRate = math.Inf(1) }, 5000},
		{"zero ka", func(p *AIMDParams) { p.KA = 0 }, 5000},
		{"km above 1", func(p *AIMDParams) { p.KM = 1.5 }, 5000},
		{"zero km", func(p *AIMDParams) { p.KM = 0 }, 5000},
		{"gamma 1", func(p *AIMDParams) { p.Gamma = 1 }, 5000},
		{"zero alpha", func(p *AIMDParams) { p.Alpha = 0 }, 5000},
		{"NaN alpha", func(p *AIMDParams) { p.Alpha = math.NaN() }, 5000},
		{"zero cpu high", func(p *AIMDParams) { p.CPUHigh = 0 }, 5000},
		{"error threshold above 1", func(p *AIMDParams) { p.ErrorThreshold = 2 }, 5000},
		{"NaN initial rate", nil, math.NaN()},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := params()
			if c.tweak != nil {
				c.tweak(&p)
			}
			if _, err := NewAIMD(p, c.initial); !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v, want ErrInvalid", err)
			}
		})
	}
}

func TestActionString(t *testing.T) {
	for a, want := range map[Action]string{ActionHoldStale: "hold_stale", ActionIncrease: "increase", ActionHoldIdle: "hold_idle", 42: "Action(42)"} {
		if a.String() != want {
			t.Errorf("%d: %q, want %q", a, a.String(), want)
		}
	}
}
