package fleet

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"sync"
	"time"
)

// Defaults of the sharing (docs/fleet.md).
const (
	// DefaultInterval is the epoch: each host reports and reads the
	// allocation once per epoch.
	DefaultInterval = 200 * time.Millisecond
	// DefaultHeadroom multiplies the smoothed offered rate into the
	// demand a host reports, so that a host below the water level is not
	// held exactly at its own average.
	DefaultHeadroom = 1.1
	// DefaultSmoothing is the time constant of the offered rate's
	// exponential smoothing.
	DefaultSmoothing = 50 * time.Millisecond
)

// ErrInvalid marks invalid parameters.
var ErrInvalid = errors.New("invalid")

// Rule is one fleet rule of this host.
type Rule struct {
	Name     string  // the rule's name on this host
	Key      string  // the fleet key, the same on every host sharing the budget
	Budget   float64 // the fleet-wide rate
	Burst    float64 // the fleet-wide burst
	SafeRate float64 // the fallback; 0: budget ÷ the last known number of hosts
}

// Config tunes a Host. Hosts of one fleet key may use different
// intervals: the key's epoch is the shortest any of them asks for.
type Config struct {
	Interval  time.Duration // T, the epoch this host asks for (default DefaultInterval)
	Guard     time.Duration // how long before a lease's end the host stops counting on it (the caller's write period and a margin)
	Headroom  float64       // default DefaultHeadroom
	Smoothing time.Duration // default DefaultSmoothing
}

// Window is L, how long a lease outlives its epoch of length T: 3T/4.
// It is the protocol's, the same on every host: the store promises no
// increase until every lease of an earlier epoch has ended.
func Window(T time.Duration) time.Duration { return T * 3 / 4 }

// longest is the longest a lease granted in an epoch of length T can run
// from the request that got it: the rest of the epoch (T at most) and L.
func longest(T time.Duration) time.Duration { return T + Window(T) }

// Fallback states of a rule, as reported in Status.
const (
	StateLeased       = "leased"        // a share under a lease of the current allocation
	StateNotContacted = "not_contacted" // the store has not answered yet: the safe share
	StateNew          = "new"           // the store answered, this host is not in the allocation yet: the safe share
	StateStoreLost    = "store_lost"    // the lease ran out and the store does not answer: the safe share
	StateExpired      = "lease_expired" // the lease ran out (no answer in time): the safe share
)

// Report is what a host reports of one fleet rule.
type Report struct {
	Key      string
	Budget   float64
	Demand   float64
	Interval time.Duration // the epoch the host asks for
	// Last is the key's epoch this host last reported in, on the server
	// of its last answer; 0 unknown.
	Last int64
}

// RuleAnswer is the store's answer for one reported rule.
type RuleAnswer struct {
	Alloc Alloc
	// In tells whether this host reported in one of the two previous
	// epochs, i.e. is in Alloc; Demand is what it reported last there.
	In     bool
	Demand float64
	// Reporting is, when Alloc has no hosts (a cold key), how many hosts
	// reported in the current epoch so far, this one included.
	Reporting int
	// The key's current epoch: its number (one more per epoch, whatever
	// the clock does), its length, its end (store ms) and Hold, the
	// latest end of a lease granted in an earlier epoch (store ms): no
	// share of this epoch may rise above what was in force before then.
	Seq        int64
	IntervalMS int64
	EndMS      int64
	HoldMS     int64
}

// Answer is the store's answer to one exchange.
type Answer struct {
	NowMS int64 // the store's clock, in ms
	// Server names the store's instance (Redis: its run_id and
	// replication id): a restart or a failover changes it; "" unknown.
	Server string
	Rules  []RuleAnswer
}

// Status is one fleet rule's state.
type Status struct {
	Rule     string
	Key      string
	Share    float64       // the rate this host may use now
	Demand   float64       // the smoothed offered rate
	State    string        // StateLeased or a fallback state
	LeaseAge time.Duration // since the lease in force was granted; 0 without one
	Hosts    int           // hosts known in the allocation (this one included); 0 unknown
	Epoch    int64         // the key's epoch of the lease in force (or of the last answer)
	Interval time.Duration // the key's epoch length in the last answer; 0 before one
	// StoreBudget is the budget the store divided in the last allocation
	// this host was in; 0 before one. Another than the rule's Budget is
	// a mismatch between hosts (counted in BudgetMismatches).
	StoreBudget float64
}

type ruleState struct {
	Rule
	demand float64
	primed bool
	leased bool // share, held, window, until and tail are valid
	server string
	epoch  int64
	share  float64
	held   float64 // the share until window: never above what was enforced before
	// heldSafe: what was enforced before was a safe share, so held is
	// bounded by the safe share, not by the previous allocation.
	heldSafe bool
	granted  time.Time
	window   time.Time // no rise above held before it
	until    time.Time // the end of the lease (early: from the request's departure)
	// tail is the round trip of the exchange that granted the lease: its
	// true end is no later than until + tail, and every other host's
	// lease of the same epoch ends by then too. Past until, the host stays
	// at min(share, safe share) for tail before taking the safe share.
	tail time.Duration
	// counted is how long after tail the allocations of the epochs after
	// the lease's may still count this host at the demand it reported
	// for it (two epochs, each at most 2·tmax long: a clock stepped back
	// stretches one): until then the others' leases leave it no more
	// than its share, and a host that got no answer since stays at
	// min(share, safe share), not the safe share.
	counted  time.Duration
	hosts    int
	inAlloc  bool
	seen     bool // the store answered for this rule
	interval time.Duration
	// reported is the key's epoch of the last answer, on server
	// reportedOn: the host reported in it.
	reported   int64
	reportedOn string
	// storeBudget is the budget of the last allocation this host was in.
	storeBudget float64
}

// Host is one host's side of the fleet sharing. It is safe for concurrent
// use: the control loop calls Observe and Cap; the exchange with the store
// runs elsewhere and calls Reports, Apply and Fail.
type Host struct {
	mu     sync.Mutex
	cfg    Config
	hash   uint32 // of the node name: the host's phase in an epoch
	rules  map[string]*ruleState
	order  []string
	next   time.Time // when the next exchange is due
	failed bool
	calls  uint64
	errs   uint64

	// The store's clock, as seen from this host's monotonic clock: the
	// interval [offLo, offHi] (ms) holds the store's now minus the local
	// time at the last answer (at offAt). An answer outside it, widened
	// by the drift and the resolution, is a step of the store's clock.
	server       string
	ref          time.Time
	offLo, offHi float64
	offAt        time.Time
	// Until untrusted, the store's times are not taken at their word:
	// after the first answer, a step, a new server or an epoch number
	// going back, leases granted before may have been projected with
	// another clock, so no share rises before every such lease has
	// ended (longest(tmax) after the discontinuity was seen).
	untrusted time.Time
	tmax      time.Duration // the longest epoch of the last two minutes (and Interval)
	tmaxAt    time.Time
	steps     uint64
	// mismatches counts the allocations of another budget than the
	// rule's (a host of the key with another budget).
	mismatches uint64
}

// NewHost returns the Host of node.
func NewHost(node string, cfg Config) (*Host, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Headroom == 0 {
		cfg.Headroom = DefaultHeadroom
	}
	if cfg.Smoothing == 0 {
		cfg.Smoothing = DefaultSmoothing
	}
	switch {
	case cfg.Interval < 50*time.Millisecond || cfg.Interval > time.Minute:
		return nil, fmt.Errorf("new fleet host: interval %v: %w (50ms to 1m)", cfg.Interval, ErrInvalid)
	case cfg.Guard < 0 || cfg.Guard >= Window(cfg.Interval):
		return nil, fmt.Errorf("new fleet host: guard %v: %w (below the window)", cfg.Guard, ErrInvalid)
	case cfg.Headroom < 1 || cfg.Headroom > 4:
		return nil, fmt.Errorf("new fleet host: headroom %v: %w (1 to 4)", cfg.Headroom, ErrInvalid)
	case node == "":
		return nil, fmt.Errorf("new fleet host: empty node name: %w", ErrInvalid)
	}
	h := fnv.New32a()
	h.Write([]byte(node))
	return &Host{cfg: cfg, hash: h.Sum32(), rules: map[string]*ruleState{}, tmax: cfg.Interval}, nil
}

// phase is when, after an epoch of length T starts, this host calls: up
// to a tenth of T, so that a fleet does not call at the same instant.
func (h *Host) phase(T time.Duration) time.Duration {
	spread := max(T/10, time.Millisecond)
	return 2*time.Millisecond + time.Duration(h.hash)%spread
}

// Interval is the epoch T.
func (h *Host) Interval() time.Duration { return h.cfg.Interval }

// SetRules sets the fleet rules. A rule of the same fleet key as before
// (an edit: another budget, burst, safe_rate or name) keeps its lease,
// demand and host count until the next exchange; its share is scaled by
// the new budget ÷ the old when that is a cut, and kept as it is (never
// above the lease) when it is a raise. A rule of a new key starts at the
// safe share.
func (h *Host) SetRules(rules []Rule) {
	h.mu.Lock()
	defer h.mu.Unlock()
	byKey := make(map[string]*ruleState, len(h.rules))
	for _, st := range h.rules {
		byKey[st.Key] = st
	}
	next := make(map[string]*ruleState, len(rules))
	h.order = h.order[:0]
	for _, r := range rules {
		st := byKey[r.Key]
		switch {
		case st == nil:
			st = &ruleState{Rule: r}
		case st.Rule != r:
			if st.Budget > 0 && r.Budget < st.Budget {
				f := r.Budget / st.Budget
				st.share *= f
				st.held *= f
			}
			st.Rule = r
		}
		delete(byKey, r.Key)
		next[r.Name] = st
		h.order = append(h.order, r.Name)
	}
	h.rules = next
}

// Has tells whether name is a fleet rule.
func (h *Host) Has(name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rules[name] != nil
}

// Observe feeds rule name's offered rate (packets/s seen by the kernel)
// over the last dt.
func (h *Host) Observe(name string, offered float64, dt time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rules[name]
	if r == nil || dt <= 0 || math.IsNaN(offered) || offered < 0 {
		return
	}
	if !r.primed {
		r.demand, r.primed = offered, true
		return
	}
	a := 1 - math.Exp(-dt.Seconds()/h.cfg.Smoothing.Seconds())
	r.demand += a * (offered - r.demand)
}

// Due tells whether an exchange with the store is due at now.
func (h *Host) Due(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.order) > 0 && !now.Before(h.next)
}

// Next is when the next exchange is due.
func (h *Host) Next() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.next
}

// Reports returns what to send to the store, in the order Apply expects
// the answers.
func (h *Host) Reports() []Report {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Report, 0, len(h.order))
	for _, name := range h.order {
		r := h.rules[name]
		rep := Report{Key: r.Key, Budget: r.Budget, Demand: r.demand * h.cfg.Headroom, Interval: h.cfg.Interval}
		if r.reportedOn == h.server {
			rep.Last = r.reported
		}
		out = append(out, rep)
	}
	return out
}

// Apply takes the store's answer to the reports sent at sent (the local
// time before the request left) and received at recv (after the answer
// came). The lease's end is derived from sent, so it is early, never late;
// the window, before which the share may not rise, from recv, so it is
// late, never early. Neither is believed beyond what an epoch can last
// from this host's own clock, and while the store's clock is not trusted
// (see Host.untrusted) the window lasts as long as any lease can.
func (h *Host) Apply(sent, recv time.Time, reps []Report, ans Answer) error {
	if len(ans.Rules) != len(reps) {
		return fmt.Errorf("apply fleet answer: %d answers for %d reports", len(ans.Rules), len(reps))
	}
	for _, ra := range ans.Rules {
		if T := ms(ra.IntervalMS); T < time.Millisecond || T > time.Minute {
			return fmt.Errorf("apply fleet answer: an epoch of %v", T)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	h.failed = false
	h.watchClock(sent, recv, ans)
	byKey := make(map[string]*ruleState, len(h.rules))
	for _, r := range h.rules {
		byKey[r.Key] = r
	}
	next := time.Time{}
	for i, rep := range reps {
		ra := ans.Rules[i]
		T := ms(ra.IntervalMS)
		h.noteInterval(T, recv)
		// The store's end of the epoch, never more than an epoch ahead.
		toEnd := min(max(ms(ra.EndMS-ans.NowMS), 0), T)
		if at := sent.Add(toEnd + h.phase(T)); next.IsZero() || at.Before(next) {
			next = at
		}
		r := byKey[rep.Key]
		if r == nil {
			continue // the rule went away during the exchange
		}
		if r.leased && r.server == ans.Server && ra.Seq < r.epoch {
			h.distrust(recv) // the key's epochs went back: not the store that granted the lease
		}
		before, _, beforeState := r.cap(sent, h.cfg.Guard)
		r.seen = true
		r.inAlloc = ra.In
		r.reported, r.reportedOn = ra.Seq, ans.Server
		r.interval = T
		until := sent.Add(toEnd + Window(T))
		if !ra.In {
			// Not in this epoch's allocation: the safe share, knowing
			// the hosts that are (or, for a key without an allocation,
			// the most hosts known), once the lease in force has ended.
			if ra.Alloc.Hosts > 0 {
				r.hosts = max(r.hosts, ra.Alloc.Hosts+1)
			} else {
				r.hosts = max(r.hosts, ra.Reporting)
			}
			if !r.leased {
				r.epoch = ra.Seq
			}
			continue
		}
		r.hosts = ra.Alloc.Hosts
		if ra.Alloc.Hosts > 0 && ra.Alloc.Budget != r.Budget && !(r.leased && r.server == ans.Server && r.epoch == ra.Seq) {
			h.mismatches++ // once an epoch
		}
		r.storeBudget = ra.Alloc.Budget
		share := ra.Alloc.Share(ra.Demand)
		if ra.Alloc.Budget > r.Budget && ra.Alloc.Budget > 0 {
			share *= r.Budget / ra.Alloc.Budget // an allocation of a larger budget than this host's
		}
		if r.leased && r.server == ans.Server && r.epoch == ra.Seq {
			// The same epoch again: the lease in force stands, and lasts
			// as long as the epoch does (a clock stepped back stretches it).
			if until.After(r.until) {
				r.until, r.tail = until, recv.Sub(sent)
			}
			continue
		}
		window := recv.Add(ms(ra.HoldMS - ans.NowMS))
		if window.Before(h.untrusted) {
			window = h.untrusted
		}
		if most := recv.Add(longest(h.tmax)); window.After(most) {
			window = most
		}
		r.leased, r.server, r.epoch, r.share, r.granted = true, ans.Server, ra.Seq, share, sent
		r.held = math.Min(share, before)
		r.heldSafe = beforeState != StateLeased
		r.window, r.until, r.tail = window, until, recv.Sub(sent)
		r.counted = 4 * h.tmax
	}
	if next.IsZero() {
		next = sent.Add(h.cfg.Interval)
	}
	h.next = next
	return nil
}

func ms(v int64) time.Duration { return time.Duration(v) * time.Millisecond }

// watchClock checks the answer's clock against the last one and this
// host's monotonic clock (with h.mu held). The store read its clock
// between sent and recv, at a whole ms: its now minus the local time lies
// in [NowMS − recv, NowMS + 1 − sent]. A new server, the first answer, or
// an interval that does not meet the last one (widened by 2 ms and 500
// ppm of the time between them) makes the store untrusted for as long as
// a lease can last.
func (h *Host) watchClock(sent, recv time.Time, ans Answer) {
	if h.ref.IsZero() {
		h.ref = sent
	}
	local := func(t time.Time) float64 { return float64(t.Sub(h.ref)) / float64(time.Millisecond) }
	lo, hi := float64(ans.NowMS)-local(recv), float64(ans.NowMS)+1-local(sent)
	first := h.offAt.IsZero()
	slack := 2 + 5e-4*local(recv) - 5e-4*local(h.offAt)
	stepped := !first && (lo > h.offHi+slack || hi < h.offLo-slack)
	newServer := !first && ans.Server != h.server
	h.offLo, h.offHi, h.offAt, h.server = lo, hi, recv, ans.Server
	if stepped || newServer {
		h.steps++
	}
	if first || stepped || newServer {
		h.distrust(recv)
	}
}

// distrust makes the store's times untrusted from recv for as long as a
// lease granted before can last (with h.mu held).
func (h *Host) distrust(recv time.Time) {
	if u := recv.Add(longest(h.tmax)); u.After(h.untrusted) {
		h.untrusted = u
	}
}

// noteInterval keeps tmax, the longest epoch of the last two minutes
// and this host's own interval (with h.mu held).
func (h *Host) noteInterval(T time.Duration, now time.Time) {
	if now.Sub(h.tmaxAt) > 2*time.Minute {
		h.tmax, h.tmaxAt = h.cfg.Interval, now
	}
	if T >= h.tmax {
		h.tmax, h.tmaxAt = T, now
	}
}

// ClockSteps counts the discontinuities of the store's clock this host
// has seen: a step, a new server (a restart or a failover).
func (h *Host) ClockSteps() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.steps
}

// Fail records a failed exchange at now; the next is due half an epoch
// later. Leases run out on their own.
func (h *Host) Fail(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed = true
	h.errs++
	h.next = now.Add(h.cfg.Interval / 2)
}

// Cap returns the rate and burst rule name may use at now and until when
// (zero: no deadline, the rate is a safe share). ok is false when name is
// not a fleet rule.
func (h *Host) Cap(name string, now time.Time) (rate, burst float64, until time.Time, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rules[name]
	if r == nil {
		return 0, 0, time.Time{}, false
	}
	rate, until, _ = r.cap(now, h.cfg.Guard)
	burst = r.Burst * rate / r.Budget
	return rate, burst, until, true
}

// Status returns every fleet rule's state at now.
func (h *Host) Status(now time.Time) []Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Status, 0, len(h.order))
	for _, name := range h.order {
		r := h.rules[name]
		rate, _, state := r.cap(now, h.cfg.Guard)
		if state != StateLeased && h.failed {
			state = StateStoreLost
		}
		st := Status{Rule: r.Name, Key: r.Key, Share: rate, Demand: r.demand, State: state, Hosts: r.hosts, Epoch: r.epoch, Interval: r.interval, StoreBudget: r.storeBudget}
		if state == StateLeased {
			st.LeaseAge = now.Sub(r.granted)
		}
		out = append(out, st)
	}
	return out
}

// covered tells whether the rate of rule name at now is bounded by an
// allocation (true) or by a safe share (false: a fallback, or the window
// after one); the bound of docs/fleet.md counts the two apart.
func (h *Host) covered(name string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rules[name]
	if r == nil {
		return false
	}
	_, until, state := r.cap(now, h.cfg.Guard)
	return state == StateLeased && !until.IsZero() && !(now.Before(r.window) && r.heldSafe)
}

// safe is the fallback share: safe_rate, or the budget ÷ the last known
// number of hosts (the budget when none is known).
func (r *ruleState) safe() float64 {
	if r.SafeRate > 0 {
		return r.SafeRate
	}
	if r.hosts > 0 {
		return r.Budget / float64(r.hosts)
	}
	return r.Budget
}

// cap is the rate in force at now, with the deadline of the lease it rests
// on (zero when it is a safe share) and the state.
func (r *ruleState) cap(now time.Time, guard time.Duration) (float64, time.Time, string) {
	s := r.safe()
	if !r.leased || !now.Before(r.until) {
		state := StateExpired
		switch {
		case !r.seen:
			state = StateNotContacted
		case !r.inAlloc:
			state = StateNew
		}
		if r.leased && now.Before(r.until.Add(r.tail+r.counted)) {
			// The lease may still run on other hosts, and the leases of
			// the next two epochs count this host at its share: not
			// above it.
			return math.Min(r.leaseRate(now), s), time.Time{}, state
		}
		return s, time.Time{}, state
	}
	rate := r.leaseRate(now)
	if !now.Add(guard).Before(r.until) {
		// The lease ends before the next write may come: what is written
		// now must be safe without it.
		return math.Min(rate, s), time.Time{}, StateLeased
	}
	return rate, r.until, StateLeased
}

// leaseRate is the lease's rate at now: held before its window, the share
// after.
func (r *ruleState) leaseRate(now time.Time) float64 {
	if now.Before(r.window) {
		return r.held
	}
	return r.share
}

// Up tells whether the last exchange was answered.
func (h *Host) Up() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls > 0 && !h.failed
}

// BudgetMismatches counts the allocations (one an epoch) of another budget
// than this host's rule carries: the hosts of a fleet key disagree on its
// budget (a typo on one host), and the allocation is the budget of
// whichever host started the epoch (docs/fleet.md).
func (h *Host) BudgetMismatches() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mismatches
}
