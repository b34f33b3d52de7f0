//go:build linux

package daemon

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The documents that arrive while the daemon runs (the rules file changed
// or SIGHUP, PUT /v1/rules, the rules source) are prepared off the loop
// goroutine: parsing, validation, translation and a first compilation may
// take a large document's time, and the loop must keep its ticks and the
// watchdog's pings meanwhile. The preparer takes them one at a time, in
// their order of arrival, and hands each prepared document (or its error)
// to the loop, which commits it through applyDocument: the one path.

// job is a document waiting to be prepared.
type job struct {
	doc     document
	done    chan error    // the API's caller waits for the outcome; nil otherwise
	confirm time.Duration // FromAPIPending: the deadline of its confirmation
	// revertAt gets a FromAPIPending job's deadline once applied.
	revertAt chan time.Time
}

// prepResult is a job prepared: p, or the error that refused it.
type prepResult struct {
	job
	p   *prepared
	err error
}

// preparer is the queue of jobs and the goroutine that works it.
type preparer struct {
	mu    sync.Mutex
	queue []job
	wake  chan struct{} // one pending wake-up
	out   chan prepResult
}

func newPreparer() *preparer {
	return &preparer{wake: make(chan struct{}, 1), out: make(chan prepResult)}
}

// submit queues a document; it never blocks (the loop submits too).
func (q *preparer) submit(j job) {
	q.mu.Lock()
	q.queue = append(q.queue, j)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *preparer) next() (job, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) == 0 {
		return job{}, false
	}
	j := q.queue[0]
	q.queue = q.queue[1:]
	return j, true
}

// run prepares jobs until ctx ends; the jobs left then get no answer but
// their callers' (the API's) wait ends with the loop.
func (q *preparer) run(ctx context.Context, prepare func(document) (*prepared, error)) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.wake:
		}
		for {
			j, ok := q.next()
			if !ok {
				break
			}
			p, err := prepare(j.doc)
			select {
			case q.out <- prepResult{job: j, p: p, err: err}:
			case <-ctx.Done():
				return
			}
		}
	}
}

// prepareDoc is prepare plus a first compilation for every interface
// against the plans in force now, so that the loop's commit has only the
// maps to write (it compiles again only if a commit came in between).
// It runs on any goroutine.
func (d *daemon) prepareDoc(doc document) (*prepared, error) {
	if d.opts.beforePrepare != nil {
		d.opts.beforePrepare()
	}
	p, err := d.prepare(doc)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	against := make(map[string]*dataplane.Plan, len(d.attach))
	for _, a := range d.attach {
		against[a.Iface] = d.baseLocked(a.Iface)
	}
	d.mu.Unlock()
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
func (d *daemon) finish(r prepResult) {
	var err error
	if r.err != nil {
		d.rejected(r.doc, r.err)
		err = r.err
	} else if r.p == nil {
		// The rules source's document in force already (applySource).
		err = d.applyDocument(r.doc, nil)
	} else {
		was, wasPlans := d.inForcePrep, d.plansInForce()
		d.beforeCommit(&r)
		if err = d.applyDocument(r.doc, r.p); err == nil {
			d.afterCommit(r.p, was, wasPlans)
			if r.revertAt != nil {
				r.revertAt <- r.p.confirmAt
			}
		} else if d.pending != nil {
			d.capNS = d.pending.deadlineNS
		} else {
			d.capNS = 0
		}
	}
	if r.done != nil {
		r.done <- err
	}
}

// plansInForce is a copy of the plans in force, by interface.
func (d *daemon) plansInForce() map[string]*dataplane.Plan {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]*dataplane.Plan, len(d.plans))
	for k, v := range d.plans {
		out[k] = v
	}
	return out
}

// untilDone runs f on its own goroutine and returns its result, or
// ctx's error as soon as ctx ends (f is then left to finish alone).
func untilDone[T any](ctx context.Context, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, fmt.Errorf("stopped: %w", context.Cause(ctx))
	}
}

// compileAgainst compiles spec for iface against prev, the plan in force
// there whose slots, buckets and counters the new one carries over (nil:
// none): the one place a plan is made, whether for a document being
// prepared (prepare), committed (rules.go: when the base moved since it
// was prepared) or written into an interface's maps at (re-)attach
// (links.go: against what its pins hold).
func compileAgainst(iface string, spec *dataplane.Spec, prev *dataplane.Plan) (*dataplane.Plan, error) {
	plan, err := dataplane.Compile(spec, prev)
	if err != nil {
		return nil, fmt.Errorf("compile for %s: %w", iface, err)
	}
	return plan, nil
}

// fill writes s's rules into an interface's maps before the program is
// attached (loader.Options.Fill, at start and on a re-attach: links.go),
// compiled against what the maps already hold so that every rule keeps its
// slot, bucket and counters.
func (d *daemon) fill(iface string, s *Specs) func(t *maps.Tables) error {
	return func(t *maps.Tables) error {
		if s == nil {
			return errors.New("no rules to write")
		}
		d.settlePending(iface, t) // confirm.go
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
		d.mu.Lock()
		d.plans[iface] = plan
		d.mu.Unlock()
		return nil
	}
}
