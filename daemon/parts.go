package daemon

import (
	"github.com/xlimit/xlimit/userspace/control"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
)

// parts are the daemon's parts that a commit of rules writes (rules.go),
// opened as the daemon starts. The daemon holds them and its pipeline
// points at them, so a part opened late (the rules source, the fleet, the
// metrics server, the host's CPU) is seen by both, with no copy to keep in
// step. A part not open yet is nil: its methods are nil-safe.
type parts struct {
	loop     *control.Loop
	feedback *xsignal.Feedback
	probes   xsignal.Probes
	signals  loopSignals
	queues   kernelQueues           // paced rules with queue: kernel (queue.go)
	hostCPU  func() (float64, bool) // nil when the host's CPU cannot be read
	src      *ruleSource            // nil without a rules source (rulesource.go)
	fleet    *fleetShare            // nil without --fleet (fleet.go)
	metrics  *metricsServer         // nil without --metrics-addr (metrics.go)
}
