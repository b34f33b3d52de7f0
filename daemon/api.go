//go:build linux

package daemon

import (
	"errors"
	"fmt"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/pinstatus"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
)

// setRules records the rules text in force and where it came from.
func (d *daemon) setRules(text []byte, source string, s *Specs) {
	names := make(map[string]bool, len(s.Dataplane.Rules))
	for _, r := range s.Dataplane.Rules {
		names[r.Name] = true
	}
	d.rulesMu.Lock()
	d.rulesText, d.rulesSource, d.ruleNames = text, source, names
	d.rulesMu.Unlock()
}

// setRulesSource renames the source of the rules in force.
func (d *daemon) setRulesSource(source string) {
	d.rulesMu.Lock()
	d.rulesSource = source
	d.rulesMu.Unlock()
}

// Status implements api.Daemon.
func (d *daemon) Status() (api.StatusReport, error) {
	rep := api.StatusReport{Interfaces: []api.IfaceStatus{}}
	d.mu.Lock()
	attach := d.attach
	d.mu.Unlock()
	for _, a := range attach {
		st, err := pinstatus.Read(d.opts.BPFFS, a.Iface)
		if err != nil {
			return rep, err
		}
		rep.Interfaces = append(rep.Interfaces, st)
	}
	rep.Fleet = d.fleet.status()
	return rep, nil
}

// Rules implements api.Daemon.
func (d *daemon) Rules() ([]byte, string) {
	d.rulesMu.Lock()
	defer d.rulesMu.Unlock()
	return d.rulesText, d.rulesSource
}

// RuleExists implements api.Daemon.
func (d *daemon) RuleExists(name string) bool {
	d.rulesMu.Lock()
	defer d.rulesMu.Unlock()
	return d.ruleNames[name]
}

// Feedback implements api.Daemon: a service's own queueing delay and
// error counts for a rule steered by `signal: feedback`.
func (d *daemon) Feedback(f api.Feedback) error {
	delay := time.Duration(f.QueueingDelayMS * float64(time.Millisecond))
	err := d.feedback.Put(f.Rule, delay, f.Errors, f.Requests, time.Now())
	if errors.Is(err, xsignal.ErrNotSteered) {
		return fmt.Errorf("%w: %w", api.ErrRejected, err)
	}
	return err
}

// ApplyRules implements api.Daemon: PUT /v1/rules, refused while the
// rules come from a rules source (which would overwrite them at its next
// change anyway), else prepared off the loop and committed by it.
func (d *daemon) ApplyRules(text []byte) error {
	if err := d.src.refuseLocal(); err != nil {
		return err
	}
	j := job{doc: document{origin: FromAPI, name: "api", label: "api", text: text}, done: make(chan error, 1)}
	d.prep.submit(j)
	select {
	case err := <-j.done:
		if err != nil {
			return fmt.Errorf("%w: %w", api.ErrRejected, err)
		}
		return nil
	case <-d.loopDone:
		return errors.New("the daemon is stopping")
	}
}
