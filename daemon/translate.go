package daemon

import (
	"fmt"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/control"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/fleet"
	"github.com/xlimit/xlimit/userspace/signal"
	"github.com/xlimit/xlimit/userspace/tcqueue"
)

// Specs is a rules file translated for each part of xlimit. It is the one
// place where config types become the types of the parts: the kernel
// program's compiler, the control loop, the kernel queues and the signal
// readers read nothing of the rules file but what they get here.
type Specs struct {
	// Dataplane is what the XDP program enforces.
	Dataplane *dataplane.Spec
	// Control are the rules the loop steers, in file order.
	Control []control.RuleSpec
	// Signals is what the signal readers need of every steered rule.
	Signals map[string]*signal.Rule
	// System is host-wide protection; nil when off. PressureHigh, when not
	// 0, also counts CPU pressure (PSI some avg10) as overload.
	System       *control.SystemParams
	PressureHigh float64
	// Queues are the kernel (TC) queues of paced rules with queue: kernel.
	Queues tcqueue.Spec
	// Feedback lists the rules steered by `signal: feedback`.
	Feedback []string
	// Fleet are the rules sharing a fleet budget (docs/fleet.md).
	Fleet []fleet.Rule
	// Probes maps the rules steered by `signal: probe` to their probe.
	Probes map[string]config.Probe
	// NotEnforced lists what a valid file asks for that this version does
	// not enforce, so that nobody mistakes a rule for protection it does
	// not give.
	NotEnforced []string
}

// Translate returns what each part needs of cfg, a validated rules file.
func Translate(cfg *config.Config) *Specs {
	s := &Specs{
		Dataplane: &dataplane.Spec{
			Allow:         cfg.Allow,
			Deny:          cfg.Deny,
			MalformedPass: cfg.Malformed == config.VerdictPass,
		},
		Signals:     map[string]*signal.Rule{},
		Probes:      map[string]config.Probe{},
		NotEnforced: notEnforced(cfg),
	}
	guardSpec(s.Dataplane, nil, cfg.Management) // guard.go
	if sc := cfg.SynCookies; sc != nil {
		s.Dataplane.CookieRate = sc.AnswerRate
	}
	if rs := cfg.Resets; rs != nil {
		s.Dataplane.ResetRate, s.Dataplane.ResetBurst = rs.Rate, rs.Burst
	}
	if sys := cfg.System; sys != nil {
		s.System = &control.SystemParams{CPUHigh: sys.CPUHigh}
		s.PressureHigh = sys.PressureHigh
	}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		s.Dataplane.Rules = append(s.Dataplane.Rules, dataplaneRule(r))
		if q, ok := kernelQueue(r); ok {
			s.Queues.Queues = append(s.Queues.Queues, q)
		}
		if a := r.Adaptive; a != nil {
			switch {
			case a.Signal == config.SignalFeedback:
				s.Feedback = append(s.Feedback, r.Name)
			case a.Signal == config.SignalProbe && a.Probe != nil:
				s.Probes[r.Name] = *a.Probe
			}
		}
		if r.Fleet != nil {
			s.Fleet = append(s.Fleet, fleetRule(r))
		}
		cr := controlRule(r)
		if !cr.Dynamic() && !(s.System != nil && cr.SynOnly) {
			continue
		}
		s.Control = append(s.Control, cr)
		s.Signals[r.Name] = signalRule(r)
		// A steered TCP rule's service rate: the kernel counts its
		// handshakes (bpf/resptime.h).
		if dr := &s.Dataplane.Rules[len(s.Dataplane.Rules)-1]; dr.Protocol == "tcp" || dr.Protocol == "any" {
			dr.ServiceRate = true
			// Track caps the connections in flight of a rule whose
			// signal measures connections that wait (the accept queue,
			// requests awaiting their response): the kernel counts them
			// (docs/control.md, "The setpoint and the in-flight cap").
			if a := r.Adaptive; a != nil && a.Law == config.LawTrack &&
				(a.Signal == config.SignalAcceptQueue || a.Signal == config.SignalResponseTime) {
				dr.InFlight = true
			}
		}
	}
	if len(s.Queues.Queues) > 0 {
		s.Queues.Allow = cfg.Allow
	}
	return s
}

func dataplaneRule(r *config.Rule) dataplane.RuleSpec {
	rs := dataplane.RuleSpec{
		Name:      r.Name,
		Protocol:  string(r.Protocol),
		SynOnly:   r.SynOnly,
		Sources:   r.Sources,
		Bytes:     r.Unit == config.UnitBytes,
		Rate:      r.StaticRate(), // a fleet rule's falls back to its safe_rate
		Burst:     r.EffectiveBurst(),
		Shadow:    r.Shadow,
		Fragments: string(r.Fragments),
		Ports:     r.MergedPorts(),
		// Compile checks the mode again; "" is off.
		SynCookies: string(r.SynCookies),
		Refuse:     string(r.Refuse),
	}
	if a := r.Adaptive; a != nil && a.Signal == config.SignalResponseTime {
		rs.ResponseTime = true
	}
	if c := r.Concurrency; c != nil {
		rs.Concurrency = &dataplane.ConcurrencySpec{Soft: c.Soft, Max: c.Max}
	}
	if ps := r.PerSource; ps != nil {
		rs.PerSource = &dataplane.PerSourceSpec{Rate: ps.Rate, Burst: ps.Burst, PrefixV4: ps.PrefixV4, PrefixV6: ps.PrefixV6}
		if ps.Ban != nil {
			rs.PerSource.BanAfter, rs.PerSource.BanDuration = ps.Ban.After, ps.Ban.Duration
		}
	}
	return rs
}

var behaviors = map[config.Behavior]control.Behavior{
	config.BehaviorReject:      control.BehaviorReject,
	config.BehaviorWarmUp:      control.BehaviorWarmUp,
	config.BehaviorPaced:       control.BehaviorPaced,
	config.BehaviorWarmUpPaced: control.BehaviorWarmUpPaced,
	config.BehaviorAdaptive:    control.BehaviorAdaptive,
}

func controlRule(r *config.Rule) control.RuleSpec {
	cr := control.RuleSpec{
		Name: r.Name, Behavior: behaviors[r.Behavior], Rate: r.Rate, Burst: r.EffectiveBurst(),
		Bytes: r.Unit == config.UnitBytes, SynOnly: r.SynOnly, Capped: r.Fleet != nil,
	}
	if w := r.WarmUp; w != nil {
		cr.WarmUp = &control.WarmUpParams{Period: w.Period, ColdFactor: w.ColdFactor}
	}
	if p := r.Paced; p != nil {
		cr.MaxQueueingTime = p.MaxQueueingTime
	}
	if a := r.Adaptive; a != nil {
		p := a.AdaptiveParams
		cr.Adaptive = &p
		cr.Signal = string(a.Signal)
		if a.Law == config.LawAIMD {
			cr.Law = control.LawAIMD
		}
	}
	if cb := r.CircuitBreaker; cb != nil {
		p := *cb
		cr.CircuitBreaker = &p
	}
	return cr
}

func signalRule(r *config.Rule) *signal.Rule {
	sr := &signal.Rule{Name: r.Name, Ports: r.MergedPorts(), SynOnly: r.SynOnly, Bytes: r.Unit == config.UnitBytes}
	if a := r.Adaptive; a != nil {
		sr.Signal = a.Signal
		// An adaptive rule on response_time counts and caps its requests
		// in flight, not its connections (issue 42): the kernel counts
		// them (bpf/request.h) and refuses a new request over the cap,
		// on a new or a kept-alive connection (bpf/request_tc.h).
		sr.Requests = a.Law == config.LawTrack && a.Signal == config.SignalResponseTime &&
			(r.Protocol == config.ProtoTCP || r.Protocol == config.ProtoAny)
	}
	if r.CircuitBreaker != nil {
		sr.SlowLatency = r.CircuitBreaker.SlowLatency
	}
	return sr
}

// kernelQueue is the kernel queue of a paced or warm_up_paced rule with
// queue: kernel, at its static rate. Shadow rules are not queued (shadow
// mode drops nothing).
func kernelQueue(r *config.Rule) (tcqueue.Queue, bool) {
	if !r.Behavior.IsPaced() || r.Paced == nil || r.Paced.Queue != config.QueueKernel || r.Shadow {
		return tcqueue.Queue{}, false
	}
	return tcqueue.Queue{
		Rule: r.Name, Protocol: tcqueue.Protocol(r.Protocol), Ports: r.MergedPorts(), Sources: r.Sources, SynOnly: r.SynOnly,
		Bytes: r.Unit == config.UnitBytes, Rate: r.Rate, MaxQueue: r.Paced.MaxQueueingTime,
	}, true
}

// notEnforced lists what a valid rules file asks for that this version
// does not enforce yet. Such rules run at their static rate and burst.
func notEnforced(cfg *config.Config) []string {
	var out []string
	add := func(r *config.Rule, what string) {
		out = append(out, fmt.Sprintf("rule %s (line %d): %s", r.Name, r.Line, what))
	}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		if cb := r.CircuitBreaker; cb != nil && cb.SlowRatio > 0 && (r.Adaptive == nil || r.Adaptive.Probe == nil) {
			add(r, "circuit_breaker slow_ratio without a probe (only probes are timed): only error_ratio, if set, applies")
		}
	}
	if cfg.System != nil {
		syn := false
		for i := range cfg.Rules {
			syn = syn || cfg.Rules[i].SynOnly
		}
		if !syn {
			out = append(out, "system protection (system: cpu_high) caps new-connection rules, and no rule is syn_only")
		}
	}
	return out
}

// fleetRule is what the fleet sharing needs of a rule with a fleet
// section.
func fleetRule(r *config.Rule) fleet.Rule {
	f := r.Fleet
	return fleet.Rule{Name: r.Name, Key: f.Key, Budget: f.Rate, Burst: f.Burst, SafeRate: f.SafeRate}
}
