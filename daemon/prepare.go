//go:build linux

package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/rulesource"
)

// The documents that arrive: the one to start with (startupRules), and
// those that come while the daemon runs (the rules file's changes and
// SIGHUP, the rules source; the API's through apiFront), prepared off the
// loop on the preparer's queue (preparer.go) and committed by the loop
// (finish); and the rules in force written into an interface's maps
// before the program is attached (fill).

// prepareDoc is prepare plus a first compilation for every interface
// against the plans in force now, so that the loop's commit has only the
// maps to write (it compiles again only if a commit came in between).
// It runs on any goroutine.
func (pl *pipeline) prepareDoc(doc document) (*prepared, error) {
	if pl.opts.beforePrepare != nil {
		pl.opts.beforePrepare()
	}
	p, err := pl.prepare(doc)
	if err != nil {
		return nil, err
	}
	against := pl.kernel.basesNow()
	p.plans = make(map[string]*dataplane.Plan, len(against))
	for iface, prev := range against {
		plan, err := compileAgainst(iface, p.specs.Dataplane, prev)
		if err != nil {
			return nil, err
		}
		p.plans[iface] = plan
	}
	p.against = against
	return p, nil
}

// finish commits a prepared job on the loop goroutine and answers its
// caller. Jobs commit in the order they were submitted; a revert for want
// of a confirmation (confirm.go) commits on the loop when it fires, ahead
// of those not committed yet, which then replace it as any later document
// does.
func (pl *pipeline) finish(r prepResult) {
	var err error
	if r.err != nil {
		pl.rejected(r.doc, r.err)
		err = r.err
	} else if r.p == nil {
		// The rules source's document in force already (applySource).
		err = pl.applyDocument(r.doc, nil)
	} else {
		was, wasPlans := pl.inForcePrep, pl.kernel.inForce()
		pl.beforeCommit(&r)
		if err = pl.applyDocument(r.doc, r.p); err == nil {
			pl.afterCommit(r.p, was, wasPlans)
			if r.revertAt != nil {
				r.revertAt <- r.p.confirmAt
			}
		} else if pl.pending != nil {
			pl.capNS = pl.pending.deadlineNS
		} else {
			pl.capNS = 0
		}
	}
	if r.done != nil {
		r.done <- err
	}
}

// fill writes s's rules into an interface's maps before the program is
// attached (loader.Options.Fill, at start and on a re-attach: links.go),
// compiled against what the maps already hold so that every rule keeps its
// slot, bucket and counters.
func (pl *pipeline) fill(iface string, s *Specs) func(t *maps.Tables) error {
	return func(t *maps.Tables) error {
		if s == nil {
			return errors.New("no rules to write")
		}
		pl.settlePending(iface, t) // confirm.go
		var prev *dataplane.Plan
		if p, err := t.ReadPlan(); err == nil && len(p.ActiveSlots()) > 0 {
			prev = p
		}
		plan, err := compileAgainst(iface, s.Dataplane, prev)
		if err != nil {
			return err
		}
		if err := t.Apply(plan); err != nil {
			return err
		}
		pl.kernel.setPlan(iface, plan)
		return nil
	}
}

// reloadFile re-reads the rules file (a change or SIGHUP) and hands it to
// the preparer.
func (pl *pipeline) reloadFile(origin Origin) {
	doc := document{origin: origin, name: pl.opts.Config, label: pl.opts.Config}
	data, err := config.ReadFile(pl.opts.Config)
	if err != nil {
		pl.rejected(doc, err)
		return
	}
	doc.text = data
	pl.prep.submit(job{doc: doc})
}

// onHUP re-reads the rules: the file, or the store at once.
func (pl *pipeline) onHUP() {
	if pl.src.refresh() {
		pl.log.Info("SIGHUP: reading the rules source now")
		return
	}
	pl.reloadFile(FromSIGHUP)
}

// applySource hands a document from the store to the preparer.
func (pl *pipeline) applySource(doc rulesource.Document) {
	if cur, _ := pl.record.get(); bytes.Equal(cur, doc.Text) {
		// The document in force: applyDocument records it as the
		// source's without preparing it again.
		pl.finish(prepResult{job: job{doc: pl.src.document(doc)}})
		return
	}
	pl.prep.submit(job{doc: pl.src.document(doc)})
}

// startupRules returns the document to start with. Without a rules source:
// the rules put through the API when newer than the rules file, else the
// rules file, else the last good rules (a restart must never leave the
// host with fewer rules than it had). With one: the store's document, else
// the local snapshot, else the --config file.
func (pl *pipeline) startupRules(ctx context.Context) (*prepared, error) {
	if pl.opts.RulesSource != "" {
		src, err := openRuleSource(pl.opts.RulesSource, pl.opts.RulesSourcePasswordFile, pl.opts.StateDir, pl.log) // rulesource.go
		if err != nil {
			return nil, err
		}
		pl.src = src
		var bootstrap func() (*prepared, error)
		if pl.opts.Config != "" {
			bootstrap = func() (*prepared, error) { return pl.prepareFile(FromBootstrap) }
		}
		return src.startup(ctx, pl.prepare, pl.lastGoodPath(), bootstrap)
	}
	if text, saved, err := api.SavedRules(pl.opts.StateDir, pl.opts.Config); err != nil {
		pl.log.Warn("cannot read the rules put through the API", "err", err)
	} else if text != nil {
		if p, err := pl.prepare(document{origin: FromAPIState, name: "api", label: "api", text: text}); err == nil {
			pl.log.Warn("RUNNING THE RULES PUT THROUGH THE API, newer than the rules file", "saved", saved, "file", pl.opts.Config)
			return p, nil
		}
	}
	p, err := pl.prepareFile(FromFile)
	if err == nil {
		return p, nil
	}
	pl.log.Error("rules file unusable; trying the last good rules", "file", pl.opts.Config, "err", err)
	last, lerr := config.ReadFile(pl.lastGoodPath())
	if lerr != nil {
		return nil, fmt.Errorf("load rules: %w (and no last good rules: %v)", err, lerr)
	}
	p, lerr = pl.prepare(document{origin: FromLastGood, name: pl.lastGoodPath(), label: pl.lastGoodPath(), text: last})
	if lerr != nil {
		return nil, fmt.Errorf("load rules: %w (and the last good rules are invalid: %v)", err, lerr)
	}
	pl.log.Warn("RUNNING THE LAST GOOD RULES, NOT THE RULES FILE", "file", pl.lastGoodPath())
	return p, nil
}

// prepareFile reads and prepares the --config file.
func (pl *pipeline) prepareFile(origin Origin) (*prepared, error) {
	data, err := config.ReadFile(pl.opts.Config)
	if err != nil {
		return nil, err
	}
	return pl.prepare(document{origin: origin, name: pl.opts.Config, label: pl.opts.Config, text: data})
}
