//go:build linux

package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/config"
)

// applyReq carries a PUT /v1/rules to the loop goroutine.
type applyReq struct {
	text []byte
	done chan error
}

// setRules records the rules text in force and where it came from.
func (d *daemon) setRules(text []byte, source string, cfg *config.Config) {
	names := make(map[string]bool, len(cfg.Rules))
	for i := range cfg.Rules {
		names[cfg.Rules[i].Name] = true
	}
	d.rulesMu.Lock()
	d.rulesText, d.rulesSource, d.ruleNames = text, source, names
	d.rulesMu.Unlock()
}

// Status implements api.Daemon.
func (d *daemon) Status() (api.StatusReport, error) {
	rep := api.StatusReport{Interfaces: []api.IfaceStatus{}}
	d.mu.Lock()
	attach := d.attach
	d.mu.Unlock()
	for _, a := range attach {
		st, err := readStatus(d.flags.bpffs, a.Iface)
		if err != nil {
			return rep, err
		}
		rep.Interfaces = append(rep.Interfaces, st)
	}
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
	return d.feedback.put(f, time.Now())
}

// ApplyRules implements api.Daemon: the loop goroutine applies.
func (d *daemon) ApplyRules(text []byte) error {
	req := applyReq{text: text, done: make(chan error, 1)}
	select {
	case d.applyCh <- req:
	case <-d.loopDone:
		return errors.New("the daemon is stopping")
	}
	return <-req.done
}

// applyAPI runs on the loop goroutine.
func (d *daemon) applyAPI(text []byte) error {
	cfg, err := config.Parse("api", text)
	if err != nil {
		return err
	}
	if err := d.apply(cfg); err != nil {
		d.metrics.reload("failure")
		d.log.Error("rules from the API rejected; the running rules stay in force", "err", err)
		return fmt.Errorf("%w: %w", api.ErrRejected, err)
	}
	if err := api.SaveRules(d.flags.stateDir, text); err != nil {
		d.log.Warn("rules from the API are in force but not kept for a restart", "err", err)
	}
	d.saveLastGood(text)
	d.setRules(text, "api", cfg)
	d.metrics.reload("success")
	d.warn(cfg)
	d.log.Info("reloaded from the API", "rules", len(cfg.Rules), "at", time.Now().Format(time.RFC3339))
	return nil
}
