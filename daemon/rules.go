//go:build linux

package daemon

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/control"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/durable"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
)

// prepare parses, validates and translates a document, and adds the
// local rules file's guard (guard.go); it touches nothing and runs on any
// goroutine.
func (pl *pipeline) prepare(doc document) (*prepared, error) {
	cfg, err := config.Parse(doc.name, doc.text)
	if err != nil {
		return nil, err
	}
	specs := Translate(cfg)
	if g := pl.guard.Load(); g != nil {
		guardSpec(specs.Dataplane, g.allow, g.mgmt)
	}
	return &prepared{doc: doc, cfg: cfg, specs: specs}, nil
}

// applyDocument is the one path of a rules document, at start and while the
// daemon runs, on the loop goroutine: prepare (unless the caller already
// has), commit, count, log. All or nothing: a document that does not
// validate or compile leaves the running rules in force.
func (pl *pipeline) applyDocument(doc document, p *prepared) error {
	if doc.origin == FromSource && pl.specs != nil {
		if cur, _ := pl.record.get(); bytes.Equal(cur, doc.text) {
			// Nothing to apply: the document in force is now the source's.
			pl.persist(doc)
			pl.record.set(doc.text, doc.label, pl.specs)
			pl.log.Info("the rules source's document is the one in force", "version", doc.src.Version)
			return nil
		}
	}
	var err error
	if p == nil {
		p, err = pl.prepare(doc)
	}
	if err == nil {
		err = pl.commit(p)
	}
	if err != nil {
		pl.rejected(doc, err)
		return err
	}
	pl.metrics.reload("success")
	pl.log.Info(origins[doc.origin].applied, "origin", doc.origin, "source", doc.label, "rules", len(p.cfg.Rules))
	return nil
}

// rejected counts and logs a document that did not validate or compile.
func (pl *pipeline) rejected(doc document, err error) {
	pl.metrics.reload("failure")
	pl.log.Error(origins[doc.origin].rejected, "origin", doc.origin, "source", doc.label, "err", err)
}

// commit compiles a prepared document for every interface, writes the
// maps, the queues and the control loop, then persists the document
// according to its origin and records it as the rules in force.
func (pl *pipeline) commit(p *prepared) error {
	if err := pl.apply(p); err != nil {
		return err
	}
	pl.persist(p.doc)
	pl.inForce, pl.inForcePrep = p.doc, p
	switch p.doc.origin { // the rules file's guard, over the documents from elsewhere (guard.go)
	case FromFile, FromWatch, FromSIGHUP, FromBootstrap:
		pl.guard.Store(guardOf(p.cfg))
		saveGuard(pl.opts.StateDir, p.doc.text, pl.log) // guard.go
	}
	pl.record.set(p.doc.text, p.doc.label, p.specs)
	for _, w := range p.cfg.Warnings {
		pl.log.Warn("rules file", "warning", w.Error())
	}
	for _, w := range p.specs.NotEnforced {
		pl.log.Warn("not enforced by this version", "what", w)
	}
	warnXDPTx(pl.log, pl.kernel.all(), p.specs.Dataplane) // answer.go
	return nil
}

// apply compiles p for every interface first (unless prepareDoc did
// against the plans still in force) and writes the maps only when every
// compilation succeeded.
func (pl *pipeline) apply(pd *prepared) error {
	s := pd.specs
	// Before anything is written: where the document's probes would go.
	if err := (xsignal.ProbePolicy{Allow: pl.opts.ProbeAllow}).Check(s.Probes); err != nil {
		return err
	}
	if err := pl.queues.plan(pl.kernel.names(), s.Queues); err != nil {
		return err
	}
	attach := pl.kernel.all()
	plans := make(map[string]*dataplane.Plan, len(attach))
	for _, a := range attach {
		prev := pl.kernel.base(a.Iface)
		if p, ok := pd.plans[a.Iface]; ok && pd.against[a.Iface] == prev {
			plans[a.Iface] = p
			continue
		}
		p, err := compileAgainst(a.Iface, s.Dataplane, prev) // plans.go
		if err != nil {
			return err
		}
		plans[a.Iface] = p
	}
	for _, a := range attach {
		// Never a silent fallback: a kernel that cannot check the
		// cookies' ACKs refuses the rules that would send them.
		if plans[a.Iface].HasCookies() && a.CookieErr != nil {
			return fmt.Errorf("apply rules to %s: syn_cookies: %w", a.Iface, a.CookieErr)
		}
	}
	if err := checkKernel(attach, plans); err != nil { // measures.go: response_time
		return err
	}
	for _, a := range attach {
		var err error
		if pd.confirmNS != 0 {
			// The kernel keeps the deadline: the rules in force now come
			// back then with or without a daemon (confirm.go).
			err = a.Tables().ApplyConfirm(plans[a.Iface], pd.confirmNS)
		} else {
			err = a.Tables().Apply(plans[a.Iface])
		}
		if err != nil {
			return fmt.Errorf("apply rules to %s: %w", a.Iface, err)
		}
		pl.kernel.setPlan(a.Iface, plans[a.Iface])
	}
	pl.queues.apply(pl.kernel.names(), s.Queues)
	pl.specs = s
	pl.fleet.setRules(s.Fleet)
	pl.feedback.Configure(s.Feedback)
	if err := pl.probes.Configure(s.Probes); err != nil {
		return err
	}
	if s.System != nil && pl.hostCPU != nil {
		pl.loop.SetSystem(s.System, pl.hostCPU)
	} else {
		pl.loop.SetSystem(nil, nil)
	}
	pl.signals.rules = s.Signals
	if err := pl.loop.Configure(s.Control, pl.targets(s)); err != nil {
		return fmt.Errorf("configure the control loop: %w", err)
	}
	// Put the steered rates in force now, not a period later: a new
	// warm-up rule must not run at its full static rate meanwhile.
	pl.tick(pl.loop.Tick())
	return nil
}

// persist keeps what a restart needs of an applied document.
func (pl *pipeline) persist(doc document) {
	switch doc.origin {
	case FromLastGood, FromSnapshot:
		// Already the state directory's.
	case FromAPIPending, FromRevert:
		// Not until confirmed (confirm.go); the previous rules are
		// still the state directory's.
	case FromFile, FromAPIState, FromBootstrap:
		pl.saveLastGood(doc.text)
	case FromWatch, FromSIGHUP:
		pl.saveLastGood(doc.text)
		if err := api.ForgetRules(pl.opts.StateDir); err != nil {
			pl.log.Warn("cannot forget the rules put through the API", "err", err)
		}
	case FromAPI:
		if err := api.SaveRules(pl.opts.StateDir, doc.text); err != nil {
			pl.log.Warn("rules from the API are in force but not kept for a restart", "err", err)
		}
		pl.saveLastGood(doc.text)
	case FromSource:
		pl.saveLastGood(doc.text)
		pl.src.committed(doc.src)
	}
}

func (pl *pipeline) lastGoodPath() string {
	return filepath.Join(pl.opts.StateDir, "last-good.yaml")
}

func (pl *pipeline) saveLastGood(data []byte) {
	if err := os.MkdirAll(pl.opts.StateDir, 0o700); err != nil {
		pl.log.Warn("cannot keep the last good rules", "err", err)
		return
	}
	if err := durable.WriteFile(pl.lastGoodPath(), data, 0o600); err != nil {
		pl.log.Warn("cannot keep the last good rules", "err", err)
	}
}

// targets tells the loop where each steered rule lives: its slot and epoch
// in every interface's maps.
func (pl *pipeline) targets(s *Specs) map[string][]control.Target {
	targets := map[string][]control.Target{}
	pl.kernel.with(func(attach []*loader.Attachment, plans map[string]*dataplane.Plan) {
		for _, r := range s.Control {
			for _, a := range attach {
				p := plans[a.Iface]
				if slot := p.Slot(r.Name); slot >= 0 {
					targets[r.Name] = append(targets[r.Name], control.Target{Kernel: cappedKernel{a.Tables(), pl}, Slot: slot, Epoch: p.Rules[slot].Epoch})
				}
			}
		}
	})
	return targets
}

// limitCap is the latest deadline the control loop's rates may have: a
// pending change's (confirm.go), so that a daemon gone in its window
// leaves none of them in force past it; 0: none.
func (pl *pipeline) limitCap() uint64 { return pl.capNS }

// cappedKernel is a control loop target whose rates expire by limitCap.
type cappedKernel struct {
	control.Kernel
	pl *pipeline
}

// SetLimit implements control.Kernel.
func (k cappedKernel) SetLimit(slot int, l dataplane.Limit) error {
	if c := k.pl.limitCap(); c != 0 && l.DeadlineNS > c {
		l.DeadlineNS = c
	}
	return k.Kernel.SetLimit(slot, l)
}
