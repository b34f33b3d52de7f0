//go:build linux

package daemon

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/vishvananda/netns"

	"github.com/xlimit/xlimit/userspace/control"
	"github.com/xlimit/xlimit/userspace/metrics"
	"github.com/xlimit/xlimit/userspace/tcqueue"
)

// kernelQueues keeps the TC queues of paced rules with queue: kernel
// (userspace/tcqueue, docs/queue.md) in step with the rules and the
// control loop, on the interfaces it is given. Only the daemon's loop
// goroutine calls it, except stats (the metrics collector), which the
// manager makes safe.
type kernelQueues struct {
	log    *slog.Logger
	detach bool // take the queues off when the daemon stops (--detach-on-exit)
	mgr    *tcqueue.Manager
	static map[string]float64 // queued rule → its static rate
}

// plan checks that the queues of spec can be built on every interface,
// before anything is written: a rules file whose filters cannot be made is
// refused like any other invalid file.
func (q *kernelQueues) plan(ifaces []string, spec tcqueue.Spec) error {
	for _, iface := range ifaces {
		if _, err := tcqueue.Filters(iface, spec); err != nil {
			return err
		}
	}
	return nil
}

// apply reconciles the kernel queues with spec on every interface, after
// the maps are written. A failure is logged and leaves the XDP ceiling
// (rate × max_queueing_time + 1) as the rule's only limit.
func (q *kernelQueues) apply(ifaces []string, spec tcqueue.Spec) {
	if q.mgr == nil {
		m, err := tcqueue.Open(netns.None())
		if err != nil {
			q.log.Error("cannot manage kernel queues; queue: kernel rules run as queue: none", "err", err)
			return
		}
		q.mgr = m
	}
	q.static = map[string]float64{}
	for _, r := range spec.Queues {
		q.static[r.Rule] = r.Rate
	}
	for _, iface := range ifaces {
		if err := q.mgr.Apply(iface, spec); err != nil {
			q.log.Error("kernel queues not in force; the XDP ceiling still holds", "iface", iface, "err", err)
			continue
		}
		if len(spec.Queues) > 0 {
			q.log.Info("kernel queues in force", "iface", iface, "rules", len(spec.Queues))
		}
	}
}

// rates puts the control loop's rates (warm_up_paced) in force in the
// queues; the manager writes only rates that changed by more than 0.5 %.
func (q *kernelQueues) rates(ifaces []string, rep control.TickReport) {
	if q.mgr == nil || len(q.static) == 0 {
		return
	}
	for _, r := range rep.Rules {
		if _, ok := q.static[r.Name]; !ok || r.Rate <= 0 || r.Err != nil {
			continue
		}
		for _, iface := range ifaces {
			if wrote, err := q.mgr.SetRate(iface, r.Name, r.Rate); err != nil {
				q.log.Warn("cannot set the queue's rate", "rule", r.Name, "iface", iface, "err", err)
			} else if wrote {
				q.log.Debug("queue rate", "rule", r.Name, "iface", iface, "rate", r.Rate)
			}
		}
	}
}

// stats is the metrics collector's view of the queues.
func (q *kernelQueues) stats() ([]metrics.QueueStat, error) {
	if q.mgr == nil {
		return nil, nil
	}
	stats, err := q.mgr.Stats()
	out := make([]metrics.QueueStat, 0, len(stats))
	for _, s := range stats {
		out = append(out, metrics.QueueStat{Iface: s.Iface, Rule: s.Rule, Rate: s.Rate, Backlog: s.Backlog,
			BacklogBytes: s.BacklogBytes, Sent: s.Sent, Drops: s.Drops})
	}
	return out, err
}

// close runs when the daemon stops. The queues stay (protection outlives
// the daemon, like the XDP program) at their static rates, as the kernel's
// buckets fall back to theirs; with --detach-on-exit they go.
func (q *kernelQueues) close(ifaces []string) error {
	if q.mgr == nil {
		return nil
	}
	var errs []error
	for _, iface := range ifaces {
		if q.detach {
			errs = append(errs, q.mgr.Remove(iface))
			continue
		}
		for rule, rate := range q.static {
			if _, err := q.mgr.SetRate(iface, rule, rate); err != nil {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, q.mgr.Close())
	q.mgr = nil
	return errors.Join(errs...)
}

// RemoveQueues takes xlimit's kernel queues off an interface (xlimit
// detach).
func RemoveQueues(iface string) error {
	m, err := tcqueue.Open(netns.None())
	if err != nil {
		return err
	}
	defer m.Close()
	if err := m.Remove(iface); err != nil {
		return fmt.Errorf("remove kernel queues from %s: %w", iface, err)
	}
	return nil
}
