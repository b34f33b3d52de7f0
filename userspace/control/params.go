package control

import (
	"time"

	"github.com/xlimit/xlimit/userspace/config"
)

// Behavior is the law that steers a rule (docs/design.md §5).
type Behavior uint8

const (
	BehaviorReject      Behavior = iota // static bucket, excess dropped
	BehaviorWarmUp                      // Sentinel's warm-up curve
	BehaviorPaced                       // static pacing, nothing to steer
	BehaviorWarmUpPaced                 // warm-up curve with a pacing burst
	BehaviorAdaptive                    // capacity tracking (or AIMD) on queueing latency
)

// Law is the law of an adaptive rule.
type Law uint8

const (
	// LawTrack tracks the measured service rate and holds the queueing
	// delay at the target (Track); the default.
	LawTrack Law = iota
	// LawAIMD is docs/design.md §5.4's AIMD on the smoothed latency.
	LawAIMD
)

// WarmUpParams is a warm-up rule's curve.
type WarmUpParams struct {
	Period     time.Duration
	ColdFactor float64
}

// AIMDParams are the target, bounds and gains of an adaptive rule, the
// config's own type (one definition: the rules file's adaptive section is
// the laws' parameters). Track reads TargetLatency, MinRate, MaxRate and
// ErrorThreshold of them; the gains are AIMD's.
type AIMDParams = config.AdaptiveParams

// BreakerParams configure a circuit breaker (docs/design.md §5.8): the
// rules file's circuit_breaker section, one definition (config.CircuitBreaker).
type BreakerParams = config.CircuitBreaker

// SystemParams configure host-wide protection (docs/design.md §5.6).
type SystemParams struct {
	// CPUHigh is the overload threshold of the reader given to SetSystem.
	CPUHigh float64
}
