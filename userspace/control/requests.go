package control

import (
	"math"
)

// The in-flight limit on requests (docs/control.md, "Keep-alive services:
// a limit on requests in flight"). Where the kernel counts a rule's HTTP
// requests in flight (signal response_time: from a request's first byte to
// its response's first byte; an idle keep-alive connection is not in
// flight) and refuses those over the cap, whether they open a connection or
// ride an established one, Track steers that cap, not the queue through
// the rate. It is a gradient limit in the manner of Netflix's
// concurrency-limits (Vegas, Gradient2), anchored on Little's law:
//
//	rtt₀     = the response time of an idle service (BaseLatency)
//	goal     = rtt₀ + s                       s = target_latency / 3
//	fresh sample, rtt > goal:                 L = max(μ·goal, L/2)        cut to what the service completes within goal
//	fresh sample, rtt ≤ goal, L binding:      L = L·(1 + s/τ), at least +1 probe
//	fresh sample, L not binding:              L = min(L, 2·n̂ + 2)           an unused limit does not grow
//	no response for requestStall, n > 0:      L = L·(1 + s/τ) each tick  no evidence holds no cut
//
// with μ the responses per second of the tick, n the requests in flight, n̂
// their peak over the last requestPeakSamples samples and τ as in Track.
// The capacity is never configured: at the no-load latency rtt₀ the service
// completes μ requests a second with μ·rtt₀ of them in flight, and μ·goal in
// flight holds its queueing delay at s; a slower service (a capacity step)
// shows a longer rtt at the next sample and is cut to its new μ·goal at
// once. Between samples the kernel enforces the cap on every request.
//
// The rate does not follow the service here: the cap does the work, and a
// request it refuses rides an established connection, whose address is
// proven, so its refusal is a reset both ways at any rate (bpf/request_tc.h).
// A SYN the rate refuses is answered only within the reset budgets (the
// rule's, at its rate; the host's), which bound what a spoofed flood can
// reflect; past them it is dropped silently and its client retries after
// 1 s. A rate that followed what the service completes, max(μ̂,
// L/goal)·(1 + s/τ), refused most new connections at 10× (a connection per
// request, or the replacement connection of every keep-alive request the
// cap refused), and most of those silently: 26 755 client timeouts at 10×
// with a connection per request, 34 018 with keep-alive (make bench-http
// at d66d3e9, issue 42). So the rate of new connections stays at the
// rule's own rate (its start, clamped into [min_rate, max_rate]), or what
// the service completes if that is higher; errors above the threshold cut
// it to μ for the tick, and it grows back by 1 + s/τ a sample. When no
// response arrives for requestStall while requests are in flight, the cap
// probes upward: a stalled count, or responses the program missed, must
// not hold a cut for ever.

// requestStall is how long without a response, with requests in flight,
// the limit holds before it probes upward (seconds).
const requestStall = 0.5

// requestPeakSamples is the window of the peak of requests in flight that
// bounds an unused limit.
const requestPeakSamples = 20

// requestMinLimit is the smallest cap: one request in service and one
// waiting.
const requestMinLimit = 2

// requestLimit is Track's state for the in-flight limit on requests.
type requestLimit struct {
	limit float64 // L; 0 before the first sample
	peaks [requestPeakSamples]float64
	ipeak int
}

func (l *requestLimit) peak() float64 {
	var m float64
	for _, v := range l.peaks {
		m = max(m, v)
	}
	return m
}

// stepRequests is Track.Step for a rule whose kernel counts requests in
// flight (Signals.InFlightRequests, n = in.InFlight valid), dt seconds
// after the previous tick; t.elapsed already holds the time since the last
// fresh sample.
func (t *Track) stepRequests(in Signals, dt float64) Step {
	rl := &t.req
	valid := func(v float64) bool { return v >= 0 && !math.IsInf(v, 0) }
	n := in.InFlight
	fresh := !in.LatencyStale && !in.LatencyRepeated && in.Latency > 0 && in.HasServiceRate && valid(in.ServiceRate) && in.ServiceRate > 0 && t.elapsed > 0
	step := Step{Rate: t.rate, Smoothed: seconds(t.delay), Action: ActionHoldStale, MaxBurst: max(t.setpoint*t.rate, 1)}
	rl.peaks[rl.ipeak] = n
	rl.ipeak = (rl.ipeak + 1) % requestPeakSamples
	if !fresh {
		step.InFlightCap = math.Round(rl.limit)
		if rl.limit > 0 && n > 0 && t.elapsed+1e-9 >= requestStall {
			// Requests in flight and no response for requestStall:
			// nothing says the service is still slow. Probe up.
			// The probing factor of a fresh sample a tick long.
			probe := 1 + t.setpoint/(tauFactor*max(dt, 0.001))
			rl.limit *= probe
			t.rate = min(max(t.rate*probe, t.start), t.p.MaxRate)
			step.Action, step.Rate = ActionProbe, t.rate
			step.InFlightCap = math.Round(rl.limit)
			step.MaxBurst = max(t.setpoint*t.rate, 1)
		}
		return step
	}
	interval := t.elapsed
	t.elapsed = 0
	probe := 1 + t.setpoint/(tauFactor*interval)
	rtt := in.Latency.Seconds()
	base := max(in.BaseLatency.Seconds(), 0)
	if base <= 0 || base > rtt {
		base = rtt
	}
	goal := base + t.setpoint
	mu := in.ServiceRate
	w := max(rtt-base, 0)
	t.delay, t.prevDelay, t.havePrev = w, w, true
	step.Smoothed, step.Error = seconds(w), (t.target-w)/t.target

	if rl.limit == 0 {
		// The first sample: room for twice what is in flight, and for
		// the service's completions within the goal.
		rl.limit = max(2*rl.peak()+2, mu*goal, requestMinLimit)
	}
	binding := n >= rl.limit-1
	saturated := rtt > goal
	switch {
	case saturated:
		// Little's law: the service completes μ a second; μ·goal in
		// flight wait s at most. At most half of the limit a sample.
		rl.limit = max(mu*goal, rl.limit/2)
		step.Action = ActionTrack
		// The service's rate, seen saturated.
		t.mus[t.imu] = mu
		t.imu = (t.imu + 1) % trackWindow
		t.nmu = min(t.nmu+1, trackWindow)
	case binding:
		rl.limit = max(rl.limit*probe, rl.limit+1)
		step.Action = ActionProbe
	default:
		rl.limit = min(rl.limit, max(2*rl.peak()+2, requestMinLimit))
		step.Action = ActionHoldIdle
	}
	rl.limit = max(rl.limit, requestMinLimit)
	// The cap bounds the queue; the rate of new connections stays at the
	// rule's own, or what the service completes if higher, and grows
	// back to it after a cut for errors.
	est := max(t.mu(), mu, rl.limit/goal) * probe
	next := max(min(t.rate*probe, t.start), est)
	errorsOK := !in.ErrorsStale && valid(in.ErrorRate)
	if errorsOK && in.ErrorRate > t.p.ErrorThreshold {
		step.Action, next = ActionCutErrors, min(next, mu)
	}
	t.rate = min(max(next, t.p.MinRate), t.p.MaxRate)
	step.Clamped = t.rate != next
	step.Rate = t.rate
	step.InFlightCap = math.Round(rl.limit)
	step.MaxBurst = max(t.setpoint*t.rate, 1)
	return step
}
