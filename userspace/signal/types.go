package signal

import (
	"time"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/control"
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
	// Requests marks a response_time rule whose kernel counts requests in
	// flight and caps them (bpf/request.h): the sampler reads them
	// (KernelSources.Requests) in place of its connections.
	Requests bool
}

// Signals and Outcomes are what this package reads for the control
// loop, in the control loop's own types: the consumer owns them (package
// control, signals.go), and the pure package needs nothing of this one's
// sockets, procfs and probes.
type (
	Signals  = control.Signals
	Outcomes = control.Outcomes
)

// Stale is the reading of a tick in which nothing could be read.
func Stale(used float64) Signals { return control.StaleSignals(used) }
