//go:build linux

package daemon

import (
	"errors"
	"fmt"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
)

// Rules applied with a confirmation deadline (`xlimit apply --confirm`,
// PUT /v1/rules?confirm=): as with a router's "commit confirmed", the
// daemon goes back to the rules in force before unless `xlimit confirm`
// comes in time. A document waiting for its confirmation is not persisted:
// a restart meanwhile starts from the previous rules. Any other document
// applied meanwhile (the file, a plain PUT) ends the wait: it is the rules
// in force from then on.

// pendingConfirm is the wait for a confirmation, on the loop goroutine.
type pendingConfirm struct {
	prev     document // what the revert applies
	doc      document // what waits for its confirmation
	deadline time.Time
	timer    *time.Timer
}

// ApplyRulesConfirm implements api.Confirmer.
func (d *daemon) ApplyRulesConfirm(text []byte, within time.Duration) (time.Time, error) {
	if d.src != nil {
		return time.Time{}, fmt.Errorf("%w: the rules come from the rules source %s; change them there ('xlimit rules push')", api.ErrRejected, d.src.opts)
	}
	j := job{doc: document{origin: FromAPIPending, name: "api", label: "api (waiting for its confirmation)", text: text}, done: make(chan error, 1), confirm: within}
	d.prep.submit(j)
	select {
	case err := <-j.done:
		if err != nil {
			return time.Time{}, fmt.Errorf("%w: %w", api.ErrRejected, err)
		}
		return time.Now().Add(within), nil
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

// confirmC is the channel of the deadline; nil (never ready) when nothing
// waits.
func (d *daemon) confirmC() <-chan time.Time {
	if d.pending == nil {
		return nil
	}
	return d.pending.timer.C
}

// afterCommit follows the wait for a confirmation through a document
// just applied; prev is the document in force before it.
func (d *daemon) afterCommit(doc document, prev document, within time.Duration) {
	switch {
	case doc.origin == FromAPIPending:
		if d.pending == nil {
			d.pending = &pendingConfirm{prev: prev}
		} else {
			d.pending.timer.Stop()
		}
		d.pending.doc = doc
		d.pending.deadline = time.Now().Add(within)
		d.pending.timer = time.NewTimer(within)
		d.log.Warn("rules applied WAITING FOR A CONFIRMATION ('xlimit confirm'); without one the previous rules return", "deadline", d.pending.deadline.Format(time.RFC3339), "previous", d.pending.prev.label)
	case d.pending != nil && doc.origin != FromRevert:
		d.pending.timer.Stop()
		d.log.Info("the rules waiting for a confirmation are replaced; nothing to confirm any more", "origin", doc.origin, "source", doc.label)
		d.pending = nil
	}
}

// confirm is `xlimit confirm`, on the loop goroutine.
func (d *daemon) confirm() error {
	p := d.pending
	if p == nil {
		return fmt.Errorf("%w: no rules are waiting for a confirmation", api.ErrRejected)
	}
	p.timer.Stop()
	d.pending = nil
	// From now on they are the API's rules, kept for a restart.
	d.persist(document{origin: FromAPI, name: p.doc.name, label: "api", text: p.doc.text})
	d.setRulesSource("api")
	d.log.Info("rules confirmed; kept for a restart", "in_force_since", time.Until(p.deadline).Round(time.Second))
	return nil
}

// revert is the deadline without a confirmation: the previous rules
// return through the one path.
func (d *daemon) revert() {
	p := d.pending
	d.pending = nil
	d.metrics.revert()
	d.log.Error("NO CONFIRMATION in time: reverting to the previous rules", "previous", p.prev.label, "deadline", p.deadline.Format(time.RFC3339))
	prev := p.prev
	prev.origin = FromRevert
	d.prep.submit(job{doc: prev})
}
