//go:build linux

package daemon

import (
	"errors"
	"fmt"
	"time"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/control"
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

// pendingConfirm is the wait for a confirmation, on the loop goroutine.
type pendingConfirm struct {
	// prev is what the revert applies: the document in force before the
	// first change of the wait, as it was prepared, and prevPlans as it
	// was compiled for each interface: what the generation the kernel
	// returns to holds.
	prev      *prepared
	prevPlans map[string]*dataplane.Plan
	doc       document // what waits for its confirmation
	deadline  time.Time
	// deadlineNS is the kernel's deadline (CLOCK_MONOTONIC).
	deadlineNS uint64
	timer      *time.Timer
	// reverting: the deadline has passed and the revert failed; timer is
	// the next attempt's.
	reverting bool
	attempts  int
}

// ApplyRulesConfirm implements api.Confirmer.
func (d *daemon) ApplyRulesConfirm(text []byte, within time.Duration) (time.Time, error) {
	if err := d.src.refuseLocal(); err != nil {
		return time.Time{}, err
	}
	j := job{doc: document{origin: FromAPIPending, name: "api", label: "api (waiting for its confirmation)", text: text},
		done: make(chan error, 1), confirm: within, revertAt: make(chan time.Time, 1)}
	d.prep.submit(j)
	select {
	case err := <-j.done:
		if err != nil {
			return time.Time{}, fmt.Errorf("%w: %w", api.ErrRejected, err)
		}
		return <-j.revertAt, nil
	case <-d.loopDone:
		return time.Time{}, errors.New("the daemon is stopping")
	}
}

// ConfirmRules implements api.Confirmer: the loop confirms.
func (d *daemon) ConfirmRules() error {
	done := make(chan error, 1)
	select {
	case d.confirmCh <- done:
	case <-d.loopDone:
		return errors.New("the daemon is stopping")
	}
	select {
	case err := <-done:
		return err
	case <-d.loopDone:
		return errors.New("the daemon is stopping")
	}
}

// confirmC is the channel of the deadline, or of the next attempt of a
// failed revert; nil (never ready) when nothing waits.
func (d *daemon) confirmC() <-chan time.Time {
	if d.pending == nil {
		return nil
	}
	return d.pending.timer.C
}

// beforeCommit readies a job for its commit, on the loop goroutine: a
// change that waits for its confirmation gets its deadline now, for the
// kernel, and the control loop's rates written meanwhile expire by then
// (limitCap).
func (d *daemon) beforeCommit(r *prepResult) {
	if r.doc.origin != FromAPIPending || r.p == nil {
		return
	}
	r.p.confirmNS = d.opts.Monotonic() + uint64(r.confirm)
	r.p.confirmAt = time.Now().Add(r.confirm)
	d.capNS = r.p.confirmNS
}

// afterCommit follows the wait for a confirmation through a document
// just applied; was is the document in force before it and wasPlans its
// plans.
func (d *daemon) afterCommit(p *prepared, was *prepared, wasPlans map[string]*dataplane.Plan) {
	doc := p.doc
	switch {
	case doc.origin == FromAPIPending:
		if d.pending == nil || d.pending.reverting {
			// The way back is the rules in force before this change. A
			// failed revert still retrying has put them back in the
			// kernel already (and the plans are theirs).
			if d.pending != nil {
				d.pending.timer.Stop()
				was, wasPlans = d.pending.prev, d.pending.prevPlans
			}
			d.pending = &pendingConfirm{prev: was, prevPlans: wasPlans}
		} else {
			// A second change: the way back stays the first's.
			d.pending.timer.Stop()
		}
		d.pending.doc = doc
		d.pending.deadline, d.pending.deadlineNS = p.confirmAt, p.confirmNS
		d.pending.timer = time.NewTimer(time.Until(p.confirmAt))
		d.setReserved(d.pending.prevPlans)
		d.log.Warn("rules applied WAITING FOR A CONFIRMATION ('xlimit confirm'); without one the previous rules return", "deadline", d.pending.deadline.Format(time.RFC3339), "previous", d.pending.prev.doc.label)
	case d.pending != nil && doc.origin != FromRevert:
		d.pending.timer.Stop()
		if d.pending.reverting {
			d.log.Info("a document replaced the rules while the revert was retried; nothing to revert any more", "origin", doc.origin, "source", doc.label)
		} else {
			d.log.Info("the rules waiting for a confirmation are replaced; nothing to confirm any more", "origin", doc.origin, "source", doc.label)
		}
		d.endWait()
	}
}

// endWait forgets the wait for a confirmation.
func (d *daemon) endWait() {
	d.pending = nil
	d.capNS = 0
	d.setReserved(nil)
}

// confirm is `xlimit confirm`, on the loop goroutine: the kernel first
// (each interface's change stays), then the state directory, then the
// answer. A crash in between leaves the kernel's rules and the state
// directory's different only as a restart resolves them: it loads the
// state directory's.
func (d *daemon) confirm() error {
	p := d.pending
	if p == nil {
		return fmt.Errorf("%w: no rules are waiting for a confirmation", api.ErrRejected)
	}
	if p.reverting || d.opts.Monotonic() >= p.deadlineNS {
		if !p.reverting {
			d.revert()
		}
		return fmt.Errorf("%w: too late: the deadline passed at %s and the previous rules are back", api.ErrRejected, p.deadline.Format(time.RFC3339))
	}
	var errs []error
	for _, a := range d.attach {
		if err := a.Tables().Confirm(); errors.Is(err, maps.ErrConfirmExpired) {
			d.revert()
			return fmt.Errorf("%w: too late: the deadline passed at %s and the previous rules are back", api.ErrRejected, p.deadline.Format(time.RFC3339))
		} else if err != nil {
			errs = append(errs, fmt.Errorf("confirm on %s: %w", a.Iface, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		// The deadline stays: the kernel reverts then.
		d.log.Error("cannot confirm the rules in the kernel; they will be reverted at the deadline", "err", err)
		return err
	}
	p.timer.Stop()
	d.endWait()
	// From now on they are the API's rules, kept for a restart.
	doc := document{origin: FromAPI, name: p.doc.name, label: "api", text: p.doc.text}
	d.persist(doc)
	d.inForce = doc
	if d.inForcePrep != nil {
		d.inForcePrep.doc = doc
	}
	d.setRulesSource("api")
	d.log.Info("rules confirmed; kept for a restart", "in_force_since", time.Until(p.deadline).Round(time.Second))
	return nil
}

// revert is the deadline without a confirmation (or the next attempt of a
// revert that failed): the previous rules return, in the kernel at once,
// then through the one path. It is counted once it is over, and retried
// while it fails.
func (d *daemon) revert() {
	p := d.pending
	p.timer.Stop()
	if !p.reverting {
		d.log.Error("NO CONFIRMATION in time: reverting to the previous rules", "previous", p.prev.doc.label, "deadline", p.deadline.Format(time.RFC3339))
	}
	p.attempts++
	if err := d.revertTo(p); err != nil {
		d.metrics.revert("failure")
		d.log.Error("REVERT FAILED; trying again", "previous", p.prev.doc.label, "attempt", p.attempts, "retry_in", revertRetry, "err", err)
		p.reverting = true
		p.timer = time.NewTimer(revertRetry)
		return
	}
	d.metrics.revert("success")
	if p.attempts > 1 {
		d.log.Warn("reverted to the previous rules", "attempts", p.attempts)
	}
	d.endWait()
}

// revertTo puts p's previous rules back: every interface's kernel on the
// generation that holds them, then the document through the one path,
// with the plans it had, so that every rule keeps its slot and bucket.
func (d *daemon) revertTo(p *pendingConfirm) error {
	if d.opts.revertFault != nil {
		if err := d.opts.revertFault(); err != nil {
			return err
		}
	}
	var errs []error
	for _, a := range d.attach {
		if _, err := a.Tables().Revert(); err != nil {
			errs = append(errs, fmt.Errorf("revert %s: %w", a.Iface, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	d.capNS = 0
	d.setReserved(nil)
	d.mu.Lock()
	for iface, pl := range p.prevPlans {
		if pl != nil {
			d.plans[iface] = pl
		}
	}
	d.mu.Unlock()
	prev := *p.prev
	prev.doc.origin = FromRevert
	prev.plans, prev.against = p.prevPlans, p.prevPlans
	prev.confirmNS = 0
	return d.applyDocument(prev.doc, &prev)
}

// settlePending is the start of an interface's fill: a change left waiting
// for its confirmation by a daemon that stopped goes back to its previous
// rules now (past its deadline the kernel has done so already). This
// daemon starts from the state directory, which never holds such a
// change: the previous rules.
func (d *daemon) settlePending(iface string, t *maps.Tables) {
	if d.pending != nil {
		return // this daemon's own wait (a fresh attach while it runs)
	}
	p, ok, err := t.Pending()
	if err != nil {
		d.log.Warn("cannot read the pending confirmation", "iface", iface, "err", err)
		return
	}
	if !ok {
		return
	}
	if _, err := t.Revert(); err != nil {
		d.log.Error("cannot go back to the rules of before the unconfirmed change", "iface", iface, "err", err)
		return
	}
	d.startReverts++
	if p.Expired {
		d.log.Warn("the rules applied with --confirm were not confirmed before the daemon stopped; the kernel reverted them at the deadline", "iface", iface)
		return
	}
	d.log.Warn("NOT CONFIRMED: the daemon stopped while rules waited for their confirmation; back to the previous rules", "iface", iface,
		"deadline_in", time.Duration(p.DeadlineNS-d.opts.Monotonic()).Round(time.Millisecond))
}

// setReserved keeps the plans a pending change returns to: documents
// compile against the plans in force with those rules' slots kept too
// (base), so that no rule of the change takes a slot, and the bucket, of
// a rule the revert brings back.
func (d *daemon) setReserved(plans map[string]*dataplane.Plan) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reserved = plans
	d.bases = nil
}

// baseLocked is what documents compile against on iface: the plan in
// force, with the rules a pending change returns to kept in their slots
// when they are not in force. Called with d.mu held.
func (d *daemon) baseLocked(iface string) *dataplane.Plan {
	cur, keep := d.plans[iface], d.reserved[iface]
	if cur == nil || keep == nil || cur == keep {
		return cur
	}
	if b, ok := d.bases[iface]; ok && b.of == cur {
		return b.plan
	}
	merged := *cur
	for s := range keep.Rules {
		r := keep.Rules[s]
		if r.Active() && !merged.Rules[s].Active() && cur.Slot(r.Name) < 0 {
			merged.Rules[s] = r
		}
	}
	if d.bases == nil {
		d.bases = map[string]basePlan{}
	}
	d.bases[iface] = basePlan{of: cur, plan: &merged}
	return &merged
}

// basePlan is a merged plan of baseLocked, for the plan in force it was
// made of.
type basePlan struct{ of, plan *dataplane.Plan }

// limitCap is the latest deadline the control loop's rates may have: a
// pending change's, so that a daemon gone in its window leaves none of
// them in force past it; 0: none.
func (d *daemon) limitCap() uint64 { return d.capNS }

// cappedKernel is a control loop target whose rates expire by limitCap.
type cappedKernel struct {
	control.Kernel
	d *daemon
}

// SetLimit implements control.Kernel.
func (k cappedKernel) SetLimit(slot int, l dataplane.Limit) error {
	if c := k.d.limitCap(); c != 0 && l.DeadlineNS > c {
		l.DeadlineNS = c
	}
	return k.Kernel.SetLimit(slot, l)
}
