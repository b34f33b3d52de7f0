package main

import (
	"fmt"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// dataplaneSpec is what the kernel program enforces of a rules file.
func dataplaneSpec(cfg *config.Config) *dataplane.Spec {
	s := &dataplane.Spec{
		Allow:         cfg.Allow,
		Deny:          cfg.Deny,
		MalformedPass: cfg.Malformed == config.VerdictPass,
	}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		rs := dataplane.RuleSpec{
			Name:      r.Name,
			Protocol:  string(r.Protocol),
			SynOnly:   r.SynOnly,
			Sources:   r.Sources,
			Bytes:     r.Unit == config.UnitBytes,
			Rate:      r.Rate,
			Burst:     r.EffectiveBurst(),
			Shadow:    r.Shadow,
			Fragments: string(r.Fragments),
		}
		for _, p := range r.MergedPorts() {
			rs.Ports = append(rs.Ports, dataplane.PortRange{Lo: p.Lo, Hi: p.Hi})
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
		s.Rules = append(s.Rules, rs)
	}
	return s
}

// notEnforced lists what a valid rules file asks for that this version
// does not enforce yet, so that nobody mistakes a rule for protection it
// does not give. Such rules run at their static rate and burst.
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
