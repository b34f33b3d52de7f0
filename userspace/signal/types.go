package signal

import (
	"time"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Rule is what the readers of this package need to know of a rule: where
// its service listens and what steers it.
type Rule struct {
	Name    string
	Ports   []dataplane.PortRange // merged; empty: every port
	SynOnly bool                  // the rule counts new connections
	Bytes   bool                  // the rule's unit is bytes
	// Signal is what steers an adaptive rule; empty for other rules.
	Signal config.Signal
	// SlowLatency is the circuit breaker's slow-call threshold; 0: none.
	SlowLatency time.Duration
}

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
}

// Stale is the reading of a tick in which nothing could be read.
func Stale(used float64) Signals {
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
