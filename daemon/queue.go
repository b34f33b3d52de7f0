//go:build linux

package daemon

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netns"

	"github.com/xlimit/xlimit/userspace/control"
	"github.com/xlimit/xlimit/userspace/metrics"
	"github.com/xlimit/xlimit/userspace/tcqueue"
)

// kernelQueues keeps the TC queues of paced rules with queue: kernel
// (userspace/tcqueue, docs/queue.md) in step with the rules and the
// control loop. Only the daemon's loop goroutine calls it, except stats
// (the metrics collector), which the manager makes safe.
type kernelQueues struct {
	mgr    *tcqueue.Manager
	static map[string]float64 // queued rule → its static rate
}

// planQueues checks that the queues of s can be built on every interface,
// before anything is written: a rules file whose filters cannot be made is
// refused like any other invalid file.
func (d *daemon) planQueues(s *Specs) error {
	for _, a := range d.attach {
		if _, err := tcqueue.Filters(a.Iface, s.Queues); err != nil {
			return err
		}
	}
	return nil
}

// applyQueues reconciles the kernel queues with s on every interface,
// after the maps are written. A failure is logged and leaves the XDP
// ceiling (rate × max_queueing_time + 1) as the rule's only limit.
func (d *daemon) applyQueues(s *Specs) {
	q := &d.queues
	spec := s.Queues
	if q.mgr == nil {
		m, err := tcqueue.Open(netns.None())
		if err != nil {
			d.log.Error("cannot manage kernel queues; queue: kernel rules run as queue: none", "err", err)
			return
		}
		q.mgr = m
	}
	q.static = map[string]float64{}
	for _, r := range spec.Queues {
		q.static[r.Rule] = r.Rate
	}
	for _, a := range d.attach {
		if err := q.mgr.Apply(a.Iface, spec); err != nil {
			d.log.Error("kernel queues not in force; the XDP ceiling still holds", "iface", a.Iface, "err", err)
			continue
		}
		if len(spec.Queues) > 0 {
			d.log.Info("kernel queues in force", "iface", a.Iface, "rules", len(spec.Queues))
		}
	}
}

// queueRates puts the control loop's rates (warm_up_paced) in force in the
// queues; the manager writes only rates that changed by more than 0.5 %.
func (d *daemon) queueRates(rep control.TickReport) {
	q := &d.queues
	if q.mgr == nil || len(q.static) == 0 {
		return
	}
	for _, r := range rep.Rules {
		if _, ok := q.static[r.Name]; !ok || r.Rate <= 0 || r.Err != nil {
			continue
		}
		for _, a := range d.attach {
			if wrote, err := q.mgr.SetRate(a.Iface, r.Name, r.Rate); err != nil {
				d.log.Warn("cannot set the queue's rate", "rule", r.Name, "iface", a.Iface, "err", err)
			} else if wrote {
				d.log.Debug("queue rate", "rule", r.Name, "iface", a.Iface, "rate", r.Rate)
			}
		}
	}
}

// queueStats is the metrics collector's view of the queues.
func (d *daemon) queueStats() ([]metrics.QueueStat, error) {
	q := &d.queues
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

// closeQueues runs when the daemon stops. The queues stay (protection
// outlives the daemon, like the XDP program) at their static rates, as the
// kernel's buckets fall back to theirs; with --detach-on-exit they go.
func (d *daemon) closeQueues() error {
	q := &d.queues
	if q.mgr == nil {
		return nil
	}
	var errs []error
	for _, a := range d.attach {
		if d.opts.DetachOnExit {
			errs = append(errs, q.mgr.Remove(a.Iface))
			continue
		}
		for rule, rate := range q.static {
			if _, err := q.mgr.SetRate(a.Iface, rule, rate); err != nil {
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
