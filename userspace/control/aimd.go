package control

import (
	"fmt"
	"math"
	"time"
)

// Action says which branch of the law a tick took.
type Action uint8

const (
	// ActionHoldStale: a signal was stale or invalid; R and L are held
	// (L still takes a fresh, valid latency sample).
	ActionHoldStale Action = iota
	// ActionCutErrors: the error rate exceeded its threshold, R ·= γ.
	ActionCutErrors
	// ActionDecrease: L at or above the target, R ·= 1 − K_m·min(|e|, 1).
	ActionDecrease
	// ActionIncrease: L below the target, CPU below CPUHigh and the rule
	// uses at least half of R: R += K_a·√e.
	ActionIncrease
	// ActionHoldCPU: L below the target but CPU usage at or above CPUHigh.
	ActionHoldCPU
	// ActionHoldIdle: L below the target but the rule uses less than half
	// of R; raising an unused rate would let the next spike through. For
	// Track: the queue at or below the target and nothing refused.
	ActionHoldIdle
	// ActionTrack (Track): the queue is not empty; R = μ + (target·μ − q)/τ.
	ActionTrack
	// ActionProbe (Track): the queue is empty and the rule refuses traffic;
	// R grows by the factor 1 + target/τ.
	ActionProbe
)

var actionNames = [...]string{"hold_stale", "cut_errors", "decrease", "increase", "hold_cpu", "hold_idle", "track", "probe"}

func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// Step is the outcome of one tick.
type Step struct {
	// Rate is R after the tick, the rate to put in force.
	Rate float64
	// Smoothed is L after the tick.
	Smoothed time.Duration
	// Error is e = (target − L) / target after smoothing; 0 while no
	// latency sample has been seen.
	Error  float64
	Action Action
	// Clamped reports that R_min or R_max bounded the step.
	Clamped bool
	// InFlightCap, when not 0, is the most connections the rule may have
	// in flight until the next tick (Track only; the kernel refuses new
	// ones beyond it).
	InFlightCap float64
	// MaxBurst, when not 0, bounds the burst written with Rate (Track:
	// the setpoint's queue at the new rate).
	MaxBurst float64
}

// AIMD is the adaptive law of docs/design.md §5.4. Per tick, with the smoothed
// latency L = α·sample + (1 − α)·L and e = (target − L) / target:
//
//  1. error rate > threshold:                 R = max(R_min, R·γ)
//  2. else if e ≤ 0:                          R = max(R_min, R·(1 − K_m·min(|e|, 1)))
//  3. else if CPU < CPU_high and used ≥ R/2:  R = min(R_max, R + K_a·√e)
//  4. else hold R.
//
// The clamps: every step's result lies in [R_min, R_max]; since L ≥ 0, e ≤
// 1, so an increase adds at most K_a per tick; a decrease removes at most
// the fraction K_m of R per tick (γ on errors); R never leaves the range
// even when it starts outside it or a gain would overshoot. The first fresh
// sample initialises L (an EWMA started at 0 would read the first ticks as
// idle). A tick with any stale or invalid signal holds R and reports
// ActionHoldStale.
//
// An AIMD is not safe for concurrent use.
type AIMD struct {
	p        AIMDParams
	target   float64 // seconds
	rate     float64
	smoothed float64 // seconds
	primed   bool    // smoothed holds a sample
}

// NewAIMD returns the law for the parameters of a rule's adaptive section,
// starting at rate initial (the rule's rate), clamped into [MinRate,
// MaxRate].
func NewAIMD(p AIMDParams, initial float64) (*AIMD, error) {
	if err := checkAdaptive(p, initial); err != nil {
		return nil, fmt.Errorf("new aimd: %w", err)
	}
	return &AIMD{
		p:      p,
		target: p.TargetLatency.Seconds(),
		rate:   min(max(initial, p.MinRate), p.MaxRate),
	}, nil
}

func checkAdaptive(p AIMDParams, initial float64) error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case p.TargetLatency <= 0:
		return invalid("target latency %v: must be positive", p.TargetLatency)
	case !finite(p.MinRate) || p.MinRate <= 0:
		return invalid("min rate %v: must be a positive number", p.MinRate)
	case !finite(p.MaxRate) || p.MaxRate < p.MinRate:
		return invalid("max rate %v: must be a number at least min rate %v", p.MaxRate, p.MinRate)
	case !finite(p.KA) || p.KA <= 0:
		return invalid("ka %v: must be a positive number", p.KA)
	case !(p.KM > 0 && p.KM <= 1):
		return invalid("km %v: must be in (0, 1]", p.KM)
	case !(p.Gamma > 0 && p.Gamma < 1):
		return invalid("gamma %v: must be in (0, 1)", p.Gamma)
	case !(p.Alpha > 0 && p.Alpha <= 1):
		return invalid("alpha %v: must be in (0, 1]", p.Alpha)
	case !(p.CPUHigh > 0 && p.CPUHigh <= 1):
		return invalid("cpu high %v: must be in (0, 1]", p.CPUHigh)
	case !(p.ErrorThreshold >= 0 && p.ErrorThreshold <= 1):
		return invalid("error threshold %v: must be in [0, 1]", p.ErrorThreshold)
	case !finite(initial):
		return invalid("initial rate %v: must be a number", initial)
	}
	return nil
}

// Rate is the rate in force.
func (a *AIMD) Rate() float64 { return a.rate }

// Smoothed is the smoothed latency L.
func (a *AIMD) Smoothed() time.Duration { return seconds(a.smoothed) }

// Step runs one control tick.
func (a *AIMD) Step(in Signals) Step {
	latencyOK := !in.LatencyStale && in.Latency >= 0
	if latencyOK {
		s := in.Latency.Seconds()
		if a.primed {
			a.smoothed = a.p.Alpha*s + (1-a.p.Alpha)*a.smoothed
		} else {
			a.smoothed, a.primed = s, true
		}
	}
	step := Step{Rate: a.rate, Smoothed: seconds(a.smoothed), Action: ActionHoldStale}
	if a.primed {
		step.Error = (a.target - a.smoothed) / a.target
	}
	valid := func(v float64) bool { return v >= 0 && !math.IsInf(v, 0) } // false for NaN
	if !latencyOK || in.ErrorsStale || in.CPUStale || !valid(in.ErrorRate) || !valid(in.CPU) || !valid(in.UsedRate) {
		return step
	}
	e, r := step.Error, a.rate
	var next float64
	switch {
	case in.ErrorRate > a.p.ErrorThreshold:
		step.Action, next = ActionCutErrors, r*a.p.Gamma
	case e <= 0:
		step.Action, next = ActionDecrease, r*(1-a.p.KM*min(-e, 1))
	case in.CPU >= a.p.CPUHigh:
		step.Action, next = ActionHoldCPU, r
	case in.UsedRate < r/2:
		step.Action, next = ActionHoldIdle, r
	default:
		step.Action, next = ActionIncrease, r+a.p.KA*math.Sqrt(min(e, 1))
	}
	a.rate = min(max(next, a.p.MinRate), a.p.MaxRate)
	step.Clamped = a.rate != next
	step.Rate = a.rate
	return step
}

// seconds converts seconds to a duration, rounding to the nanosecond.
func seconds(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }
