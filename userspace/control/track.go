package control

import (
	"fmt"
	"math"
	"time"
)

// TrackParams are the parameters of the capacity-tracking law, the
// default law of behavior adaptive. It has no gains: its one time constant
// is derived from the interval between fresh samples (docs/control.md).
type TrackParams struct {
	TargetLatency    time.Duration
	MinRate, MaxRate float64
	// ErrorThreshold is the error rate (listen overflows, receive-buffer
	// drops, failed probes) above which the queue is taken for full: the
	// rate is then at most what the service took.
	ErrorThreshold float64
	// LatencyOnly: the signal gives only a sampled latency, no queue and
	// no count (probe, feedback). Its samples are sparse and jitter by
	// milliseconds, so the setpoint is the target itself: a third of it
	// would sit in the noise, which then reads as a standing queue and
	// stops the rate from growing back (TestProbeSignal).
	LatencyOnly bool
}

// trackWindow is how many saturated samples the service-rate estimate
// takes the highest of (docs/control.md, "Stability").
const trackWindow = 2

// tauFactor is τ in sample intervals (docs/control.md, "Stability").
const tauFactor = 1.5

// setpointFactor is where the law holds the queueing delay, as a fraction
// of target_latency (docs/control.md, "The setpoint and the in-flight
// cap"): the target is the most a request should wait, not the wait to
// aim at. Held at a third of it, the queue's excursions within a tick and
// a fall of the service rate to a third before the next tick stay under
// it.
const setpointFactor = 1.0 / 3

// minDelayGrowth is the smallest 1 + dW/dt from which the estimator μ = λ /
// (1 + dW/dt) of signals that give only a latency is taken: below it the
// delay falls nearly in real time, the queue drains with few arrivals, and
// the quotient is ill-conditioned.
const minDelayGrowth = 0.5

// Track is the capacity-tracking law (docs/control.md, "adaptive: tracking
// the service rate"). Each fresh sample it estimates the service rate μ
// (measured by the signal, or λ / (1 + dW/dt) from the admitted rate λ and
// the change of the queueing delay W) and the queue q (measured, or W·μ),
// and sets
//
//	R = μ + (s·μ − q) / τ,    s = target / 3,  τ = 1.5 × the interval between samples
//
// which drains or fills the queue toward s·μ (the setpoint), cutting the
// error to a third each sample. With the queue empty μ is what the service
// took (a lower bound), so the same formula probes upward by the factor
// 1 + s/τ while the rule refuses traffic; with the queue at or below the
// setpoint and nothing
// refused it holds the rate (an unused rate must not grow, and a service
// that keeps up is no evidence for a lower one). On errors above the
// threshold the rate is at most μ. R stays in [MinRate, MaxRate].
//
// While the service is saturated and the signal reads its connections in
// flight n, the law also caps them at n − q + s·μ (Step.InFlightCap): the
// kernel then refuses a new connection once the queue is back at the
// setpoint, at once, without waiting for the next tick, so that a fall of
// the service rate cannot grow the queue between two ticks.
//
// A Track is not safe for concurrent use.
type Track struct {
	p        TrackParams
	target   float64 // seconds
	setpoint float64 // seconds: target × setpointFactor
	rate     float64
	start    float64 // the initial rate, clamped: the requests regime's rate

	mus       [trackWindow]float64 // service rates of the last saturated samples
	nmu, imu  int
	prevDelay float64 // seconds, of the last fresh sample
	havePrev  bool
	elapsed   float64 // seconds since the last fresh sample
	delay     float64 // seconds, of the last fresh sample
	last      float64 // service rate of the last saturated sample
	// The in-flight cap's memory: the connections in service (n − q) and
	// the service rate at the last saturated sample with a count, and
	// the fresh samples since.
	busy, busyMu float64
	busyAge      int
	// The service rate under the cap, smoothed over capSmooth samples,
	// and how many samples it has (0: not under the cap).
	capMu float64
	capN  int
	// The in-flight limit on requests, where the kernel counts them
	// (requests.go).
	req requestLimit
}

// capSmooth is the number of samples the service-rate estimate under the
// in-flight cap averages (an EWMA of weight 1/capSmooth once it has them).
// Under the cap the rate only feeds it, so it can follow the service
// slowly and steadily; a fall of the service's rate shows as a queue above
// the setpoint, which leaves the cap's regime for the fast formula.
const capSmooth = 8

// rateBinding is the share of the admitted rate that the rate must refuse
// for the rate, not the in-flight cap, to be what limits the rule: under
// the cap the bucket refuses a few SYNs of the bursts that a freed slot
// lets in, which is no sign of a rate too low.
const rateBinding = 0.1

// capQueueSlack is how far above the setpoint the queue may read and the
// rate still only feed the cap: the queue and the connections in flight
// are read at two moments, and a cap written a tick ago for a service now
// slower holds the queue at the old setpoint's count. A service that
// slows by more than this factor between two ticks leaves the cap's
// regime for the formula, which drains the queue with the rate as well.
const capQueueSlack = 2

// capHold is how many fresh samples with an empty queue keep the in-flight
// cap of the last saturated one: an accept queue read empty for one
// sample (the service caught up for an instant) must not open the gate to
// the whole backlog of SYNs, and a service that stays unsaturated must not
// be capped (its connections may be long-lived; a cap would ration their
// growth).
const capHold = 2

// NewTrack returns the law for a rule's adaptive section, starting at rate
// initial clamped into [MinRate, MaxRate].
func NewTrack(p TrackParams, initial float64) (*Track, error) {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case p.TargetLatency <= 0:
		return nil, fmt.Errorf("new track: %w", invalid("target latency %v: must be positive", p.TargetLatency))
	case !finite(p.MinRate) || p.MinRate <= 0:
		return nil, fmt.Errorf("new track: %w", invalid("min rate %v: must be a positive number", p.MinRate))
	case !finite(p.MaxRate) || p.MaxRate < p.MinRate:
		return nil, fmt.Errorf("new track: %w", invalid("max rate %v: must be a number at least min rate %v", p.MaxRate, p.MinRate))
	case !(p.ErrorThreshold >= 0 && p.ErrorThreshold <= 1):
		return nil, fmt.Errorf("new track: %w", invalid("error threshold %v: must be in [0, 1]", p.ErrorThreshold))
	case !finite(initial):
		return nil, fmt.Errorf("new track: %w", invalid("initial rate %v: must be a number", initial))
	}
	target := p.TargetLatency.Seconds()
	setpoint := target * setpointFactor
	if p.LatencyOnly {
		setpoint = target
	}
	r := min(max(initial, p.MinRate), p.MaxRate)
	return &Track{p: p, target: target, setpoint: setpoint, rate: r, start: r}, nil
}

// Rate is the rate in force.
func (t *Track) Rate() float64 { return t.rate }

// ServiceRate is the current estimate of the service's capacity (0 before
// the service was first seen saturated).
func (t *Track) ServiceRate() float64 { return t.mu() }

func (t *Track) mu() float64 {
	var m float64
	for i := range t.nmu {
		m = max(m, t.mus[i])
	}
	return m
}

// Step runs one control tick of length dt (the time since the previous
// tick).
func (t *Track) Step(in Signals, dt time.Duration) Step {
	t.elapsed += max(dt.Seconds(), 0)
	valid := func(v float64) bool { return v >= 0 && !math.IsInf(v, 0) } // false for NaN
	if in.InFlightRequests && in.HasInFlight && valid(in.InFlight) && !t.p.LatencyOnly {
		return t.stepRequests(in, max(dt.Seconds(), 0))
	}
	latencyOK := !in.LatencyStale && !in.LatencyRepeated && in.Latency >= 0
	queueOK := in.HasQueue && valid(in.QueueDepth)
	// A burst larger than the setpoint's queue would put the queue past
	// the setpoint in one go.
	step := Step{Rate: t.rate, Smoothed: seconds(t.delay), Action: ActionHoldStale, MaxBurst: max(t.setpoint*t.rate, 1)}
	if !(latencyOK || queueOK) || !valid(in.UsedRate) || t.elapsed <= 0 {
		if t.havePrev {
			step.Error = (t.target - t.delay) / t.target
		}
		// A response_time tick without a response (the service rate read
		// as 0, no latency) gives no evidence. For requestStall it holds;
		// then a rate cut below the capacity the service showed probes
		// back up to it: a cut held without evidence starved a keep-alive
		// service at 91/s for 8 s while it could serve 366/s (issue 42).
		if best := t.mu() * (1 + t.setpoint/(tauFactor*requestStall)); in.HasServiceRate && in.ServiceRate == 0 && !t.p.LatencyOnly &&
			t.havePrev && t.elapsed+1e-9 >= requestStall && t.rate < best {
			probe := 1 + t.setpoint/(tauFactor*max(dt.Seconds(), 0.001))
			t.rate = min(max(t.rate*probe, t.p.MinRate), best, t.p.MaxRate)
			step.Rate, step.Action, step.MaxBurst = t.rate, ActionProbe, max(t.setpoint*t.rate, 1)
		}
		return step
	}
	interval := t.elapsed
	t.elapsed = 0

	// The measured service rate of this interval.
	used := in.UsedRate
	var w float64 // queueing delay, seconds
	if latencyOK {
		w = max(in.Latency.Seconds()-max(in.BaseLatency.Seconds(), 0), 0)
	}
	var s float64
	switch {
	case in.HasServiceRate && valid(in.ServiceRate):
		s = in.ServiceRate
	case latencyOK && t.havePrev:
		// q = W·μ and dq/dt = λ − μ give μ = λ / (1 + dW/dt) for a
		// constant μ. While the delay falls nearly in real time the
		// admitted rate is small against μ and the quotient says nothing
		// (0/0 for a queue draining with no arrivals): the last estimate
		// stands.
		if d := 1 + (w-t.prevDelay)/interval; d >= minDelayGrowth {
			s = used / d
		} else if t.last > 0 {
			s = t.last
		} else {
			s = used / minDelayGrowth
		}
	default:
		s = used
	}
	// A queue means the service was busy all along: what it took is its
	// capacity. Without a queue it is only a lower bound, kept out of the
	// estimate. The estimate is the highest of the last saturated
	// samples: a service that stalls for a tick (a pause of its process)
	// and then catches up is not starved for it, and a real fall of its
	// capacity shows in the queue before it shows in the estimate.
	saturated := (queueOK && in.QueueDepth > 0) || (!queueOK && w > 0)
	// An instant of an empty queue under the in-flight cap (capHold): the
	// service was saturated a sample ago and the cap, not the rate,
	// decides what it gets; its estimate stands.
	countOK := in.HasInFlight && valid(in.InFlight)
	hold := !saturated && countOK && t.busyAge < capHold && t.nmu > 0
	mu := s
	switch {
	case saturated:
		t.last = s
		t.mus[t.imu] = s
		t.imu = (t.imu + 1) % trackWindow
		t.nmu = min(t.nmu+1, trackWindow)
		mu = t.mu()
	case hold:
		mu = max(t.mu(), s)
	default:
		t.nmu, t.imu = 0, 0
	}
	var q float64
	switch {
	case queueOK:
		q = in.QueueDepth
		if !latencyOK && mu > 0 {
			w = q / mu
		}
	default:
		q = w * mu
	}
	t.prevDelay, t.havePrev, t.delay = w, true, w
	step.Smoothed, step.Error = seconds(w), (t.target-w)/t.target

	tau := tauFactor * interval
	next := mu + (t.setpoint*mu-q)/tau
	r := t.rate
	// Something refused: the demand is above what the rule admitted, or
	// the rule used (nearly) all its rate.
	limited := in.Demand > used*1.01 || used >= 0.95*r
	// A queue while nothing is refused is a connection caught in it at
	// the moment of the reading, not a saturated service: no cap, which
	// would clamp a lightly loaded service to the few in it.
	if countOK && limited {
		step.InFlightCap = t.inFlightCap(in.InFlight, saturated, q, mu)
	} else {
		t.busyAge = capHold + 1 // no memory: the next cap starts afresh
	}
	capped := step.InFlightCap > 0
	if capped && q <= capQueueSlack*t.setpoint*mu {
		// The cap holds the queue at the setpoint between ticks, at once;
		// the rate only has to keep it fed, at the probing factor above
		// the smoothed service rate. The queue term would fight the cap:
		// under it the queue read at a tick is noise between 0 and the
		// setpoint. Well above it (the service slowed down by more than
		// capQueueSlack) rate and cap both drain it, with the fast
		// estimate.
		switch {
		case t.capN == 0:
			t.capMu, t.capN = mu, 1
		case in.RateRefused > rateBinding*used:
			// The rate, not the cap, refuses: the service takes what
			// the rate gives, and the smoothed estimate would ration its
			// growth; follow the fast estimate up.
			t.capMu = max(t.capMu, mu)
		default:
			sample := s
			if !saturated {
				// An empty queue: this sample is a lower bound.
				sample = max(s, t.capMu)
			}
			t.capN = min(t.capN+1, capSmooth)
			t.capMu += (sample - t.capMu) / float64(t.capN)
		}
		next = t.capMu * (1 + t.setpoint/tau)
	} else {
		t.capN = 0
	}

	errorsOK := !in.ErrorsStale && valid(in.ErrorRate)
	switch {
	case errorsOK && in.ErrorRate > t.p.ErrorThreshold:
		step.Action, next = ActionCutErrors, min(next, mu)
	case latencyOK && mu <= 0 && w > t.target:
		// The service reports a delay above the target, and nothing the
		// rule admitted says how fast it serves (its traffic is idle, or
		// arrives another way): without a capacity to track, scale the
		// rate down by the excess, as a latency-only law must.
		step.Action, next = ActionDecrease, r*t.target/w
	case capped, q > t.setpoint*mu:
		step.Action = ActionTrack
	case !limited:
		step.Action, next = ActionHoldIdle, r
	case q > 0:
		step.Action = ActionTrack
	default:
		step.Action = ActionProbe
	}
	if step.Action == ActionProbe && next < r {
		// An empty queue and refused traffic: the service is faster than
		// the rate, whatever the admitted count of a short tick says.
		next = r
	}
	t.rate = min(max(next, t.p.MinRate), t.p.MaxRate)
	step.Clamped = t.rate != next
	step.Rate = t.rate
	step.MaxBurst = max(t.setpoint*t.rate, 1)
	return step
}

// inFlightCap is the cap on the n connections in flight after a fresh
// sample that refused traffic (0: none): while the service is saturated,
// the connections in service (n − q) and the setpoint's queue, s·μ; the
// queue's excess goes. The cap of the last saturated sample stays for
// capHold samples with an empty queue, then none. (A sample that refuses
// nothing, or reads no count, ends it: Step.)
func (t *Track) inFlightCap(n float64, saturated bool, q, mu float64) float64 {
	if saturated && mu > 0 {
		// The connections in service: up at once, down over capSmooth
		// samples. The count and the queue are read at two moments (a
		// connection established between the two reads is counted
		// twice), so one sample can read far fewer in service than
		// there are workers; a cap at that would starve them
		// (TestAdaptiveInFlightCap on a loaded machine: caps of 1 and
		// 2 for a service of 4 workers).
		busy := max(n-q, 0)
		if t.busyAge > capHold || busy >= t.busy {
			t.busy = busy
		} else {
			t.busy += (busy - t.busy) / capSmooth
		}
		t.busyMu, t.busyAge = mu, 0
	} else {
		t.busyAge++
		if t.busyAge > capHold {
			return 0
		}
		// Idle workers are no fewer: at least what is in flight now.
		t.busy = max(t.busy, n)
	}
	return max(math.Round(t.busy+t.setpoint*t.busyMu), 1)
}
