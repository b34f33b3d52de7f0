package config

import (
	"math"

	"go.yaml.in/yaml/v3"
)

var (
	ruleKeys = []string{"name", "protocol", "ports", "syn_only", "sources", "unit", "rate", "burst",
		"behavior", "warm_up", "paced", "adaptive", "per_source", "concurrency", "circuit_breaker",
		"shadow", "fragments", "refuse", "syn_cookies"}
	warmUpKeys   = []string{"period", "cold_factor"}
	pacedKeys    = []string{"max_queueing_time", "queue"}
	adaptiveKeys = []string{"target_latency", "min_rate", "max_rate", "ka", "km", "gamma", "alpha",
		"cpu_high", "error_threshold", "signal", "probe", "law"}
	probeKeys       = []string{"kind", "address", "path", "interval", "timeout"}
	perSourceKeys   = []string{"rate", "burst", "prefix_v4", "prefix_v6", "ban"}
	banKeys         = []string{"after", "duration"}
	concurrencyKeys = []string{"soft", "max"}
	breakerKeys     = []string{"slow_latency", "slow_ratio", "error_ratio", "min_requests", "window",
		"retry_timeout", "half_open_probes"}
)

// ruleCtx is what a rule's sections need to know about the rule itself.
type ruleCtx struct {
	rate   float64
	rateAt loc
	rateOK bool
	unit   Unit
	unitOK bool
	// active is true when the rule's behavior uses the section being
	// decoded; checks against the rule run only then.
	active bool
}

// rateBounds returns the allowed rate range of a unit.
func rateBounds(u Unit) (lo, hi float64, name string) {
	if u == UnitBytes {
		return MinByteRate, MaxByteRate, "bytes"
	}
	return MinPacketRate, MaxPacketRate, "packets"
}

// checkRate reports whether v is a valid rate in unit u (only v > 0 is
// checked when the unit is unknown).
func (p *parser) checkRate(at loc, v float64, u Unit, unitOK bool) bool {
	lo, hi, name := rateBounds(u)
	switch {
	case v <= 0:
		p.errorf(at, "must be greater than 0, got %g", v)
	case !unitOK:
		return true
	case v < lo:
		p.errorf(at, "%g is below the minimum of %g %s per second", v, lo, name)
	case v > hi:
		p.errorf(at, "%g is above the maximum of %g %s per second", v, hi, name)
	default:
		return true
	}
	return false
}

// checkBurstSeconds reports whether a bucket of burst at rate holds at most
// MaxBurstSeconds of traffic.
func (p *parser) checkBurstSeconds(at loc, burst, rate float64) bool {
	if secs := burst / rate; secs > MaxBurstSeconds {
		p.errorf(at, "a burst of %g at rate %g holds %.0f s of traffic; at most %d s (24h) is allowed",
			burst, rate, secs, MaxBurstSeconds)
		return false
	}
	return true
}

func (p *parser) required(m *mapping, keys ...string) {
	for _, k := range keys {
		if !m.has(k) {
			p.errorf(m.at(k), "required key is missing")
		}
	}
}

// rule decodes and validates one item of the rules list. It returns nil
// when the item is not a mapping, and the location of the name.
func (p *parser) rule(raw *yaml.Node, path string) (*Rule, loc) {
	m := p.mapping(raw, path, ruleKeys)
	if m == nil {
		if isNull(p.deref(raw)) {
			p.errorf(loc{raw, path}, "empty rule: expected a mapping with at least name, protocol and rate")
		}
		return nil, loc{}
	}
	r := &Rule{Line: raw.Line, Unit: UnitPackets, Behavior: BehaviorReject, Fragments: FragmentsLimit}
	p.required(m, "name", "protocol", "rate")

	name, nameAt, ok := p.str(m, "name")
	if ok {
		if problem := checkRuleName(name); problem != "" {
			p.errorf(nameAt, "%s", problem)
		} else {
			r.Name = name
		}
	}

	proto, _, protoOK := enum(p, m, "protocol", ProtoTCP, ProtoUDP, ProtoICMP, ProtoAny)
	r.Protocol = proto

	items, portsAt, hasPorts := p.list(m, "ports")
	if hasPorts && len(items) == 0 {
		p.errorf(portsAt, "empty list: omit ports to match every port")
	}
	for i, item := range items {
		if p.stopped {
			break
		}
		if pr, ok := p.port(item, index(portsAt.path, i)); ok {
			r.Ports = append(r.Ports, pr)
		}
	}
	hasPorts = hasPorts && len(items) > 0

	synOnly, synAt, _ := p.boolean(m, "syn_only")
	r.SynOnly = synOnly

	sources, sourcesAt, nSources, hasSources := p.prefixes(m, "sources")
	if hasSources && nSources == 0 {
		p.errorf(sourcesAt, "empty list: omit sources to match every source")
	}
	r.Sources = sources

	unitOK := true
	if m.has("unit") {
		r.Unit, _, unitOK = enum(p, m, "unit", UnitPackets, UnitBytes)
	}
	if synOnly && r.Unit == UnitBytes {
		p.errorf(m.at("unit"), "bytes cannot be combined with syn_only, which counts new connections")
	}

	rate, rateAt, rateOK := p.number(m, "rate")
	if rateOK {
		rateOK = p.checkRate(rateAt, rate, r.Unit, unitOK)
	}
	if rateOK {
		r.Rate = rate
	}

	burst, burstAt, burstOK := p.number(m, "burst")
	if burstOK {
		switch {
		case burst <= 0:
			p.errorf(burstAt, "must be greater than 0, got %g", burst)
			burstOK = false
		case unitOK && r.Unit == UnitBytes && burst < MinByteBurst:
			p.errorf(burstAt, "%g bytes is smaller than one full-size frame (%d bytes)", burst, MinByteBurst)
			burstOK = false
		case unitOK && r.Unit == UnitPackets && burst < 1:
			p.errorf(burstAt, "%g is smaller than one packet (minimum 1)", burst)
			burstOK = false
		default:
			r.Burst = burst
		}
	}

	behOK := true
	var behAt loc
	if m.has("behavior") {
		r.Behavior, behAt, behOK = enum(p, m, "behavior", BehaviorReject, BehaviorWarmUp, BehaviorPaced, BehaviorWarmUpPaced, BehaviorAdaptive)
	}

	if v, _, ok := p.boolean(m, "shadow"); ok {
		r.Shadow = v
	}
	if m.has("fragments") {
		if v, at, ok := enum(p, m, "fragments", FragmentsIgnore, FragmentsLimit, FragmentsDrop); ok {
			if v == FragmentsDrop && !hasPorts {
				p.errorf(at, "%s applies only to rules with ports: a TCP or UDP rule without ports follows fragments (limit) or charges each as it comes (ignore)", v)
			}
			r.Fragments = v
		}
	}

	if m.has("refuse") {
		if v, at, ok := enum(p, m, "refuse", RefuseDrop, RefuseReset); ok {
			if v == RefuseReset && protoOK && proto != ProtoTCP && proto != ProtoAny {
				p.errorf(at, "reset answers TCP SYNs: requires protocol tcp (protocol is %s)", proto)
			}
			if v == RefuseReset {
				r.Refuse = v
			}
		}
	}

	if m.has("syn_cookies") {
		if v, at, ok := enum(p, m, "syn_cookies", SynCookiesOff, SynCookiesAuto, SynCookiesAlways); ok {
			if v != SynCookiesOff && !synOnly {
				p.errorf(at, "%s answers SYNs of a new-connection rule: requires syn_only: true (and protocol tcp)", v)
			}
			r.SynCookies = v
		}
	}

	// Options that need a particular protocol.
	if protoOK && proto != ProtoTCP {
		if synOnly {
			p.errorf(synAt, "requires protocol tcp (protocol is %s)", proto)
		}
		if m.has("concurrency") {
			p.errorf(m.keyAt("concurrency"), "requires protocol tcp (protocol is %s)", proto)
		}
	}
	if protoOK && proto == ProtoICMP && hasPorts {
		p.errorf(portsAt, "not allowed with protocol icmp: ICMP has no ports")
	}

	// Behaviour sections: decode every one that is present, use those that
	// the behavior needs, warn about the others.
	ctx := ruleCtx{rate: rate, rateAt: rateAt, rateOK: rateOK, unit: r.Unit, unitOK: unitOK}
	sectionFor := func(key string, uses bool, what string) bool {
		active := behOK && uses
		if behOK && !uses && m.has(key) {
			p.warnf(m.keyAt(key), "ignored: behavior is %s, and %s", r.Behavior, what)
		}
		return active
	}

	ctx.active = sectionFor("warm_up", r.Behavior.WarmsUp(), "warm_up applies only to warm_up and warm_up_paced")
	if w := p.warmUp(m, ctx); ctx.active {
		r.WarmUp = w
		if !m.has("warm_up") {
			p.errorf(loc{behAt.node, sub(path, "warm_up")}, "behavior %s requires a warm_up section with period", r.Behavior)
		}
	}

	ctx.active = sectionFor("paced", r.Behavior.IsPaced(), "paced applies only to paced and warm_up_paced")
	if pc := p.paced(m, ctx); ctx.active {
		if pc == nil && !m.has("paced") {
			pc = &Paced{MaxQueueingTime: DefaultMaxQueueingTime, Queue: QueueNone}
		}
		r.Paced = pc
		if m.has("burst") {
			p.errorf(m.at("burst"), "conflicts with paced.max_queueing_time: a paced rule's burst follows from rate × max_queueing_time")
			burstOK = false
		}
	}

	if pc := r.Paced; pc != nil && pc.Queue == QueueKernel {
		// What the kernel queue (TC u32 filters to an IFB, userspace/tcqueue) can do.
		at := m.keyAt("paced")
		switch {
		case protoOK && proto == ProtoICMP:
			p.errorf(at, "queue: kernel queues TCP and UDP; protocol icmp can use queue: none")
		case protoOK && proto == ProtoAny && !hasPorts:
			p.errorf(at, "queue: kernel with protocol any needs ports (it then queues TCP and UDP)")
		}
		if rateOK && unitOK && r.Unit == UnitPackets && rate*pc.MaxQueueingTime.Seconds() < 1 {
			p.errorf(at, "queue: kernel needs rate × max_queueing_time of at least one packet, got %g", rate*pc.MaxQueueingTime.Seconds())
		}
	}

	ctx.active = sectionFor("adaptive", r.Behavior == BehaviorAdaptive, "adaptive applies only to behavior adaptive")
	if a := p.adaptive(m, ctx); ctx.active {
		r.Adaptive = a
		if a != nil && a.Signal == SignalResponseTime && protoOK && proto != ProtoTCP && proto != ProtoAny {
			// The wire's TCP requests and responses (resptime.h).
			p.errorf(m.keyAt("adaptive"), "signal response_time times TCP requests and responses; the rule's protocol is %s", proto)
		}
		if a != nil && a.Signal == SignalSocketQueue {
			// The receive queues of the rule's UDP sockets, found by port.
			at := m.keyAt("adaptive")
			switch {
			case protoOK && proto != ProtoUDP && proto != ProtoAny:
				p.errorf(at, "signal socket_queue reads UDP sockets; the rule's protocol is %s", proto)
			case !hasPorts:
				p.errorf(at, "signal socket_queue needs the rule's ports (it reads the sockets bound to them)")
			}
		}
		if !m.has("adaptive") {
			p.errorf(loc{behAt.node, sub(path, "adaptive")}, "behavior adaptive requires an adaptive section with target_latency, min_rate and max_rate")
		}
	}

	if burstOK && rateOK && !r.Behavior.IsPaced() {
		p.checkBurstSeconds(burstAt, burst, rate)
	}

	r.PerSource = p.perSource(m)
	r.Concurrency = p.concurrency(m)
	r.CircuitBreaker = p.circuitBreaker(m)
	r.Fleet = p.fleet(m, ruleCtx{unit: r.Unit, unitOK: true}, r.Name)
	return r, nameAt
}

// noNewErrors reports whether no error was recorded since the count was
// before.
func (p *parser) noNewErrors(before int) bool { return len(p.errs) == before }

func (p *parser) warmUp(rule *mapping, ctx ruleCtx) *WarmUp {
	s := p.section(rule, "warm_up", warmUpKeys)
	if s == nil {
		return nil
	}
	before := len(p.errs)
	w := &WarmUp{ColdFactor: DefaultColdFactor}
	p.required(s, "period")
	period, periodAt, periodOK := p.duration(s, "period", false)
	w.Period = period
	cold, coldAt, coldOK := p.number(s, "cold_factor")
	if coldOK {
		if cold <= 1 {
			p.errorf(coldAt, "must be greater than 1, got %g", cold)
			coldOK = false
		} else {
			w.ColdFactor = cold
		}
	} else {
		coldOK = !s.has("cold_factor")
	}
	if ctx.active && ctx.rateOK && ctx.unitOK && coldOK {
		lo, _, name := rateBounds(ctx.unit)
		if cr := ctx.rate / w.ColdFactor; cr < lo {
			p.errorf(s.at("cold_factor"), "the cold rate rate / cold_factor = %g is below the minimum of %g %s per second", cr, lo, name)
		}
		// Sentinel's token arithmetic: maxToken − warningToken =
		// ⌊2·T·count/(1+c)⌋ must be at least 1, or the slope divides by 0.
		if need := (1 + w.ColdFactor) / 2; periodOK && period.Seconds()*ctx.rate < need {
			p.errorf(periodAt, "too short for rate %g: period × rate must be at least (1 + cold_factor) / 2 = %g", ctx.rate, need)
		}
	}
	if !p.noNewErrors(before) {
		return nil
	}
	return w
}

func (p *parser) paced(rule *mapping, ctx ruleCtx) *Paced {
	s := p.section(rule, "paced", pacedKeys)
	if s == nil {
		return nil
	}
	before := len(p.errs)
	pc := &Paced{MaxQueueingTime: DefaultMaxQueueingTime, Queue: QueueNone}
	if d, _, ok := p.duration(s, "max_queueing_time", false); ok {
		pc.MaxQueueingTime = d
	}
	if q, _, ok := enum(p, s, "queue", QueueNone, QueueKernel); ok {
		pc.Queue = q
	}
	if ctx.active && ctx.rateOK && ctx.unitOK && p.noNewErrors(before) {
		r := Rule{Rate: ctx.rate, Unit: ctx.unit, Behavior: BehaviorPaced, Paced: pc}
		p.checkBurstSeconds(s.at("max_queueing_time"), r.EffectiveBurst(), ctx.rate)
	}
	if !p.noNewErrors(before) {
		return nil
	}
	return pc
}

func (p *parser) adaptive(rule *mapping, ctx ruleCtx) *Adaptive {
	s := p.section(rule, "adaptive", adaptiveKeys)
	if s == nil {
		return nil
	}
	before := len(p.errs)
	a := &Adaptive{Law: LawTrack, AdaptiveParams: AdaptiveParams{KA: DefaultKA, KM: DefaultKM, Gamma: DefaultGamma,
		Alpha: DefaultAlpha, CPUHigh: DefaultCPUHigh, ErrorThreshold: DefaultErrorThreshold}, Signal: SignalAcceptQueue}
	if v, _, ok := enum(p, s, "law", LawTrack, LawAIMD); ok {
		a.Law = v
	}
	p.required(s, "target_latency", "min_rate", "max_rate")
	a.TargetLatency, _, _ = p.duration(s, "target_latency", false)
	minRate, minAt, minOK := p.number(s, "min_rate")
	if minOK {
		minOK = p.checkRate(minAt, minRate, ctx.unit, ctx.unitOK)
	}
	maxRate, maxAt, maxOK := p.number(s, "max_rate")
	if maxOK {
		maxOK = p.checkRate(maxAt, maxRate, ctx.unit, ctx.unitOK)
	}
	a.MinRate, a.MaxRate = minRate, maxRate
	if minOK && maxOK && minRate > maxRate {
		p.errorf(minAt, "min_rate %g is above max_rate %g", minRate, maxRate)
		minOK = false
	}
	if minOK && maxOK && ctx.active && ctx.rateOK && (ctx.rate < minRate || ctx.rate > maxRate) {
		p.errorf(ctx.rateAt, "%g is outside adaptive [min_rate %g, max_rate %g]; an adaptive rule starts at its rate", ctx.rate, minRate, maxRate)
	}
	if v, at, ok := p.number(s, "ka"); ok {
		if v <= 0 {
			p.errorf(at, "must be greater than 0, got %g", v)
		}
		a.KA = v
	}
	if v, _, ok := p.fraction(s, "km", false, true); ok {
		a.KM = v
	}
	if v, _, ok := p.fraction(s, "gamma", false, false); ok {
		a.Gamma = v
	}
	if v, _, ok := p.fraction(s, "alpha", false, true); ok {
		a.Alpha = v
	}
	if v, _, ok := p.fraction(s, "cpu_high", false, true); ok {
		a.CPUHigh = v
	}
	if v, _, ok := p.fraction(s, "error_threshold", true, true); ok {
		a.ErrorThreshold = v
	}
	if v, _, ok := enum(p, s, "signal", SignalAcceptQueue, SignalProbe, SignalFeedback, SignalSocketQueue, SignalResponseTime); ok {
		a.Signal = v
	}
	if a.Law == LawTrack && ctx.active {
		for _, k := range []string{"ka", "km", "gamma", "alpha", "cpu_high"} {
			if s.has(k) {
				p.warnf(s.keyAt(k), "ignored: %s is a gain of law aimd; law track has none", k)
			}
		}
	}
	probe := p.probe(s)
	switch {
	case a.Signal == SignalProbe && !s.has("probe"):
		p.errorf(s.at("signal"), "signal probe requires a probe section (kind and address)")
	case a.Signal == SignalProbe:
		a.Probe = probe
	case s.has("probe") && p.noNewErrors(before):
		p.warnf(s.keyAt("probe"), "ignored: signal is %s, and probe is used only with signal probe", a.Signal)
	}
	if !p.noNewErrors(before) {
		return nil
	}
	return a
}

func (p *parser) probe(adaptive *mapping) *Probe {
	s := p.section(adaptive, "probe", probeKeys)
	if s == nil {
		return nil
	}
	pr := &Probe{Interval: DefaultProbeInterval, Timeout: DefaultProbeTimeout}
	p.required(s, "kind", "address")
	pr.Kind, _, _ = enum(p, s, "kind", ProbeTCP, ProbeHTTP)
	if addr, at, ok := p.str(s, "address"); ok {
		if problem := checkProbeAddress(addr); problem != "" {
			p.errorf(at, "%s", problem)
		}
		pr.Address = addr
	}
	if pr.Kind == ProbeHTTP {
		pr.Path = DefaultProbePath
	}
	if path, at, ok := p.str(s, "path"); ok {
		switch {
		case pr.Kind == ProbeTCP:
			p.errorf(at, "only kind http has a path")
		case len(path) == 0 || path[0] != '/':
			p.errorf(at, "must start with '/', got %s", quote(path))
		case hasSpaceOrControl(path):
			p.errorf(at, "must not contain spaces or control characters (escape them as %%20 etc.)")
		default:
			pr.Path = path
		}
	}
	intervalOK, timeoutOK := true, true
	if s.has("interval") {
		pr.Interval, _, intervalOK = p.durationAtLeast(s, "interval", MinProbeInterval)
	}
	var timeoutAt loc
	if s.has("timeout") {
		pr.Timeout, timeoutAt, timeoutOK = p.duration(s, "timeout", false)
	}
	if intervalOK && timeoutOK && pr.Timeout > pr.Interval {
		if timeoutAt.node == nil {
			timeoutAt = s.at("interval")
			p.errorf(timeoutAt, "%s is shorter than the probe timeout %s", pr.Interval, pr.Timeout)
		} else {
			p.errorf(timeoutAt, "%s exceeds the probe interval %s", pr.Timeout, pr.Interval)
		}
	}
	return pr
}

func hasSpaceOrControl(s string) bool {
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return true
		}
	}
	return false
}

func (p *parser) perSource(rule *mapping) *PerSource {
	s := p.section(rule, "per_source", perSourceKeys)
	if s == nil {
		return nil
	}
	ps := &PerSource{PrefixV4: DefaultPrefixV4, PrefixV6: DefaultPrefixV6}
	p.required(s, "rate")
	rate, rateAt, rateOK := p.number(s, "rate")
	if rateOK {
		rateOK = p.checkRate(rateAt, rate, UnitPackets, true)
	}
	ps.Rate = rate
	ps.Burst = math.Max(rate, 1)
	if b, at, ok := p.number(s, "burst"); ok {
		switch {
		case b < 1:
			p.errorf(at, "%g is smaller than one packet (minimum 1)", b)
		case rateOK:
			p.checkBurstSeconds(at, b, rate)
		}
		ps.Burst = b
	}
	if v, _, ok := p.integer(s, "prefix_v4", 1, 32); ok {
		ps.PrefixV4 = v
	}
	if v, _, ok := p.integer(s, "prefix_v6", 1, 128); ok {
		ps.PrefixV6 = v
	}
	if b := p.section(s, "ban", banKeys); b != nil {
		ps.Ban = &Ban{}
		p.required(b, "duration")
		ps.Ban.After, _, _ = p.durationAtMost(b, "after", true, MaxBanAfter)
		ps.Ban.Duration, _, _ = p.durationAtMost(b, "duration", false, MaxBanDuration)
	}
	return ps
}

func (p *parser) concurrency(rule *mapping) *Concurrency {
	s := p.section(rule, "concurrency", concurrencyKeys)
	if s == nil {
		return nil
	}
	c := &Concurrency{}
	p.required(s, "max")
	maxV, _, maxOK := p.integer(s, "max", 1, MaxConcurrency)
	c.Max, c.Soft = maxV, maxV
	if soft, at, ok := p.integer(s, "soft", 0, MaxConcurrency); ok {
		if maxOK && soft > maxV {
			p.errorf(at, "soft limit %d exceeds max %d", soft, maxV)
		}
		c.Soft = soft
	}
	return c
}

func (p *parser) circuitBreaker(rule *mapping) *CircuitBreaker {
	s := p.section(rule, "circuit_breaker", breakerKeys)
	if s == nil {
		return nil
	}
	cb := &CircuitBreaker{MinRequests: DefaultMinRequests, Window: DefaultBreakerWindow,
		RetryTimeout: DefaultRetryTimeout, HalfOpenProbes: DefaultHalfOpenProbes}
	cb.SlowLatency, _, _ = p.duration(s, "slow_latency", false)
	cb.SlowRatio, _, _ = p.fraction(s, "slow_ratio", false, true)
	cb.ErrorRatio, _, _ = p.fraction(s, "error_ratio", false, true)
	switch {
	case !s.has("slow_ratio") && !s.has("error_ratio"):
		p.errorf(rule.keyAt("circuit_breaker"), "needs slow_ratio (with slow_latency) or error_ratio")
	case s.has("slow_ratio") && !s.has("slow_latency"):
		p.errorf(s.at("slow_ratio"), "requires slow_latency, the latency above which a probe counts as slow")
	case s.has("slow_latency") && !s.has("slow_ratio"):
		p.errorf(s.at("slow_latency"), "has no effect without slow_ratio")
	}
	if v, _, ok := p.integer(s, "min_requests", 1, math.MaxInt32); ok {
		cb.MinRequests = v
	}
	if d, _, ok := p.duration(s, "window", false); ok {
		cb.Window = d
	}
	if d, _, ok := p.duration(s, "retry_timeout", false); ok {
		cb.RetryTimeout = d
	}
	if v, _, ok := p.integer(s, "half_open_probes", 1, math.MaxInt32); ok {
		cb.HalfOpenProbes = v
	}
	return cb
}
