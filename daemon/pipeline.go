//go:build linux

package daemon

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/xlimit/xlimit/userspace/control"
)

// pipeline is the part every rules document goes through, whatever its
// origin: documents arrive and are prepared (prepare.go), committed to the
// kernel and the parts that follow the rules, then persisted by origin
// (rules.go), and, when applied with a deadline, confirmed or reverted
// (confirm.go). Its steps run on the loop goroutine, but for a document's
// preparation (the preparer's goroutine). It is given, in daemon.go, the
// parts a commit writes; it owns the rules in force and the wait for a
// confirmation.
type pipeline struct {
	opts   *Options
	log    *slog.Logger
	kernel *attached                // the attachments and plans (plans.go)
	guard  *atomic.Pointer[guard]   // the rules file's allow and management (guard.go)
	prep   *preparer                // documents that arrive while running (preparer.go)
	record *rulesRecord             // the rules in force, as the API shows them
	tick   func(control.TickReport) // the daemon's afterTick: a commit puts the steered rates in force at once

	// The parts a commit writes: the daemon's (daemon.go), which it sets
	// as it opens them.
	*parts

	// The loop goroutine's.
	specs       *Specs    // in force
	inForce     document  // the document in force
	inForcePrep *prepared // the same, as prepared (a revert's way back)
	// confirm.go: rules waiting for their confirmation; the deadline the
	// control loop's rates are capped at (0: none); the reverts done at
	// the start (settlePending).
	pending      *pendingConfirm
	capNS        uint64
	startReverts int
}

// rulesRecord is the rules text in force, where it came from and the
// names of its rules: what the API shows, read from its goroutines.
type rulesRecord struct {
	mu     sync.Mutex
	text   []byte
	source string
	names  map[string]bool
}

// set records the rules text in force, where it came from and its rules.
func (r *rulesRecord) set(text []byte, source string, s *Specs) {
	names := make(map[string]bool, len(s.Dataplane.Rules))
	for _, rule := range s.Dataplane.Rules {
		names[rule.Name] = true
	}
	r.mu.Lock()
	r.text, r.source, r.names = text, source, names
	r.mu.Unlock()
}

// setSource renames the source of the rules in force.
func (r *rulesRecord) setSource(source string) {
	r.mu.Lock()
	r.source = source
	r.mu.Unlock()
}

// get is the rules text in force and where it came from.
func (r *rulesRecord) get() ([]byte, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.text, r.source
}

// has reports whether the rules in force have a rule of that name.
func (r *rulesRecord) has(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.names[name]
}
