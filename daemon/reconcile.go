package daemon

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// requestsReconcile is how often the daemon corrects the kernel's
// requests in flight (bpf/request.h): a stamped flow that the response
// flows' LRU evicts is never counted down by the kernel, so the count
// would drift up without bound and the cap on requests in flight would
// refuse every request. Between two sweeps the drift is at most the
// stamped flows evicted since the last.
const requestsReconcile = 5 * time.Second

// requestReconciler is what the reconciliation needs of an interface's
// maps (maps.(*Tables).ReconcileRequests).
type requestReconciler interface {
	ReconcileRequests() (map[int]int64, error)
}

// reconcileRequests sets each rule's requests in flight to the stamped
// flows the kernel still follows, on every attached interface whose plan
// counts requests (countsRequests), every
// requestsReconcile until ctx ends. It runs under the attachments' lock,
// so no interface is detached (its maps closed) during a sweep.
func reconcileRequests(ctx context.Context, with func(func([]*loader.Attachment, map[string]*dataplane.Plan)), log *slog.Logger) {
	tick := time.NewTicker(requestsReconcile)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			with(func(attach []*loader.Attachment, plans map[string]*dataplane.Plan) {
				for _, a := range attach {
					if countsRequests(plans[a.Iface]) {
						reconcileOne(a.Iface, a.Tables(), log)
					}
				}
			})
		}
	}
}

// countsRequests reports whether the plan in force on an interface has a
// rule whose response time, and so whose requests in flight, the kernel
// follows: only then is a sweep (a walk of up to 65 536 flows under the
// attachments' lock) worth its cost.
func countsRequests(p *dataplane.Plan) bool {
	return p != nil && p.Globals.RespTime != 0
}

// reconcileOne reconciles one interface's count and logs what it corrected.
func reconcileOne(iface string, t requestReconciler, log *slog.Logger) {
	fix, err := t.ReconcileRequests()
	switch {
	case errors.Is(err, maps.ErrNoRequests):
		return
	case err != nil:
		log.Warn("cannot reconcile the requests in flight", "iface", iface, "err", err)
		return
	}
	for slot, d := range fix {
		log.Debug("requests in flight reconciled", "iface", iface, "slot", slot, "correction", d)
	}
}
