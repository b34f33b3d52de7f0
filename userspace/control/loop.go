package control

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Kernel is what the loop needs of one interface's maps.
type Kernel interface {
	Counters(slot int) (dataplane.Counters, error)
	SetLimit(slot int, l dataplane.Limit) error
}

// Target is a rule's place on one interface: the loop reads the rule's
// counters there and writes its rate there.
type Target struct {
	Kernel Kernel
	Slot   int
	Epoch  uint32
}

// RuleSpec is what the loop steers of one rule. Rules whose behavior is
// reject or paced need no steering: the kernel's static bucket is all.
type RuleSpec struct {
	Name     string
	Behavior Behavior
	Rate     float64 // the static rate of the rules file
	Burst    float64 // the static burst (EffectiveBurst)
	Bytes    bool
	WarmUp   *WarmUpParams
	// MaxQueueingTime is a warm_up_paced rule's pacing bound.
	MaxQueueingTime time.Duration
	Adaptive        *AIMDParams
	// Law is an adaptive rule's law (LawTrack unless the rules file asks
	// for aimd).
	Law Law
	// Signal names what steers an adaptive rule (reported per tick).
	Signal  string
	SynOnly bool
	// CircuitBreaker, when not nil, gates the rule's new connections
	// (docs/design.md §5.8) whatever its behavior.
	CircuitBreaker *BreakerParams
	// Capped rules are bounded by the loop's Cap (a fleet share,
	// docs/fleet.md) whatever their behavior.
	Capped bool
}

// Dynamic reports whether the rule needs the loop.
func (r *RuleSpec) Dynamic() bool {
	if r.CircuitBreaker != nil || r.Capped {
		return true
	}
	switch r.Behavior {
	case BehaviorWarmUp, BehaviorWarmUpPaced, BehaviorAdaptive:
		return true
	}
	return false
}

// Sampler reads an adaptive rule's signals for one tick without blocking;
// what it cannot read this tick it marks stale. used is the rule's admitted
// rate over the last tick, from the kernel's counters.
type Sampler interface {
	Sample(rule *RuleSpec, used float64) Signals
}

// OutcomeSource reads, without blocking, what the service behind a rule
// with a circuit breaker did since the previous tick. admitted is what the
// kernel passed of the rule since then, in the rule's unit (new
// connections for a syn_only packet rule). fresh is false when nothing
// could be read this tick (the outcomes are then ignored).
type OutcomeSource interface {
	Outcomes(rule *RuleSpec, admitted uint64, now time.Time) (o Outcomes, fresh bool)
}

// Cap bounds the rate of capped rules: rate and burst at most, in force
// until until at the latest (zero: no bound beyond the loop's hold). It
// must not block; ok is false when it has nothing for the rule.
type Cap interface {
	Cap(rule string, now time.Time) (rate, burst float64, until time.Time, ok bool)
}

// RuleReport is one rule's state after a tick.
type RuleReport struct {
	Name    string
	Rate    float64 // the rate written to the kernel
	Burst   float64
	State   string // warming, warm, the AIMD action, static, system_capped, or the breaker's state for a rule steered by its breaker alone
	Breaker string // the breaker's state (closed, open, half_open); empty without a breaker
	// Transition is the breaker's change of state at this tick, if any.
	Transition *Transition
	Latency    time.Duration
	Signal     string // what steers the rule: counters (warm-up) or the adaptive signal
	Stale      bool
	Err        error // a kernel read or write failed
	// Demand is the rule's offered rate over the tick: packets/s seen by
	// the kernel, passed or not.
	Demand float64
	// InFlightCap is the cap on the rule's connections in flight written
	// with its rate, or on its requests in flight where the kernel counts
	// them (Signals.InFlightRequests; Limit.ReqCap); 0: none.
	InFlightCap uint32
}

// TickReport is the outcome of one tick.
type TickReport struct {
	Start    time.Time
	Duration time.Duration
	Rules    []RuleReport
}

// Loop is the control loop: every period it reads each dynamic rule's
// counters and signals, computes its rate with the rule's law and writes it
// to the kernel with a deadline. If the loop stops, the deadlines pass and
// the kernel falls back to the static rates (fail-static).
type Loop struct {
	clock   Clock
	monoNS  func() uint64
	period  time.Duration
	hold    time.Duration
	sampler Sampler
	outcome OutcomeSource
	cap     Cap
	rules   []*ruleState

	// System protection (docs/design.md §5.6): while the host's CPU usage is at
	// or above system.CPUHigh, new-connection (SYN-only) rules are capped
	// at the best rate their service completed work over the last
	// peakSeconds (the sampler's service rate; the admitted count where
	// none is read).
	system *SystemParams
	cpu    func() (usage float64, fresh bool)
}

// peakSeconds is how far back the capacity estimate of system protection
// looks.
const peakSeconds = 10

// systemMargin and systemDrain shape the cap of system protection:
// best completion rate × (1 + systemMargin) − queue / systemDrain. Its
// queue error shrinks by 1 − tick/systemDrain a tick (0.8 at 50 ms) toward
// systemMargin × best × systemDrain (10 connections, 25 ms of work, for a
// 400/s service).
const (
	systemMargin = 0.1
	systemDrain  = 250 * time.Millisecond
)

type ruleState struct {
	spec    RuleSpec
	targets []Target
	warm    *WarmUp
	aimd    *AIMD
	track   *Track
	breaker *Breaker

	primed      bool
	lastTick    time.Time
	lastPass    uint64              // passed units, all targets
	second      int64               // Unix second of secPass
	secPass     uint64              // passed units at the start of the current second
	secSeen     uint64              // packets seen at the start of the current second
	prevSecSeen uint64              // packets seen at the start of the previous second
	prevSecPass uint64              // passed units in the previous whole second
	peaks       [peakSeconds]uint64 // passed units of the last whole seconds
	peakNext    int
	lastSeen    uint64               // packets seen at the last tick
	lastRefused uint64               // packets its rate refused (reason rule) at the last tick
	served      float64              // units the service took, summed over ticks (service rate × dt)
	secServed   float64              // served at the start of the current second
	servedPeaks [peakSeconds]float64 // units served in the last whole seconds
	haveServed  bool                 // a service rate was read this second or before
	wholeSecond bool                 // the current second started after the loop did
	rate, burst float64
	state       string
	latency     time.Duration
}

// NewLoop returns a loop. monoNS reads the clock of the kernel's deadlines
// (CLOCK_MONOTONIC); hold is how long a written rate stays in force without
// a refresh.
func NewLoop(clock Clock, monoNS func() uint64, period, hold time.Duration, sampler Sampler) (*Loop, error) {
	if period < 10*time.Millisecond || period > 500*time.Millisecond {
		return nil, fmt.Errorf("new loop: period %v: %w (10ms to 500ms)", period, ErrInvalid)
	}
	if hold < 2*period {
		return nil, fmt.Errorf("new loop: hold %v below two periods: %w", hold, ErrInvalid)
	}
	return &Loop{clock: clock, monoNS: monoNS, period: period, hold: hold, sampler: sampler}, nil
}

// SetSystem turns system protection on (sys not nil) with a reader of the
// host's CPU usage; call Configure afterwards.
func (l *Loop) SetSystem(sys *SystemParams, cpu func() (float64, bool)) {
	l.system, l.cpu = sys, cpu
}

// SetSampler sets what reads adaptive rules' signals (nil: none, and
// adaptive rules hold their rate).
func (l *Loop) SetSampler(s Sampler) { l.sampler = s }

// SetOutcomes sets what reads breaker rules' outcomes (nil: none; their
// breakers then stay closed, or time out of OPEN into HALF_OPEN and wait).
func (l *Loop) SetOutcomes(o OutcomeSource) { l.outcome = o }

// SetCap sets what bounds capped rules (nil: nothing, they run at their
// own rate).
func (l *Loop) SetCap(c Cap) { l.cap = c }

// Period is the tick period.
func (l *Loop) Period() time.Duration { return l.period }

// Configure sets the rules to steer and where they live. A rule whose spec
// is unchanged keeps its law's state (warm-up progress, AIMD rate); a new
// or changed rule starts afresh.
func (l *Loop) Configure(rules []RuleSpec, targets map[string][]Target) error {
	old := make(map[string]*ruleState, len(l.rules))
	for _, r := range l.rules {
		old[r.spec.Name] = r
	}
	var next []*ruleState
	for _, spec := range rules {
		if !spec.Dynamic() && !(l.system != nil && spec.SynOnly) {
			continue
		}
		if st, ok := old[spec.Name]; ok && reflect.DeepEqual(st.spec, spec) {
			st.targets = targets[spec.Name]
			next = append(next, st)
			continue
		}
		st := &ruleState{spec: spec, targets: targets[spec.Name], rate: spec.Rate, burst: spec.Burst}
		switch spec.Behavior {
		case BehaviorWarmUp, BehaviorWarmUpPaced:
			w, err := NewWarmUp(spec.Rate, spec.WarmUp.Period, spec.WarmUp.ColdFactor)
			if err != nil {
				return fmt.Errorf("configure rule %s: %w", spec.Name, err)
			}
			st.warm = w
		case BehaviorAdaptive:
			if spec.Law == LawAIMD {
				a, err := NewAIMD(*spec.Adaptive, spec.Rate)
				if err != nil {
					return fmt.Errorf("configure rule %s: %w", spec.Name, err)
				}
				st.aimd = a
				break
			}
			p := spec.Adaptive
			tr, err := NewTrack(TrackParams{TargetLatency: p.TargetLatency, MinRate: p.MinRate, MaxRate: p.MaxRate, ErrorThreshold: p.ErrorThreshold,
				LatencyOnly: spec.Signal == "probe" || spec.Signal == "feedback"}, spec.Rate)
			if err != nil {
				return fmt.Errorf("configure rule %s: %w", spec.Name, err)
			}
			st.track = tr
		}
		if spec.CircuitBreaker != nil {
			b, err := NewBreaker(*spec.CircuitBreaker, l.clock.Now())
			if err != nil {
				return fmt.Errorf("configure rule %s: %w", spec.Name, err)
			}
			st.breaker = b
		}
		next = append(next, st)
	}
	l.rules = next
	return nil
}

// Tick runs one control period.
func (l *Loop) Tick() TickReport {
	now := l.clock.Now()
	rep := TickReport{Start: now}
	for _, r := range l.rules {
		rep.Rules = append(rep.Rules, l.tickRule(r, now))
	}
	rep.Duration = l.clock.Now().Sub(now)
	return rep
}

func (l *Loop) tickRule(r *ruleState, now time.Time) RuleReport {
	rep := RuleReport{Name: r.spec.Name, Signal: "counters"}
	if r.spec.Adaptive != nil {
		rep.Signal = r.spec.Signal
	} else if r.breaker != nil && r.warm == nil {
		rep.Signal = "breaker"
	}
	pass, seen, refused, err := r.read()
	if err != nil {
		// Keep the last rate; the deadline will pass if this persists.
		rep.Err, rep.Stale = err, true
		rep.Rate, rep.Burst, rep.State, rep.Latency = r.rate, r.burst, r.state, r.latency
		if r.breaker != nil {
			rep.Breaker = r.breaker.State().String()
		}
		return rep
	}
	sec := now.Unix()
	if !r.primed {
		r.primed, r.second, r.secPass, r.secSeen, r.prevSecSeen = true, sec, pass, seen, seen
		r.lastTick, r.lastPass, r.lastSeen, r.lastRefused = now, pass, seen, refused
	}
	if sec != r.second {
		// The previous whole second's count; after a gap of several
		// seconds the loop saw none of them whole, and Sentinel would
		// see nothing passed in the previous one.
		r.prevSecPass = 0
		r.prevSecSeen = seen
		if sec == r.second+1 {
			r.prevSecPass = pass - r.secPass
			r.prevSecSeen = r.secSeen
		}
		r.peaks[r.peakNext] = r.prevSecPass
		r.servedPeaks[r.peakNext] = 0
		if sec == r.second+1 && r.wholeSecond {
			// The first second the loop saw was partial: its count
			// would start system protection far below the service's
			// capacity.
			r.servedPeaks[r.peakNext] = r.served - r.secServed
		}
		r.wholeSecond = true
		r.secServed = r.served
		r.peakNext = (r.peakNext + 1) % peakSeconds
		r.second, r.secPass, r.secSeen = sec, pass, seen
	}
	elapsed := now.Sub(r.lastTick)
	dt := elapsed.Seconds()
	used, demand, rateRefused := 0.0, 0.0, 0.0
	if dt > 0 {
		used = float64(pass-r.lastPass) / dt
		demand = float64(seen-r.lastSeen) / dt
		rateRefused = float64(refused-r.lastRefused) / dt
	}
	admitted := pass - r.lastPass
	r.lastTick, r.lastPass, r.lastSeen, r.lastRefused = now, pass, seen, refused
	rep.Demand = demand

	// The signals, for an adaptive rule and for the service rate that
	// system protection caps a rule at.
	var sig Signals
	sampled := false
	if l.sampler != nil && (r.aimd != nil || r.track != nil || (l.system != nil && r.spec.SynOnly)) {
		sig, sampled = l.sampler.Sample(&r.spec, used), true
		if r.spec.Bytes {
			// The demand in bytes is not counted (the seen counter
			// counts packets): unknown.
			demand = 0
		}
		sig.Demand = demand
		sig.RateRefused = rateRefused
		if sig.HasServiceRate && sig.ServiceRate >= 0 && dt > 0 {
			r.served += sig.ServiceRate * dt
			r.haveServed = true
		}
	}

	rate, burst := r.rate, r.burst
	// The cap on connections in flight (Limit.ConcCap), or on requests in
	// flight (Limit.ReqCap) where the signals counted requests.
	var inFlightCap, reqCap uint32
	switch {
	case r.warm != nil:
		// Sentinel syncs its tokens on the first request of a second; the
		// loop syncs on the first tick of a second in which, or in the
		// second before which, the rule saw traffic. An idle rule is not
		// synced, so it cools down as in Sentinel (see WarmUp.Rate).
		rate = r.warm.Rate(now, r.prevSecPass, seen > r.prevSecSeen)
		r.state = "warm"
		if rate < r.spec.Rate {
			r.state = "warming"
		}
		// The burst shrinks with the rate: a cold service must not take
		// a whole second of the stable rate at once.
		burst = r.spec.Burst * rate / r.spec.Rate
		if r.spec.Behavior == BehaviorWarmUpPaced {
			burst = PacedBurst(rate, r.spec.MaxQueueingTime)
		}
	case r.aimd != nil, r.track != nil:
		if !sampled {
			sig = Signals{LatencyStale: true, ErrorsStale: true, CPUStale: true, UsedRate: used, Demand: demand, RateRefused: rateRefused}
		}
		var step Step
		if r.aimd != nil {
			step = r.aimd.Step(sig)
		} else {
			step = r.track.Step(sig, elapsed)
		}
		rate = step.Rate
		burst = r.spec.Burst * rate / r.spec.Rate
		if step.MaxBurst > 0 {
			burst = min(burst, step.MaxBurst)
		}
		if step.InFlightCap >= 1 {
			inFlightCap = uint32(min(step.InFlightCap, math.MaxUint32))
		}
		rep.InFlightCap = inFlightCap
		if sig.InFlightRequests {
			inFlightCap, reqCap = 0, inFlightCap
		}
		r.state, r.latency = step.Action.String(), step.Smoothed
		rep.Stale = step.Action == ActionHoldStale
	}
	if l.system != nil && r.spec.SynOnly && l.cpu != nil {
		// Sentinel's BBR check admits while in flight ≤ max completion
		// rate × min latency; at the host edge that is: never admit new
		// connections faster than the best rate the service completed
		// lately, while the host is overloaded.
		if usage, fresh := l.cpu(); fresh && usage >= l.system.CPUHigh {
			// Completed work, not admitted work: under a flood that
			// saturates the rule the admitted count is the rate itself
			// and a cap at it never engages.
			capacity := float64(slices.Max(r.peaks[:]))
			if r.haveServed {
				capacity = math.Floor(slices.Max(r.servedPeaks[:]))
				if sampled && sig.HasQueue && capacity >= 1 {
					// cap = best × (1 + margin) − queue / drain holds
					// the service's queue at margin × best × drain (a
					// tenth of 250 ms of its work): the service stays
					// busy, so what it completes is its capacity and the
					// best rate follows it. A cap at the best rate
					// alone holds the queue where the flood left it;
					// one that drains it to empty underfeeds the service,
					// which then completes less than the cap, and the
					// next cap is lower: a ratchet (seen live).
					capacity = max(capacity*(1+systemMargin)-sig.QueueDepth/systemDrain.Seconds(), 1)
				}
			}
			if capacity >= 1 && capacity < rate {
				burst *= capacity / rate
				rate = capacity
				r.state = "system_capped"
			}
		} else if r.state == "system_capped" {
			r.state = ""
		}
	}
	var gate dataplane.Gate
	if r.breaker != nil {
		gate = l.stepBreaker(r, admitted, now, &rep)
	}
	if r.warm == nil && r.aimd == nil && r.track == nil && r.state != "system_capped" {
		r.state = "static"
		if r.breaker != nil {
			r.state = rep.Breaker
		}
	}
	deadline := l.monoNS() + uint64(l.hold)
	if r.spec.Capped && l.cap != nil {
		// min(the rule's own rate, the cap), in force no longer than the
		// cap's lease.
		if c, cb, until, ok := l.cap.Cap(r.spec.Name, now); ok {
			if c < rate && rate > 0 {
				burst *= c / rate
				rate = c
			}
			burst = math.Min(burst, cb)
			if d := until.Sub(now); !until.IsZero() && d < l.hold {
				deadline = l.monoNS() + uint64(max(d, 0))
			}
		}
	}
	if !r.spec.Bytes {
		burst = math.Max(burst, 1)
	}
	if r.warm == nil && r.aimd == nil && r.track == nil {
		// A static rule steered only by system protection or its breaker
		// keeps its own rate whenever the host is not overloaded.
		r.rate, r.burst = r.spec.Rate, r.spec.Burst
		rep.Rate, rep.Burst, rep.State = rate, burst, r.state
		rep.Err = r.write(rate, burst, gate, 0, 0, deadline)
		return rep
	}
	r.rate, r.burst = rate, burst
	rep.Rate, rep.Burst, rep.State, rep.Latency = rate, burst, r.state, r.latency
	rep.Err = r.write(rate, burst, gate, inFlightCap, reqCap, deadline)
	return rep
}

// stepBreaker feeds the rule's breaker this tick's outcomes and returns
// the gate to put in force with the rule's rate.
func (l *Loop) stepBreaker(r *ruleState, admitted uint64, now time.Time, rep *RuleReport) dataplane.Gate {
	var o Outcomes
	fresh := false
	if l.outcome != nil {
		o, fresh = l.outcome.Outcomes(&r.spec, admitted, now)
	}
	if !fresh {
		o = Outcomes{}
		if rep.Signal == "breaker" {
			rep.Stale = true
		}
	}
	if tr, changed := r.breaker.Step(now, o); changed {
		rep.Transition = &tr
	}
	rep.Breaker = r.breaker.State().String()
	return r.breaker.Gate()
}

// read sums the rule's passed units, seen packets and packets refused by
// its rate (reason rule) over its targets.
func (r *ruleState) read() (pass, seen, refused uint64, err error) {
	for _, t := range r.targets {
		c, err := t.Kernel.Counters(t.Slot)
		if err != nil {
			return 0, 0, 0, fmt.Errorf("read counters of %s: %w", r.spec.Name, err)
		}
		refused += c.Reasons[dataplane.ReasonRule]
		if r.spec.Bytes {
			pass += c.Bytes[dataplane.VerdictPass]
		} else {
			pass += c.Packets[dataplane.VerdictPass]
		}
		for v := range dataplane.VerdictMax {
			seen += c.Packets[v]
		}
	}
	return pass, seen, refused, nil
}

func (r *ruleState) write(rate, burst float64, gate dataplane.Gate, inFlightCap, reqCap uint32, deadline uint64) error {
	b, err := dataplane.NewBucket(rate, burst, r.spec.Bytes)
	if err != nil {
		return fmt.Errorf("rate of %s: %w", r.spec.Name, err)
	}
	for _, t := range r.targets {
		if err := t.Kernel.SetLimit(t.Slot, dataplane.Limit{Bucket: b, DeadlineNS: deadline, Epoch: t.Epoch, Gate: gate, ConcCap: inFlightCap, ReqCap: reqCap}); err != nil {
			return fmt.Errorf("write rate of %s: %w", r.spec.Name, err)
		}
	}
	return nil
}
