//go:build linux

package daemon

import (
	"fmt"
	"sync"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// attached is the part that holds what the kernel runs: the attachments,
// the plan in force on each interface, and the plans a pending change
// returns to (confirm.go), under one lock. The loop goroutine changes
// them (attaching, committing, reverting); the parts that read the kernel
// from other goroutines (the metrics, the measures, the host's addresses,
// the API's status, a document prepared off the loop) see them whole
// through its methods.
type attached struct {
	mu    sync.Mutex
	list  []*loader.Attachment
	plans map[string]*dataplane.Plan
	// reserved are the plans a pending change returns to, and bases the
	// merged plans base made of them, by interface.
	reserved map[string]*dataplane.Plan
	bases    map[string]basePlan
}

func newAttached() *attached { return &attached{plans: map[string]*dataplane.Plan{}} }

// with runs f with the attachments and the plans in force, under the
// lock.
func (k *attached) with(f func(attach []*loader.Attachment, plans map[string]*dataplane.Plan)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f(k.list, k.plans)
}

// edit runs f on the list of attachments, under the lock (links.go adds
// and removes them).
func (k *attached) edit(f func(list *[]*loader.Attachment)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	f(&k.list)
}

// all are the attachments now.
func (k *attached) all() []*loader.Attachment {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]*loader.Attachment(nil), k.list...)
}

// names are the interfaces the program is attached to, for the parts that
// act on each (the kernel queues, the XDP_TX warnings).
func (k *attached) names() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	names := make([]string, len(k.list))
	for i, a := range k.list {
		names[i] = a.Iface
	}
	return names
}

// setPlan records p as the plan in force on iface.
func (k *attached) setPlan(iface string, p *dataplane.Plan) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.plans[iface] = p
}

// inForce is a copy of the plans in force, by interface.
func (k *attached) inForce() map[string]*dataplane.Plan {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]*dataplane.Plan, len(k.plans))
	for iface, p := range k.plans {
		out[iface] = p
	}
	return out
}

// restore puts plans back in force (a revert: what the kernel's previous
// generation holds).
func (k *attached) restore(plans map[string]*dataplane.Plan) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for iface, p := range plans {
		if p != nil {
			k.plans[iface] = p
		}
	}
}

// setReserved keeps the plans a pending change returns to: documents
// compile against the plans in force with those rules' slots kept too
// (base), so that no rule of the change takes a slot, and the bucket, of
// a rule the revert brings back.
func (k *attached) setReserved(plans map[string]*dataplane.Plan) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reserved = plans
	k.bases = nil
}

// bases are what documents compile against now, by interface (base).
func (k *attached) basesNow() map[string]*dataplane.Plan {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]*dataplane.Plan, len(k.list))
	for _, a := range k.list {
		out[a.Iface] = k.baseLocked(a.Iface)
	}
	return out
}

// base is what documents compile against on iface: the plan in force,
// with the rules a pending change returns to kept in their slots when
// they are not in force.
func (k *attached) base(iface string) *dataplane.Plan {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.baseLocked(iface)
}

func (k *attached) baseLocked(iface string) *dataplane.Plan {
	cur, keep := k.plans[iface], k.reserved[iface]
	if cur == nil || keep == nil || cur == keep {
		return cur
	}
	if b, ok := k.bases[iface]; ok && b.of == cur {
		return b.plan
	}
	merged := *cur
	for s := range keep.Rules {
		r := keep.Rules[s]
		if r.Active() && !merged.Rules[s].Active() && cur.Slot(r.Name) < 0 {
			merged.Rules[s] = r
		}
	}
	if k.bases == nil {
		k.bases = map[string]basePlan{}
	}
	k.bases[iface] = basePlan{of: cur, plan: &merged}
	return &merged
}

// basePlan is a merged plan of base, for the plan in force it was made of.
type basePlan struct{ of, plan *dataplane.Plan }

// compileAgainst compiles spec for iface against prev, the plan in force
// there whose slots, buckets and counters the new one carries over (nil:
// none): the one place a plan is made, whether for a document being
// prepared (prepare.go), committed (rules.go: when the base moved since it
// was prepared) or written into an interface's maps at (re-)attach
// (prepare.go's fill: against what its pins hold).
func compileAgainst(iface string, spec *dataplane.Spec, prev *dataplane.Plan) (*dataplane.Plan, error) {
	plan, err := dataplane.Compile(spec, prev)
	if err != nil {
		return nil, fmt.Errorf("compile for %s: %w", iface, err)
	}
	return plan, nil
}
