package control

import "time"

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

// AIMDParams are the target, bounds and gains of an adaptive rule. Track
// reads TargetLatency, MinRate, MaxRate and ErrorThreshold of them; the
// gains are AIMD's.
type AIMDParams struct {
	TargetLatency    time.Duration
	MinRate, MaxRate float64
	KA               float64 // additive increase gain
	KM               float64 // multiplicative decrease gain, (0,1]
	Gamma            float64 // decrease factor on errors, (0,1)
	Alpha            float64 // latency smoothing, (0,1]
	CPUHigh          float64 // no increase at or above this CPU usage, (0,1]
	ErrorThreshold   float64 // error rate that triggers the Gamma cut, [0,1]
}

// BreakerParams configure a circuit breaker (docs/design.md §5.8).
type BreakerParams struct {
	SlowLatency    time.Duration
	SlowRatio      float64
	ErrorRatio     float64
	MinRequests    int
	Window         time.Duration
	RetryTimeout   time.Duration
	HalfOpenProbes int
}

// SystemParams configure host-wide protection (docs/design.md §5.6).
type SystemParams struct {
	// CPUHigh is the overload threshold of the reader given to SetSystem.
	CPUHigh float64
}
