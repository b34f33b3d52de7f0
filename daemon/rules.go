//go:build linux

package daemon

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/control"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/durable"
	"github.com/xlimit/xlimit/userspace/rulesource"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
)

// prepare parses, validates and translates a document, and adds the
// local rules file's guard (guard.go); it touches nothing and runs on any
// goroutine.
func (d *daemon) prepare(doc document) (*prepared, error) {
	cfg, err := config.Parse(doc.name, doc.text)
	if err != nil {
		return nil, err
	}
	specs := Translate(cfg)
	if g := d.guard.Load(); g != nil {
		guardSpec(specs.Dataplane, g.allow, g.mgmt)
	}
	return &prepared{doc: doc, cfg: cfg, specs: specs}, nil
}

// applyDocument is the one path of a rules document, at start and while the
// daemon runs, on the loop goroutine: prepare (unless the caller already
// has), commit, count, log. All or nothing: a document that does not
// validate or compile leaves the running rules in force.
func (d *daemon) applyDocument(doc document, p *prepared) error {
	if doc.origin == FromSource && d.specs != nil {
		if cur, _ := d.Rules(); bytes.Equal(cur, doc.text) {
			// Nothing to apply: the document in force is now the source's.
			d.persist(doc)
			d.setRules(doc.text, doc.label, d.specs)
			d.log.Info("the rules source's document is the one in force", "version", doc.src.Version)
			return nil
		}
	}
	var err error
	if p == nil {
		p, err = d.prepare(doc)
	}
	if err == nil {
		err = d.commit(p)
	}
	if err != nil {
		d.rejected(doc, err)
		return err
	}
	d.metrics.reload("success")
	d.log.Info(origins[doc.origin].applied, "origin", doc.origin, "source", doc.label, "rules", len(p.cfg.Rules))
	return nil
}

// rejected counts and logs a document that did not validate or compile.
func (d *daemon) rejected(doc document, err error) {
	d.metrics.reload("failure")
	d.log.Error(origins[doc.origin].rejected, "origin", doc.origin, "source", doc.label, "err", err)
}

// commit compiles a prepared document for every interface, writes the
// maps, the queues and the control loop, then persists the document
// according to its origin and records it as the rules in force.
func (d *daemon) commit(p *prepared) error {
	if err := d.apply(p); err != nil {
		return err
	}
	d.persist(p.doc)
	d.inForce, d.inForcePrep = p.doc, p
	switch p.doc.origin { // the rules file's guard, over the documents from elsewhere (guard.go)
	case FromFile, FromWatch, FromSIGHUP, FromBootstrap:
		d.guard.Store(guardOf(p.cfg))
	}
	d.setRules(p.doc.text, p.doc.label, p.specs)
	for _, w := range p.cfg.Warnings {
		d.log.Warn("rules file", "warning", w.Error())
	}
	for _, w := range p.specs.NotEnforced {
		d.log.Warn("not enforced by this version", "what", w)
	}
	warnXDPTx(d.log, d.ifaceNames(), p.specs.Dataplane) // answer.go
	return nil
}

// apply compiles p for every interface first (unless prepareDoc did
// against the plans still in force) and writes the maps only when every
// compilation succeeded.
func (d *daemon) apply(pd *prepared) error {
	s := pd.specs
	// Before anything is written: where the document's probes would go.
	if err := (xsignal.ProbePolicy{Allow: d.opts.ProbeAllow}).Check(s.Probes); err != nil {
		return err
	}
	if err := d.queues.plan(d.ifaceNames(), s.Queues); err != nil {
		return err
	}
	plans := make(map[string]*dataplane.Plan, len(d.attach))
	for _, a := range d.attach {
		d.mu.Lock()
		prev := d.baseLocked(a.Iface)
		d.mu.Unlock()
		if p, ok := pd.plans[a.Iface]; ok && pd.against[a.Iface] == prev {
			plans[a.Iface] = p
			continue
		}
		p, err := compileAgainst(a.Iface, s.Dataplane, prev) // prepare.go
		if err != nil {
			return err
		}
		plans[a.Iface] = p
	}
	for _, a := range d.attach {
		// Never a silent fallback: a kernel that cannot check the
		// cookies' ACKs refuses the rules that would send them.
		if plans[a.Iface].HasCookies() && a.CookieErr != nil {
			return fmt.Errorf("apply rules to %s: syn_cookies: %w", a.Iface, a.CookieErr)
		}
	}
	var kerr error
	d.withAttached(func(attach []*loader.Attachment, _ map[string]*dataplane.Plan) { kerr = checkKernel(attach, plans) })
	if err := kerr; err != nil { // measures.go: response_time
		return err
	}
	for _, a := range d.attach {
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
		d.mu.Lock()
		d.plans[a.Iface] = plans[a.Iface]
		d.mu.Unlock()
	}
	d.queues.apply(d.ifaceNames(), s.Queues)
	d.specs = s
	d.fleet.setRules(s.Fleet)
	d.feedback.Configure(s.Feedback)
	if err := d.probes.Configure(s.Probes); err != nil {
		return err
	}
	if s.System != nil && d.hostCPU != nil {
		d.loop.SetSystem(s.System, d.hostCPU)
	} else {
		d.loop.SetSystem(nil, nil)
	}
	d.signals.rules = s.Signals
	if err := d.loop.Configure(s.Control, d.targets(s)); err != nil {
		return fmt.Errorf("configure the control loop: %w", err)
	}
	// Put the steered rates in force now, not a period later: a new
	// warm-up rule must not run at its full static rate meanwhile.
	d.afterTick(d.loop.Tick())
	return nil
}

// persist keeps what a restart needs of an applied document.
func (d *daemon) persist(doc document) {
	switch doc.origin {
	case FromLastGood, FromSnapshot:
		// Already the state directory's.
	case FromAPIPending, FromRevert:
		// Not until confirmed (confirm.go); the previous rules are
		// still the state directory's.
	case FromFile, FromAPIState, FromBootstrap:
		d.saveLastGood(doc.text)
	case FromWatch, FromSIGHUP:
		d.saveLastGood(doc.text)
		if err := api.ForgetRules(d.opts.StateDir); err != nil {
			d.log.Warn("cannot forget the rules put through the API", "err", err)
		}
	case FromAPI:
		if err := api.SaveRules(d.opts.StateDir, doc.text); err != nil {
			d.log.Warn("rules from the API are in force but not kept for a restart", "err", err)
		}
		d.saveLastGood(doc.text)
	case FromSource:
		d.saveLastGood(doc.text)
		d.src.committed(doc.src)
	}
}

func (d *daemon) lastGoodPath() string {
	return filepath.Join(d.opts.StateDir, "last-good.yaml")
}

func (d *daemon) saveLastGood(data []byte) {
	if err := os.MkdirAll(d.opts.StateDir, 0o700); err != nil {
		d.log.Warn("cannot keep the last good rules", "err", err)
		return
	}
	if err := durable.WriteFile(d.lastGoodPath(), data, 0o600); err != nil {
		d.log.Warn("cannot keep the last good rules", "err", err)
	}
}

// reloadFile re-reads the rules file (a change or SIGHUP) and hands it to
// the preparer.
func (d *daemon) reloadFile(origin Origin) {
	doc := document{origin: origin, name: d.opts.Config, label: d.opts.Config}
	data, err := config.ReadFile(d.opts.Config)
	if err != nil {
		d.rejected(doc, err)
		return
	}
	doc.text = data
	d.prep.submit(job{doc: doc})
}

// onHUP re-reads the rules: the file, or the store at once.
func (d *daemon) onHUP() {
	if d.src.refresh() {
		d.log.Info("SIGHUP: reading the rules source now")
		return
	}
	d.reloadFile(FromSIGHUP)
}

// applySource hands a document from the store to the preparer.
func (d *daemon) applySource(doc rulesource.Document) {
	if cur, _ := d.Rules(); bytes.Equal(cur, doc.Text) {
		// The document in force: applyDocument records it as the
		// source's without preparing it again.
		d.finish(prepResult{job: job{doc: d.src.document(doc)}})
		return
	}
	d.prep.submit(job{doc: d.src.document(doc)})
}

// startupRules returns the document to start with. Without a rules source:
// the rules put through the API when newer than the rules file, else the
// rules file, else the last good rules (a restart must never leave the
// host with fewer rules than it had). With one: the store's document, else
// the local snapshot, else the --config file.
func (d *daemon) startupRules(ctx context.Context) (*prepared, error) {
	if d.opts.RulesSource != "" {
		src, err := openRuleSource(d.opts.RulesSource, d.opts.RulesSourcePasswordFile, d.opts.StateDir, d.log) // rulesource.go
		if err != nil {
			return nil, err
		}
		d.src = src
		var bootstrap func() (*prepared, error)
		if d.opts.Config != "" {
			bootstrap = func() (*prepared, error) { return d.prepareFile(FromBootstrap) }
		}
		return src.startup(ctx, d.prepare, d.lastGoodPath(), bootstrap)
	}
	if text, saved, err := api.SavedRules(d.opts.StateDir, d.opts.Config); err != nil {
		d.log.Warn("cannot read the rules put through the API", "err", err)
	} else if text != nil {
		if p, err := d.prepare(document{origin: FromAPIState, name: "api", label: "api", text: text}); err == nil {
			d.log.Warn("RUNNING THE RULES PUT THROUGH THE API, newer than the rules file", "saved", saved, "file", d.opts.Config)
			return p, nil
		}
	}
	p, err := d.prepareFile(FromFile)
	if err == nil {
		return p, nil
	}
	d.log.Error("rules file unusable; trying the last good rules", "file", d.opts.Config, "err", err)
	last, lerr := config.ReadFile(d.lastGoodPath())
	if lerr != nil {
		return nil, fmt.Errorf("load rules: %w (and no last good rules: %v)", err, lerr)
	}
	p, lerr = d.prepare(document{origin: FromLastGood, name: d.lastGoodPath(), label: d.lastGoodPath(), text: last})
	if lerr != nil {
		return nil, fmt.Errorf("load rules: %w (and the last good rules are invalid: %v)", err, lerr)
	}
	d.log.Warn("RUNNING THE LAST GOOD RULES, NOT THE RULES FILE", "file", d.lastGoodPath())
	return p, nil
}

// prepareFile reads and prepares the --config file.
func (d *daemon) prepareFile(origin Origin) (*prepared, error) {
	data, err := config.ReadFile(d.opts.Config)
	if err != nil {
		return nil, err
	}
	return d.prepare(document{origin: origin, name: d.opts.Config, label: d.opts.Config, text: data})
}

// targets tells the loop where each steered rule lives: its slot and epoch
// in every interface's maps.
func (d *daemon) targets(s *Specs) map[string][]control.Target {
	targets := map[string][]control.Target{}
	for _, r := range s.Control {
		for _, a := range d.attach {
			p := d.plans[a.Iface]
			if slot := p.Slot(r.Name); slot >= 0 {
				targets[r.Name] = append(targets[r.Name], control.Target{Kernel: cappedKernel{a.Tables(), d}, Slot: slot, Epoch: p.Rules[slot].Epoch})
			}
		}
	}
	return targets
}
