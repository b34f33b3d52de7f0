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

// Config tunes a Host. Every host of a fleet must use the same Interval.
type Config struct {
	Interval  time.Duration // T, the epoch (default DefaultInterval)
	Window    time.Duration // L, how long a lease outlives its epoch; increases wait as long (default 3T/4)
	Guard     time.Duration // how long before a lease's end the host stops counting on it (the caller's write period and a margin)
	Headroom  float64       // default DefaultHeadroom
	Smoothing time.Duration // default DefaultSmoothing
}

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
	Key    string
	Budget float64
	Demand float64
}

// RuleAnswer is the store's answer for one reported rule.
type RuleAnswer struct {
	Alloc Alloc
	// In tells whether this host reported in the previous epoch, i.e. is
	// in Alloc; Demand is what it reported then.
	In     bool
	Demand float64
	// Reporting is, when Alloc has no hosts (a cold key), how many hosts
	// reported in the current epoch so far, this one included.
	Reporting int
}

// Answer is the store's answer to one exchange.
type Answer struct {
	NowMS int64 // the store's clock, in ms
	Epoch int64 // the epoch of the store's clock (NowMS ÷ T, never going back)
	Rules []RuleAnswer
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
	Epoch    int64
}

type ruleState struct {
	Rule
	demand float64
	primed bool
	leased bool // share, held, windowEnd, until valid
	epoch  int64
	share  float64
	held   float64 // the share until window: never above what was enforced before
	// heldSafe: what was enforced before was a safe share, so held is
	// bounded by the safe share, not by the previous allocation.
	heldSafe bool
	granted  time.Time
	window   time.Time // the end of the window (start of the epoch + L)
	until    time.Time // the end of the lease (end of the epoch + L)
	hosts    int
	inAlloc  bool
	seen     bool // the store answered for this rule
}

// Host is one host's side of the fleet sharing. It is safe for concurrent
// use: the control loop calls Observe and Cap; the exchange with the store
// runs elsewhere and calls Reports, Apply and Fail.
type Host struct {
	mu     sync.Mutex
	cfg    Config
	phase  time.Duration
	rules  map[string]*ruleState
	order  []string
	next   time.Time // when the next exchange is due
	failed bool
	calls  uint64
	errs   uint64
}

// NewHost returns the Host of node.
func NewHost(node string, cfg Config) (*Host, error) {
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Window == 0 {
		cfg.Window = cfg.Interval * 3 / 4
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
	case cfg.Window < cfg.Interval/4 || cfg.Window > 4*cfg.Interval:
		return nil, fmt.Errorf("new fleet host: window %v: %w (a quarter of the interval to four)", cfg.Window, ErrInvalid)
	case cfg.Guard < 0 || cfg.Guard >= cfg.Window:
		return nil, fmt.Errorf("new fleet host: guard %v: %w (below the window)", cfg.Guard, ErrInvalid)
	case cfg.Headroom < 1 || cfg.Headroom > 4:
		return nil, fmt.Errorf("new fleet host: headroom %v: %w (1 to 4)", cfg.Headroom, ErrInvalid)
	case node == "":
		return nil, fmt.Errorf("new fleet host: empty node name: %w", ErrInvalid)
	}
	// Hosts call at a phase of their own after the epoch starts, so that
	// a fleet does not call at the same instant: up to a tenth of T.
	h := fnv.New32a()
	h.Write([]byte(node))
	spread := max(cfg.Interval/10, time.Millisecond)
	phase := 2*time.Millisecond + time.Duration(h.Sum32())%spread
	return &Host{cfg: cfg, phase: phase, rules: map[string]*ruleState{}}, nil
}

// Interval is the epoch T.
func (h *Host) Interval() time.Duration { return h.cfg.Interval }

// SetRules sets the fleet rules. A rule whose Rule is unchanged keeps its
// lease and demand; a new or changed rule starts at the safe share.
func (h *Host) SetRules(rules []Rule) {
	h.mu.Lock()
	defer h.mu.Unlock()
	next := make(map[string]*ruleState, len(rules))
	h.order = h.order[:0]
	for _, r := range rules {
		if st, ok := h.rules[r.Name]; ok && st.Rule == r {
			next[r.Name] = st
		} else {
			next[r.Name] = &ruleState{Rule: r}
		}
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
		out = append(out, Report{Key: r.Key, Budget: r.Budget, Demand: r.demand * h.cfg.Headroom})
	}
	return out
}

// Apply takes the store's answer to the reports sent at sent (the local
// time before the request left) and received at recv (after the answer
// came). The lease's end is derived from sent, so it is early, never late;
// the end of the window, before which the share may not rise, from recv,
// so it is late, never early.
func (h *Host) Apply(sent, recv time.Time, reps []Report, ans Answer) error {
	if len(ans.Rules) != len(reps) {
		return fmt.Errorf("apply fleet answer: %d answers for %d reports", len(ans.Rules), len(reps))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls++
	h.failed = false
	T, L := h.cfg.Interval, h.cfg.Window
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	// The start of the answer's epoch, relative to the store's now.
	start := time.Duration(ans.Epoch)*T - ms(ans.NowMS)
	h.next = sent.Add(start + T + h.phase)
	byKey := make(map[string]*ruleState, len(h.rules))
	for _, r := range h.rules {
		byKey[r.Key] = r
	}
	for i, rep := range reps {
		r := byKey[rep.Key]
		if r == nil {
			continue // the rule went away during the exchange
		}
		ra := ans.Rules[i]
		before, _, beforeState := r.cap(sent, h.cfg.Guard)
		r.seen = true
		r.inAlloc = ra.In
		if !ra.In {
			// Not in this epoch's allocation: the safe share, knowing
			// the hosts that are.
			r.leased = false
			r.hosts = max(ra.Alloc.Hosts+1, ra.Reporting)
			continue
		}
		r.hosts = ra.Alloc.Hosts
		share := ra.Alloc.Share(ra.Demand)
		if r.leased && r.epoch == ans.Epoch {
			continue // the same epoch again: the lease in force stands
		}
		r.leased, r.epoch, r.share, r.granted = true, ans.Epoch, share, sent
		r.held = math.Min(share, before)
		r.heldSafe = beforeState != StateLeased
		r.window = recv.Add(start + L)
		r.until = sent.Add(start + T + L)
	}
	return nil
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

// Exchanges returns the counts of answered and failed exchanges.
func (h *Host) Exchanges() (answered, failed uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls, h.errs
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
		st := Status{Rule: r.Name, Key: r.Key, Share: rate, Demand: r.demand, State: state, Hosts: r.hosts, Epoch: r.epoch}
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
		switch {
		case !r.seen:
			return s, time.Time{}, StateNotContacted
		case !r.inAlloc:
			return s, time.Time{}, StateNew
		}
		return s, time.Time{}, StateExpired
	}
	rate := r.share
	if now.Before(r.window) {
		rate = r.held
	}
	if !now.Add(guard).Before(r.until) {
		// The lease ends before the next write may come: what is written
		// now must be safe without it.
		return math.Min(rate, s), time.Time{}, StateLeased
	}
	return rate, r.until, StateLeased
}

// Up tells whether the last exchange was answered.
func (h *Host) Up() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls > 0 && !h.failed
}
