//go:build linux

package daemon

import (
	"errors"
	"fmt"
	"time"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Rules applied with a confirmation deadline (`xlimit apply --confirm`,
// PUT /v1/rules?confirm=): as with a router's "commit confirmed", the
// previous rules come back unless `xlimit confirm` comes in time.
//
// The kernel keeps the deadline (maps.Tables.ApplyConfirm, bpf/gen.h): the
// previous rules stay in their generation, untouched, and from the
// deadline every program uses them again, whether a daemon runs or not. A
// running daemon reverts at the deadline too, on the loop goroutine, in
// this order: the kernel back to that generation (at once, nothing to
// compile), then the previous document through the one path, compiled as
// it was (its plans), so that the queues, the control loop and the rules
// shown follow. Documents still being prepared then are applied after the
// revert, as any document that comes after: what runs is what a restart
// loads. A revert that fails is retried every revertRetry until it
// succeeds or another document replaces the rules; each attempt is
// counted once it is over (xlimit_rules_reverts_total{result}).
//
// A document waiting for its confirmation is not persisted, so a restart
// inside the window starts from the previous rules (and says so: it finds
// the kernel's pending change, settlePending); one after the deadline
// finds the kernel on them already. Any other document applied meanwhile
// (the file, a plain PUT) ends the wait: it is the rules in force from
// then on. A second `apply --confirm` replaces the first and keeps its way
// back: the rules of before the first.

// revertRetry is how often a failed revert is tried again.
const revertRetry = time.Second

// confirmC is the channel of the deadline, or of the next attempt of a
// failed revert; nil (never ready) when nothing waits.
func (pl *pipeline) confirmC() <-chan time.Time {
	if pl.pending == nil {
		return nil
	}
	return pl.pending.timer.C
}

// beforeCommit readies a job for its commit, on the loop goroutine: a
// change that waits for its confirmation gets its deadline now, for the
// kernel, and the control loop's rates written meanwhile expire by then
// (limitCap).
func (pl *pipeline) beforeCommit(r *prepResult) {
	if r.doc.origin != FromAPIPending || r.p == nil {
		return
	}
	r.p.confirmNS = pl.opts.Monotonic() + uint64(r.confirm)
	r.p.confirmAt = time.Now().Add(r.confirm)
	pl.capNS = r.p.confirmNS
}

// afterCommit follows the wait for a confirmation through a document
// just applied; was is the document in force before it and wasPlans its
// plans.
func (pl *pipeline) afterCommit(p *prepared, was *prepared, wasPlans map[string]*dataplane.Plan) {
	doc := p.doc
	switch {
	case doc.origin == FromAPIPending:
		if pl.pending == nil || pl.pending.reverting {
			// The way back is the rules in force before this change. A
			// failed revert still retrying has put them back in the
			// kernel already (and the plans are theirs).
			if pl.pending != nil {
				pl.pending.timer.Stop()
				was, wasPlans = pl.pending.prev, pl.pending.prevPlans
			}
			pl.pending = &pendingConfirm{prev: was, prevPlans: wasPlans}
		} else {
			// A second change: the way back stays the first's.
			pl.pending.timer.Stop()
		}
		pl.pending.doc = doc
		pl.pending.deadline, pl.pending.deadlineNS = p.confirmAt, p.confirmNS
		pl.pending.timer = time.NewTimer(time.Until(p.confirmAt))
		pl.kernel.setReserved(pl.pending.prevPlans)
		pl.log.Warn("rules applied WAITING FOR A CONFIRMATION ('xlimit confirm'); without one the previous rules return", "deadline", pl.pending.deadline.Format(time.RFC3339), "previous", pl.pending.prev.doc.label)
	case pl.pending != nil && doc.origin != FromRevert:
		pl.pending.timer.Stop()
		if pl.pending.reverting {
			pl.log.Info("a document replaced the rules while the revert was retried; nothing to revert any more", "origin", doc.origin, "source", doc.label)
		} else {
			pl.log.Info("the rules waiting for a confirmation are replaced; nothing to confirm any more", "origin", doc.origin, "source", doc.label)
		}
		pl.endWait()
	}
}

// endWait forgets the wait for a confirmation.
func (pl *pipeline) endWait() {
	pl.pending = nil
	pl.capNS = 0
	pl.kernel.setReserved(nil)
}

// confirm is `xlimit confirm`, on the loop goroutine: the kernel first
// (each interface's change stays), then the state directory, then the
// answer. A crash in between leaves the kernel's rules and the state
// directory's different only as a restart resolves them: it loads the
// state directory's.
func (pl *pipeline) confirm() error {
	p := pl.pending
	if p == nil {
		return fmt.Errorf("%w: no rules are waiting for a confirmation", api.ErrRejected)
	}
	if p.reverting || pl.opts.Monotonic() >= p.deadlineNS {
		if !p.reverting {
			pl.revert()
		}
		return fmt.Errorf("%w: too late: the deadline passed at %s and the previous rules are back", api.ErrRejected, p.deadline.Format(time.RFC3339))
	}
	var errs []error
	for _, a := range pl.kernel.all() {
		if err := a.Tables().Confirm(); errors.Is(err, maps.ErrConfirmExpired) {
			pl.revert()
			return fmt.Errorf("%w: too late: the deadline passed at %s and the previous rules are back", api.ErrRejected, p.deadline.Format(time.RFC3339))
		} else if err != nil {
			errs = append(errs, fmt.Errorf("confirm on %s: %w", a.Iface, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		// The deadline stays: the kernel reverts then.
		pl.log.Error("cannot confirm the rules in the kernel; they will be reverted at the deadline", "err", err)
		return err
	}
	p.timer.Stop()
	pl.endWait()
	// From now on they are the API's rules, kept for a restart.
	doc := document{origin: FromAPI, name: p.doc.name, label: "api", text: p.doc.text}
	pl.persist(doc)
	pl.inForce = doc
	if pl.inForcePrep != nil {
		pl.inForcePrep.doc = doc
	}
	pl.record.setSource("api")
	pl.log.Info("rules confirmed; kept for a restart", "in_force_since", time.Until(p.deadline).Round(time.Second))
	return nil
}

// revert is the deadline without a confirmation (or the next attempt of a
// revert that failed): the previous rules return, in the kernel at once,
// then through the one path. It is counted once it is over, and retried
// while it fails.
func (pl *pipeline) revert() {
	p := pl.pending
	p.timer.Stop()
	if !p.reverting {
		pl.log.Error("NO CONFIRMATION in time: reverting to the previous rules", "previous", p.prev.doc.label, "deadline", p.deadline.Format(time.RFC3339))
	}
	p.attempts++
	if err := pl.revertTo(p); err != nil {
		pl.metrics.revert("failure")
		pl.log.Error("REVERT FAILED; trying again", "previous", p.prev.doc.label, "attempt", p.attempts, "retry_in", revertRetry, "err", err)
		p.reverting = true
		p.timer = time.NewTimer(revertRetry)
		return
	}
	pl.metrics.revert("success")
	if p.attempts > 1 {
		pl.log.Warn("reverted to the previous rules", "attempts", p.attempts)
	}
	pl.endWait()
}

// revertTo puts p's previous rules back: every interface's kernel on the
// generation that holds them, then the document through the one path,
// with the plans it had, so that every rule keeps its slot and bucket.
func (pl *pipeline) revertTo(p *pendingConfirm) error {
	if pl.opts.revertFault != nil {
		if err := pl.opts.revertFault(); err != nil {
			return err
		}
	}
	var errs []error
	for _, a := range pl.kernel.all() {
		if _, err := a.Tables().Revert(); err != nil {
			errs = append(errs, fmt.Errorf("revert %s: %w", a.Iface, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	pl.capNS = 0
	pl.kernel.setReserved(nil)
	pl.kernel.restore(p.prevPlans)
	prev := *p.prev
	prev.doc.origin = FromRevert
	prev.plans, prev.against = p.prevPlans, p.prevPlans
	prev.confirmNS = 0
	return pl.applyDocument(prev.doc, &prev)
}

// settlePending is the start of an interface's fill: a change left waiting
// for its confirmation by a daemon that stopped goes back to its previous
// rules now (past its deadline the kernel has done so already). This
// daemon starts from the state directory, which never holds such a
// change: the previous rules.
func (pl *pipeline) settlePending(iface string, t *maps.Tables) {
	if pl.pending != nil {
		return // this daemon's own wait (a fresh attach while it runs)
	}
	p, ok, err := t.Pending()
	if err != nil {
		pl.log.Warn("cannot read the pending confirmation", "iface", iface, "err", err)
		return
	}
	if !ok {
		return
	}
	if _, err := t.Revert(); err != nil {
		pl.log.Error("cannot go back to the rules of before the unconfirmed change", "iface", iface, "err", err)
		return
	}
	pl.startReverts++
	if p.Expired {
		pl.log.Warn("the rules applied with --confirm were not confirmed before the daemon stopped; the kernel reverted them at the deadline", "iface", iface)
		return
	}
	pl.log.Warn("NOT CONFIRMED: the daemon stopped while rules waited for their confirmation; back to the previous rules", "iface", iface,
		"deadline_in", time.Duration(p.DeadlineNS-pl.opts.Monotonic()).Round(time.Millisecond))
}
