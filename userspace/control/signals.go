package control

import "time"

// Signals is what the control loop's adaptive law reads of a rule for one
// tick. A reading that could not be taken is marked stale, never guessed.
type Signals struct {
	// Latency is the queueing-latency sample of admitted work (accept-queue
	// delay by Little's law, probe or feedback), never the service's own
	// processing time and never from dropped traffic.
	Latency time.Duration
	// LatencyStale reports that no fresh latency sample was read this tick.
	LatencyStale bool
	// ErrorRate is the fraction of failed work in [0, 1] (listen
	// overflows per new connection, failed probes, reported errors).
	ErrorRate float64
	// ErrorsStale reports that the error counters were not read this tick.
	ErrorsStale bool
	// CPU is the host's (or the service cgroup's) CPU usage in [0, 1].
	CPU float64
	// CPUStale reports that the CPU usage was not read this tick.
	CPUStale bool
	// UsedRate is the rate the rule actually admitted over the last tick,
	// from the kernel's passed counters, in the rule's unit per second.
	UsedRate float64

	// What the capacity-tracking law reads besides (docs/control.md,
	// "adaptive: tracking the service rate"). AIMD ignores these fields.

	// LatencyRepeated reports that Latency is the sample of a previous
	// tick again (a probe or a report that was not renewed since): fresh
	// enough for AIMD, no new information for Track.
	LatencyRepeated bool
	// BaseLatency is the part of Latency that is not queueing: 0 for
	// signals that measure a queue (accept_queue, socket_queue, feedback's
	// queueing delay), the recent minimum of the samples for signals that
	// measure a whole response (probe, response_time). The queueing delay
	// is Latency − BaseLatency.
	BaseLatency time.Duration
	// ServiceRate is how many units per second the service actually took
	// over the tick: connections accepted from its listen queue, datagrams
	// read from its sockets, responses started. When the queue is not
	// empty it is the service's capacity; when it is empty, a lower bound.
	ServiceRate float64
	// HasServiceRate reports that ServiceRate was read this tick; without
	// it the law estimates the service rate from the admitted rate and the
	// change of the queueing delay. (A "has" flag, not a "stale" one, so
	// that a reader that knows nothing of it leaves it unknown.)
	HasServiceRate bool
	// QueueDepth is the number of units waiting for the service at the
	// end of the tick (accept queue, datagrams in receive queues, requests
	// without a response); meaningful only when HasQueue.
	QueueDepth float64
	// HasQueue reports that QueueDepth was read this tick; without it the
	// law takes the queueing delay × the service rate.
	HasQueue bool
	// InFlight is the rule's TCP connections in flight at the end of the
	// tick, as the kernel counts them for concurrency limits (from the
	// handshake until the service closes the connection); meaningful only
	// when HasInFlight. Track caps it while the service is saturated.
	InFlight    float64
	HasInFlight bool
	// InFlightRequests reports that InFlight counts requests, not
	// connections: HTTP requests between their first byte and their
	// response's first byte (an idle keep-alive connection is not in
	// flight), where the kernel counts them for a response_time rule and
	// refuses requests over the rule's in-flight cap, on new and on
	// established connections alike. Track then steers the cap as a limit
	// on requests (docs/control.md, "Keep-alive services").
	InFlightRequests bool
	// RateRefused is what the rule's rate refused over the tick (reason
	// rule, per second; the in-flight cap's and the gates' refusals are
	// not in it). The control loop fills it from the kernel's counters.
	RateRefused float64
	// Demand is the offered rate over the tick: what reached the rule,
	// passed or refused, in the rule's unit per second. The control loop
	// fills it from the kernel's counters.
	Demand float64
}

// StaleSignals is the reading of a tick in which nothing could be read.
func StaleSignals(used float64) Signals {
	return Signals{UsedRate: used, LatencyStale: true, ErrorsStale: true, CPUStale: true}
}

// Outcomes is what a rule's service did over one tick, as a circuit
// breaker counts it (docs/control.md, "Circuit breaker").
type Outcomes struct {
	Requests int // denominator of the error ratio
	Errors   int // ≤ Requests
	Timed    int // calls with a latency: denominator of the slow ratio
	Slow     int // ≤ Timed
}

// Valid reports whether the counts are consistent.
func (o Outcomes) Valid() bool {
	return o.Requests >= 0 && o.Errors >= 0 && o.Errors <= o.Requests &&
		o.Timed >= 0 && o.Slow >= 0 && o.Slow <= o.Timed && o.Timed <= o.Requests
}
