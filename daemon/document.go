//go:build linux

package daemon

import (
	"time"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/rulesource"
)

// The rules pipeline's values: where a document came from, the document,
// and the document prepared. Every part of the pipeline (prepare.go,
// rules.go, confirm.go, the API, the rules source, re-attach) passes them;
// they are declared apart so that using one does not tie a file to the
// pipeline's steps.

// Origin is where a rules document came from. Every document, whatever its
// origin, takes the same path, applyDocument: parse and validate,
// translate (prepare), compile for every interface and write the maps, the
// queues and the loop, persist, record (commit), then count and log. The
// origin decides only what is persisted and what the logs say. At start,
// the daemon prepares its candidates in order of preference (startupRules)
// and hands the first valid one to the same path.
type Origin int

const (
	FromFile       Origin = iota // the rules file, at start
	FromLastGood                 // the state directory's last good rules, at start
	FromAPIState                 // the rules put through the API before a restart
	FromWatch                    // the rules file, changed
	FromSIGHUP                   // the rules file, on SIGHUP
	FromAPI                      // PUT /v1/rules
	FromSource                   // the rules source (Redis)
	FromSnapshot                 // the local snapshot of the rules source, at start
	FromBootstrap                // the --config file while the rules source has not answered
	FromAPIPending               // PUT /v1/rules?confirm=: waits for its confirmation (confirm.go)
	FromRevert                   // the rules in force before one that was not confirmed
)

var origins = [...]struct{ name, applied, rejected string }{
	FromFile:       {"file", "rules from the rules file", "the rules file is rejected"},
	FromLastGood:   {"last_good", "rules from the last good rules", "the last good rules are rejected"},
	FromAPIState:   {"api_state", "rules put through the API", "the rules put through the API are rejected"},
	FromWatch:      {"watch", "reloaded", "reload failed; the running rules stay in force"},
	FromSIGHUP:     {"sighup", "reloaded", "reload failed; the running rules stay in force"},
	FromAPI:        {"api", "reloaded from the API", "rules from the API rejected; the running rules stay in force"},
	FromSource:     {"source", "reloaded from the rules source", "rules from the rules source rejected; the running rules stay in force"},
	FromSnapshot:   {"snapshot", "rules from the local snapshot of the rules source", "the local snapshot is rejected"},
	FromBootstrap:  {"bootstrap", "rules from the bootstrap rules file", "the bootstrap rules file is rejected"},
	FromAPIPending: {"api_unconfirmed", "reloaded from the API, waiting for its confirmation", "rules from the API rejected; the running rules stay in force"},
	FromRevert:     {"revert", "reverted to the previous rules", "REVERT FAILED; the kernel keeps the previous rules (its deadline), the daemon tries again"},
}

func (o Origin) String() string { return origins[o].name }

// document is a rules document on its way to the kernel.
type document struct {
	origin Origin
	name   string // names it in errors: FILE:LINE: ...
	label  string // the rules' source in GET /v1/rules
	text   []byte
	src    rulesource.Document // FromSource: the store's document
}

// prepared is a document parsed, validated and translated, not yet
// applied.
type prepared struct {
	doc   document
	cfg   *config.Config
	specs *Specs
	// plans, compiled off the loop (prepareDoc), are valid while the
	// plans in force are still against's.
	plans, against map[string]*dataplane.Plan
	// confirmNS, when not 0, is the kernel's deadline of a change that
	// waits for its confirmation (CLOCK_MONOTONIC), and confirmAt the
	// same instant on the wall clock (confirm.go).
	confirmNS uint64
	confirmAt time.Time
}

// pendingConfirm is the wait for a confirmation, on the loop goroutine.
type pendingConfirm struct {
	// prev is what the revert applies: the document in force before the
	// first change of the wait, as it was prepared, and prevPlans as it
	// was compiled for each interface: what the generation the kernel
	// returns to holds.
	prev      *prepared
	prevPlans map[string]*dataplane.Plan
	doc       document // what waits for its confirmation
	deadline  time.Time
	// deadlineNS is the kernel's deadline (CLOCK_MONOTONIC).
	deadlineNS uint64
	timer      *time.Timer
	// reverting: the deadline has passed and the revert failed; timer is
	// the next attempt's.
	reverting bool
	attempts  int
}
