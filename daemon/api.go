//go:build linux

package daemon

import (
	"errors"
	"fmt"
	"time"

	"github.com/xlimit/xlimit/loader/pinstatus"
	"github.com/xlimit/xlimit/userspace/api"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
)

// apiFront is the daemon as the local API sees it (api.Daemon and
// api.Confirmer), on the API server's goroutines: it reads the rules in
// force and the pins, and hands documents and confirmations to the loop,
// waiting for their outcome until the loop ends.
type apiFront struct {
	bpffs    string
	kernel   *attached
	record   *rulesRecord
	feedback *xsignal.Feedback
	prep     *preparer
	src      *ruleSource // nil without a rules source
	fleet    func() *api.FleetStatus
	confirm  chan<- chan error // the loop confirms (daemon.go)
	loopDone <-chan struct{}
}

// errStopping answers a call the loop can no longer take.
var errStopping = errors.New("the daemon is stopping")

// Status implements api.Daemon.
func (f *apiFront) Status() (api.StatusReport, error) {
	rep := api.StatusReport{Interfaces: []api.IfaceStatus{}}
	for _, a := range f.kernel.all() {
		st, err := pinstatus.Read(f.bpffs, a.Iface)
		if err != nil {
			return rep, err
		}
		st.Preflight = preflightStatus(a) // answer.go
		rep.Interfaces = append(rep.Interfaces, st)
	}
	rep.Fleet = f.fleet()
	return rep, nil
}

// Rules implements api.Daemon.
func (f *apiFront) Rules() ([]byte, string) { return f.record.get() }

// RuleExists implements api.Daemon.
func (f *apiFront) RuleExists(name string) bool { return f.record.has(name) }

// Feedback implements api.Daemon: a service's own queueing delay and
// error counts for a rule steered by `signal: feedback`.
func (f *apiFront) Feedback(fb api.Feedback) error {
	delay := time.Duration(fb.QueueingDelayMS * float64(time.Millisecond))
	err := f.feedback.Put(fb.Rule, delay, fb.Errors, fb.Requests, time.Now())
	if errors.Is(err, xsignal.ErrNotSteered) {
		return fmt.Errorf("%w: %w", api.ErrRejected, err)
	}
	return err
}

// ApplyRules implements api.Daemon: PUT /v1/rules, refused while the
// rules come from a rules source (which would overwrite them at its next
// change anyway), else prepared off the loop and committed by it.
func (f *apiFront) ApplyRules(text []byte) error {
	_, err := f.submit(job{doc: document{origin: FromAPI, name: "api", label: "api", text: text}})
	return err
}

// ApplyRulesConfirm implements api.Confirmer: PUT /v1/rules?confirm=, as
// ApplyRules, with the deadline of its confirmation (confirm.go).
func (f *apiFront) ApplyRulesConfirm(text []byte, within time.Duration) (time.Time, error) {
	return f.submit(job{doc: document{origin: FromAPIPending, name: "api", label: "api (waiting for its confirmation)", text: text},
		confirm: within, revertAt: make(chan time.Time, 1)})
}

// submit hands j to the preparer and waits for its commit; a change that
// waits for its confirmation returns its deadline.
func (f *apiFront) submit(j job) (time.Time, error) {
	if err := f.src.refuseLocal(); err != nil {
		return time.Time{}, err
	}
	j.done = make(chan error, 1)
	f.prep.submit(j)
	select {
	case err := <-j.done:
		if err != nil {
			return time.Time{}, fmt.Errorf("%w: %w", api.ErrRejected, err)
		}
		if j.revertAt == nil {
			return time.Time{}, nil
		}
		return <-j.revertAt, nil
	case <-f.loopDone:
		return time.Time{}, errStopping
	}
}

// ConfirmRules implements api.Confirmer: the loop confirms.
func (f *apiFront) ConfirmRules() error {
	done := make(chan error, 1)
	select {
	case f.confirm <- done:
	case <-f.loopDone:
		return errStopping
	}
	select {
	case err := <-done:
		return err
	case <-f.loopDone:
		return errStopping
	}
}
