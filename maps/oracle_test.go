//go:build linux

package maps

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The oracle: the rules file's semantics evaluated directly from the
// dataplane.Spec (the compiler's input), with naive matching over its rules
// and floating-point GCRAs, sharing nothing with dataplane.Compile or the Go
// model. TestDifferential hands one compiled Plan to the model and the
// kernel, so a compiler bug is on both sides; TestOracle compares the kernel
// with this instead, packet by packet and rule by rule.
//
// What the oracle knows of a packet is the frame.Spec it was built from
// (well-formed frames only: parsing is the differential test's and the
// corpus's business). It takes every decision from the documented rules
// (docs/config.md, docs/dataplane.md):
//   - allow before deny, both before the rules; a source in either list
//     meets no rule;
//   - a rule matches on protocol (icmp: ICMP and ICMPv6; any: every
//     protocol, or TCP and UDP with ports), destination ports, syn_only
//     (TCP SYN without ACK) and sources; matched rules apply in file order
//     until one that is not a shadow drops;
//   - on a new connection (SYN without ACK): the circuit breaker's gate of
//     the control loop's limit in force, then the concurrency limit;
//   - then the source's bucket (per_source), then the rule's bucket: the
//     control loop's limit while its deadline has not passed, else the
//     rule's rate and burst; a packet costs 1, or its length (bytes).
//
// Where the semantics leave the kernel a choice the oracle accepts either
// outcome and follows the kernel's: a random draw (a gate's or the
// concurrency limit's probability), a bucket decision within a band of the
// boundary (the per-CPU token cache borrows batches of 50 µs, so the
// kernel's rule bucket is up to two batches off a pure GCRA; fixed-point
// rounding is far below 1 µs), and whether a packet the rule's bucket
// refused took a token from its source's bucket first (the cache's retry
// time can refuse before the source is consulted): the source's bucket is
// then known as an interval. One documented leeway on top: after a
// refusal the bucket itself justified, a rule whose burst tolerance
// exceeds a packet by dataplane.SkipMinTolNS may refuse up to
// dataplane.SkipDrops more packets within the same tick without reading
// the clock (bucket.h, xl_cache_empty), though its bucket has room again.
// The limits' deadlines fall on tick boundaries here, where the kernel's
// deadline check (against its last read within the tick) is exact; its
// lateness within a tick is TestBreakerGate's.

// orSlack is the fixed-point and clock rounding tolerated at any bucket
// boundary, in seconds.
const orSlack = 1e-6

// orGCRA is a floating-point GCRA: a packet of cost c conforms at time t
// when max(tat, t) + c/rate - t <= burst/rate. lo and hi bound the true
// theoretical arrival time (equal unless a refusal left it unknown).
type orGCRA struct{ lo, hi float64 }

// orTri is a decision the semantics may leave open.
type orTri int

const (
	orNo orTri = iota
	orYes
	orEither
)

func (t orTri) String() string { return [...]string{"no", "yes", "either"}[t] }

// conform says whether a packet of emission time inc (seconds) conforms at
// now against tolerance tau, with band seconds either side left open.
func (g *orGCRA) conform(now, inc, tau, band float64) orTri {
	yes := math.Max(g.hi, now)+inc-now <= tau-band // even from the latest TAT
	no := math.Max(g.lo, now)+inc-now > tau+band   // even from the earliest
	switch {
	case yes && !no:
		return orYes
	case no && !yes:
		return orNo
	}
	return orEither
}

// take charges a conforming packet; maybe charges one that may or may not
// have been charged.
func (g *orGCRA) take(now, inc float64) {
	g.lo, g.hi = math.Max(g.lo, now)+inc, math.Max(g.hi, now)+inc
}

func (g *orGCRA) maybe(now, inc float64) { g.hi = math.Max(g.hi, now) + inc }

// rescaled is g as a change of tolerance from to at time at leaves it:
// a TAT ahead keeps its part of the tolerance (bucket.h, xl_units_claim),
// a full bucket stays full.
func (g orGCRA) rescaled(at, from, to float64) orGCRA {
	one := func(tat float64) float64 {
		if ahead := tat - at; ahead > 0 {
			return at + math.Min(ahead, from)*to/from
		}
		return tat
	}
	return orGCRA{one(g.lo), one(g.hi)}
}

// orLimit is a limit the control loop wrote for a rule.
type orLimit struct {
	set         bool
	mine        bool // written for this rule (its epoch), not another's
	rate, burst float64
	deadline    uint64 // ns
	gate        dataplane.Gate
}

// orConns is a count of connections in flight that sock_ops left.
type orConns struct {
	mine  bool
	count int64
}

type orSourceKey struct {
	rule int
	pfx  netip.Prefix
}

type orRule struct {
	bucket orGCRA
	// tau is the tolerance (s) the kernel's TAT was written under, 0
	// while unknown (the kernel's units 0: taken as the settings in
	// force). Under another tolerance the kernel rescales the TAT at the
	// first packet of the rule that reaches its bucket's take, some time
	// from the first packet seen under it (first) to now: the bucket is
	// known as the interval of both.
	tau   float64
	first float64
	// pending: a packet under the other tolerance has been seen (first).
	pending bool
	// retry is when the last packet the bucket refused would have fitted,
	// under the rate and burst then in force (a byte rule's, see expect).
	retry                 float64
	retryRate, retryBurst float64
	limit                 orLimit
	conns                 orConns
	probeRound            uint32
	probePassed           uint32
	// The run of refusals without a clock read that the kernel may make:
	// skipTick is the tick of the last refusal the bucket justified, and
	// skipped how many refusals followed it (SkipDrops: no run); skipOK
	// whether that bucket's tolerance allows a run.
	skipTick uint64
	skipped  int
	skipOK   bool
}

type oracle struct {
	spec    *dataplane.Spec
	start   uint64 // ns: times are seconds since then
	rules   []orRule
	sources map[orSourceKey]*orGCRA
}

func newOracle(spec *dataplane.Spec, start uint64) *oracle {
	return &oracle{spec: spec, start: start, rules: make([]orRule, len(spec.Rules)), sources: map[orSourceKey]*orGCRA{}}
}

func (o *oracle) secs(ns uint64) float64 { return float64(ns-o.start) / 1e9 }

// orPacket is what the oracle knows of a packet.
type orPacket struct {
	src    netip.Addr
	proto  uint8 // IP protocol
	port   uint16
	syn    bool // TCP SYN without ACK
	length int  // the frame's length: a byte rule's cost
}

func orPacketOf(s frame.Spec, length int) orPacket {
	return orPacket{src: s.Src, proto: s.Proto, port: s.DstPort,
		syn: s.Proto == frame.ProtoTCP && s.TCPFlags&(frame.TCPSyn|frame.TCPAck) == frame.TCPSyn, length: length}
}

func anyContains(list []netip.Prefix, a netip.Addr) bool {
	for _, p := range list {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// matches is the naive match of a rule against a packet.
func (p orPacket) matches(r *dataplane.RuleSpec) bool {
	hasPort := p.proto == frame.ProtoTCP || p.proto == frame.ProtoUDP
	switch r.Protocol {
	case "tcp":
		if p.proto != frame.ProtoTCP {
			return false
		}
	case "udp":
		if p.proto != frame.ProtoUDP {
			return false
		}
	case "icmp":
		if p.proto != frame.ProtoICMP && p.proto != frame.ProtoICMPv6 {
			return false
		}
	case "any":
	default:
		panic("protocol " + r.Protocol)
	}
	if len(r.Ports) > 0 {
		in := false
		for _, pr := range r.Ports {
			in = in || (hasPort && pr.Lo <= p.port && p.port <= pr.Hi)
		}
		if !in {
			return false
		}
	}
	if r.SynOnly && !p.syn {
		return false
	}
	return len(r.Sources) == 0 || anyContains(r.Sources, p.src)
}

// orOutcome is what the kernel did with a packet at one rule, as its
// counters tell: a verdict (pass, drop or would-drop) and a reason.
type orOutcome struct {
	verdict dataplane.Verdict
	reason  dataplane.Reason
}

func (c orOutcome) String() string { return fmt.Sprintf("%v/%v", c.verdict, c.reason) }

// orExpect is the outcomes the semantics allow at one rule.
type orExpect struct {
	gate, conc, source, bucket orTri // admitted by each; orYes when it does not apply
	why                        []string
	// skip: bucket is orEither only because the refusal may be one of a
	// run without a clock read.
	skip bool
}

// allows reports whether the semantics allow reason at this rule.
func (e orExpect) allows(r dataplane.Reason) bool {
	switch r {
	case dataplane.ReasonBreaker:
		return e.gate != orYes
	case dataplane.ReasonConcurrency:
		return e.gate != orNo && e.conc != orYes
	case dataplane.ReasonSource:
		return e.gate != orNo && e.conc != orNo && e.source != orYes
	case dataplane.ReasonRule:
		// The token cache's retry time may refuse before the source's
		// bucket is consulted.
		return e.gate != orNo && e.conc != orNo && e.bucket != orYes
	case dataplane.ReasonAdmit:
		return e.gate != orNo && e.conc != orNo && e.source != orNo && e.bucket != orNo
	}
	return false
}

// expect works out what the semantics allow for packet p at rule i at now.
func (o *oracle) expect(i int, p orPacket, nowNS uint64) orExpect {
	r := &o.spec.Rules[i]
	st := &o.rules[i]
	now := o.secs(nowNS)
	e := orExpect{gate: orYes, conc: orYes, source: orYes}
	fresh := st.limit.set && st.limit.mine && nowNS < st.limit.deadline
	if p.syn && fresh {
		g := st.limit.gate
		switch {
		case g.Drop == 0:
		case g.Drop != dataplane.GateAll:
			e.gate = orEither
		case g.Probes == 0:
			e.gate = orNo
		case st.probeRound != g.Round || st.probePassed < g.Probes:
		default:
			e.gate = orNo
		}
		e.why = append(e.why, fmt.Sprintf("gate %+v (probes of round %d: %d) → %v", g, st.probeRound, st.probePassed, e.gate))
	}
	if c := r.Concurrency; p.syn && c != nil && st.conns.mine {
		switch n := st.conns.count; {
		case n < int64(c.Soft):
		case n >= int64(c.Max):
			e.conc = orNo
		default:
			e.conc = orEither
		}
		e.why = append(e.why, fmt.Sprintf("%d in flight of soft %d max %d → %v", st.conns.count, c.Soft, c.Max, e.conc))
	}
	if ps := r.PerSource; ps != nil {
		g := o.source(i, p)
		e.source = g.conform(now, 1/ps.Rate, ps.Burst/ps.Rate, orSlack)
		e.why = append(e.why, fmt.Sprintf("source %v TAT [%.6f, %.6f] at %.6f, rate %v burst %v → %v",
			o.sourceKey(i, p).pfx, g.lo, g.hi, now, ps.Rate, ps.Burst, e.source))
	}
	rate, burst := o.bucketOf(i, nowNS)
	inc, tau := o.cost(i, p)/rate, burst/rate
	batch := math.Min(float64(dataplane.BatchNS)/1e9, tau/4)
	if st.tau != 0 && !near(st.tau, tau) && !st.pending {
		st.pending, st.first = true, now
	}
	g := o.ruleBucket(i, now, tau)
	e.bucket = g.conform(now, inc, tau, 2*batch+orSlack)
	if r.Bytes && e.bucket == orYes && now < st.retry+orSlack && rate == st.retryRate && burst == st.retryBurst {
		// The kernel's cache refuses until a refused packet's cost
		// would fit, whatever the cost of the next: a smaller packet
		// that fits sooner is refused too (a defect of byte rules: the
		// retry time is computed for one need; docs/dataplane.md says
		// no packet dropped this way could have passed).
		e.bucket = orEither
		e.why = append(e.why, fmt.Sprintf("the cache's retry time %.6f (a larger packet's) not reached", st.retry))
	}
	if e.bucket == orYes && st.skipOK && st.skipped < dataplane.SkipDrops && st.skipTick == dataplane.FakeTick(nowNS) {
		e.bucket, e.skip = orEither, true
		e.why = append(e.why, fmt.Sprintf("refusal %d of a run without a clock read in tick %d", st.skipped+1, st.skipTick))
	}
	e.why = append(e.why, fmt.Sprintf("bucket TAT %.6f at %.6f, rate %v burst %v cost %v (limit in force %v, written under tolerance %v, pending %v from %.6f) → %v",
		g.hi, now, rate, burst, o.cost(i, p), fresh, st.tau, st.pending, st.first, e.bucket))
	return e
}

// near says whether two tolerances are the same one, as the kernel's
// fixed point has them (a relative 1e-9 apart).
func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(a, b) }

// ruleBucket is rule i's bucket at now under tolerance tau: as it is, or
// while a rescale is pending, as rescaled at first or at now (between
// them, where the kernel rescaled, it is in between).
func (o *oracle) ruleBucket(i int, now, tau float64) orGCRA {
	st := &o.rules[i]
	if !st.pending {
		return st.bucket
	}
	a := st.bucket.rescaled(st.first, st.tau, tau)
	b := st.bucket.rescaled(now, st.tau, tau)
	return orGCRA{math.Min(a.lo, b.lo), math.Max(a.hi, b.hi)}
}

func (o *oracle) cost(i int, p orPacket) float64 {
	if o.spec.Rules[i].Bytes {
		return float64(p.length)
	}
	return 1
}

// bucketOf is the rate and burst in force for rule i.
func (o *oracle) bucketOf(i int, nowNS uint64) (rate, burst float64) {
	l := &o.rules[i].limit
	if l.set && l.mine && nowNS < l.deadline {
		return l.rate, l.burst
	}
	return o.spec.Rules[i].Rate, o.spec.Rules[i].Burst
}

func (o *oracle) sourceKey(i int, p orPacket) orSourceKey {
	ps := o.spec.Rules[i].PerSource
	bits := ps.PrefixV6
	if p.src.Is4() {
		bits = ps.PrefixV4
	}
	return orSourceKey{i, netip.PrefixFrom(p.src, bits).Masked()}
}

func (o *oracle) source(i int, p orPacket) *orGCRA {
	k := o.sourceKey(i, p)
	g, ok := o.sources[k]
	if !ok {
		g = &orGCRA{math.Inf(-1), math.Inf(-1)}
		o.sources[k] = g
	}
	return g
}

// follow updates rule i's state with what the kernel did (an outcome the
// expectation allowed).
func (o *oracle) follow(i int, p orPacket, nowNS uint64, e orExpect, reason dataplane.Reason) {
	r := &o.spec.Rules[i]
	st := &o.rules[i]
	now := o.secs(nowNS)
	if reason == dataplane.ReasonBreaker {
		return
	}
	if g := st.limit.gate; p.syn && st.limit.set && st.limit.mine && nowNS < st.limit.deadline && g.Drop == dataplane.GateAll && g.Probes > 0 {
		// A probe passed the open gate: it counts, whatever follows.
		if st.probeRound != g.Round {
			st.probeRound, st.probePassed = g.Round, 0
		}
		st.probePassed++
	}
	if reason == dataplane.ReasonConcurrency {
		return
	}
	if ps := r.PerSource; ps != nil {
		switch reason {
		case dataplane.ReasonAdmit:
			o.source(i, p).take(now, 1/ps.Rate)
		case dataplane.ReasonRule:
			if e.source != orNo {
				o.source(i, p).maybe(now, 1/ps.Rate)
			}
		}
	}
	rate, burst := o.bucketOf(i, nowNS)
	if reason == dataplane.ReasonAdmit || (reason == dataplane.ReasonRule && !e.skip) {
		// The kernel took from the bucket under these settings (a
		// refusal that is not one of a run follows a take since the
		// last change, which emptied the CPU's cache): rescaled.
		st.bucket = o.ruleBucket(i, now, burst/rate)
		st.tau, st.pending = burst/rate, false
	}
	switch {
	case reason == dataplane.ReasonRule && e.skip:
		st.skipped++
	case reason == dataplane.ReasonRule && e.bucket != orYes:
		// A refusal the bucket justifies may be a clock read that
		// starts a run (slack: the kernel's fixed point).
		inc, tau := o.cost(i, p)/rate, burst/rate
		st.skipTick, st.skipped = dataplane.FakeTick(nowNS), 0
		st.skipOK = r.PerSource == nil && tau-inc >= float64(dataplane.SkipMinTolNS)/1e9-orSlack
	case reason == dataplane.ReasonAdmit || reason == dataplane.ReasonSource:
		// The cache read the clock and found room: no run.
		st.skipped = dataplane.SkipDrops
	}
	switch {
	case reason == dataplane.ReasonAdmit:
		st.bucket.take(now, o.cost(i, p)/rate)
	case reason == dataplane.ReasonRule && e.bucket != orYes:
		if rate != st.retryRate || burst != st.retryBurst || now >= st.retry {
			st.retry = 0
		}
		st.retry = math.Max(st.retry, math.Max(st.bucket.hi, now)+o.cost(i, p)/rate-burst/rate)
		st.retryRate, st.retryBurst = rate, burst
	}
}

// check runs the oracle on a packet against the kernel's counter deltas of
// every slot (d) and its XDP verdict; plan only names the kernel's slots.
// It returns what disagrees, or "", and updates the oracle's state.
func (o *oracle) check(p orPacket, nowNS uint64, pass bool, d allCounters, plan *dataplane.Plan) string {
	var b strings.Builder
	got := func(slot int) (orOutcome, int) {
		c := d[slot]
		n, out := 0, orOutcome{}
		for v := range dataplane.VerdictMax {
			n += int(c.Packets[v])
			if c.Packets[v] != 0 {
				out.verdict = v
			}
		}
		for r := range dataplane.ReasonMax {
			if c.Reasons[r] != 0 {
				out.reason = r
			}
		}
		return out, n
	}
	global, n := got(dataplane.GlobalSlot)
	if n != 1 {
		fmt.Fprintf(&b, "\n  the global slot counted %d packets", n)
	}
	want := orOutcome{dataplane.VerdictPass, dataplane.ReasonNoRule}
	var rulesSeen []int
	switch {
	case anyContains(o.spec.Allow, p.src):
		want.reason = dataplane.ReasonAllow
	case anyContains(o.spec.Deny, p.src):
		want = orOutcome{dataplane.VerdictDrop, dataplane.ReasonDeny}
	default:
		for i := range o.spec.Rules {
			r := &o.spec.Rules[i]
			if !p.matches(r) {
				continue
			}
			rulesSeen = append(rulesSeen, i)
			if want.reason == dataplane.ReasonNoRule {
				want.reason = dataplane.ReasonAdmit
			}
			slot := plan.Slot(r.Name)
			out, n := got(slot)
			if n != 1 {
				fmt.Fprintf(&b, "\n  rule %s matches: its slot %d counted %d packets", r.Name, slot, n)
				break
			}
			e := o.expect(i, p, nowNS)
			wantVerdict := dataplane.VerdictDrop
			if r.Shadow {
				wantVerdict = dataplane.VerdictWouldDrop
			}
			if out.reason == dataplane.ReasonAdmit {
				wantVerdict = dataplane.VerdictPass
			}
			if !e.allows(out.reason) || out.verdict != wantVerdict {
				fmt.Fprintf(&b, "\n  rule %s: kernel %v, the semantics allow gate %v, concurrency %v, source %v, bucket %v (shadow %v):\n    %s",
					r.Name, out, e.gate, e.conc, e.source, e.bucket, r.Shadow, strings.Join(e.why, "\n    "))
			}
			o.follow(i, p, nowNS, e, out.reason)
			if out.verdict == dataplane.VerdictDrop {
				want = out
				break
			}
		}
	}
	// No other slot counted the packet.
	for s := range dataplane.MaxRules {
		if _, n := got(s); n == 0 {
			continue
		}
		seen := false
		for _, i := range rulesSeen {
			seen = seen || plan.Slot(o.spec.Rules[i].Name) == s
		}
		if !seen {
			fmt.Fprintf(&b, "\n  slot %d (%q) counted a packet that its rule does not see", s, plan.Rules[s].Name)
		}
	}
	if global != want {
		fmt.Fprintf(&b, "\n  global: kernel %v, oracle %v", global, want)
	}
	if pass != (want.verdict != dataplane.VerdictDrop) {
		fmt.Fprintf(&b, "\n  XDP: kernel pass=%v, oracle %v", pass, want)
	}
	return b.String()
}

// oracleSpec is a random rules file: protocols, port ranges, syn_only,
// sources, bytes, shadow, per_source and concurrency mixed, rates low
// enough that every bucket refuses.
// Names carry the file's number: epochs come from names, so each file's
// rules start with fresh state in a kernel that ran the files before.
func oracleSpec(rng *rand.Rand, file int) *dataplane.Spec {
	pick := func(n int) int { return rng.IntN(n) }
	chance := func(p float64) bool { return rng.Float64() < p }
	spec := &dataplane.Spec{MalformedPass: chance(0.5)}
	if chance(0.7) {
		spec.Allow = []netip.Prefix{pfx("10.1.3.0/24"), pfx("2001:db8:3::/48")}
	}
	if chance(0.7) {
		spec.Deny = []netip.Prefix{pfx("10.1.0.0/16"), pfx("10.4.0.0/16"), pfx("2001:db8:3:1::/64")}[:1+pick(3)]
	}
	portRanges := []dataplane.PortRange{{Lo: 22, Hi: 22}, {Lo: 53, Hi: 53}, {Lo: 80, Hi: 80}, {Lo: 443, Hi: 443},
		{Lo: 1000, Hi: 1010}, {Lo: 1005, Hi: 2000}, {Lo: 5000, Hi: 5000}, {Lo: 8080, Hi: 8081}}
	sources := []netip.Prefix{pfx("10.1.0.0/16"), pfx("10.1.2.0/24"), pfx("10.2.0.0/15"), pfx("10.3.0.0/17"),
		pfx("2001:db8:1::/48"), pfx("2001:db8:2:1::/64"), pfx("2001:db8::/32")}
	n := 3 + pick(8)
	for i := range n {
		r := dataplane.RuleSpec{Name: fmt.Sprintf("f%d-r%d", file, i),
			Protocol: []string{"tcp", "tcp", "udp", "udp", "icmp", "any"}[pick(6)],
			Rate:     float64(2 + pick(300)), Burst: float64(1 + pick(8))}
		if r.Protocol != "icmp" && chance(0.75) {
			for range 1 + pick(3) {
				r.Ports = append(r.Ports, portRanges[pick(len(portRanges))])
			}
		}
		if r.Protocol == "tcp" && chance(0.3) {
			r.SynOnly = true
		}
		if chance(0.3) {
			for range 1 + pick(2) {
				r.Sources = append(r.Sources, sources[pick(len(sources))])
			}
		}
		if r.Protocol == "udp" && chance(0.2) {
			r.Bytes = true
			r.Rate, r.Burst = r.Rate*200, float64(1500+pick(3000))
		}
		r.Shadow = chance(0.15)
		if !r.Bytes && chance(0.35) {
			r.PerSource = &dataplane.PerSourceSpec{Rate: float64(1 + pick(40)), Burst: float64(1 + pick(4)),
				PrefixV4: []int{16, 24, 32}[pick(3)], PrefixV6: []int{48, 64, 128}[pick(3)]}
		}
		if r.Protocol == "tcp" && chance(0.4) {
			soft := pick(5)
			r.Concurrency = &dataplane.ConcurrencySpec{Soft: soft, Max: max(1, soft+pick(5))}
		}
		spec.Rules = append(spec.Rules, r)
	}
	return spec
}

// oracleFrame is a random well-formed frame and what it is.
func oracleFrame(rng *rand.Rand) (frame.Spec, []byte) {
	pick := func(n int) int { return rng.IntN(n) }
	var s frame.Spec
	v6 := rng.IntN(2) == 0
	if v6 {
		s.Src = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, byte(pick(5)), 0, byte(pick(3)), 15: byte(1 + pick(6))})
		if pick(8) == 0 {
			s.Src = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, byte(pick(256)), 15: byte(pick(256))})
		}
	} else {
		s.Src = netip.AddrFrom4([4]byte{10, byte(1 + pick(4)), byte(pick(4)), byte(1 + pick(6))})
		if pick(8) == 0 {
			s.Src = netip.AddrFrom4([4]byte{byte(1 + pick(200)), byte(pick(256)), byte(pick(256)), byte(1 + pick(250))})
		}
	}
	if pick(10) == 0 {
		s.VLANs = frame.Tags(frame.EtherType8021Q)
	}
	if !v6 && pick(10) == 0 {
		s.IPv4OptionWords = 1 + pick(5)
	}
	if v6 && pick(10) == 0 {
		s.IPv6Ext = []uint8{frame.ExtDstOpts}
	}
	s.SrcPort = uint16(1024 + pick(60000))
	s.DstPort = []uint16{22, 53, 80, 443, 999, 1000, 1005, 1010, 1011, 2000, 2001, 5000, 8080, 8081, 8082}[pick(15)]
	switch x := rng.Float64(); {
	case x < 0.45:
		s.Proto = frame.ProtoTCP
		s.TCPFlags = []uint8{synFlags, synFlags, synFlags, synAckFlags, ackFlags, ackFlags, frame.TCPSyn | frame.TCPFin}[pick(7)]
	case x < 0.8:
		s.Proto = frame.ProtoUDP
	case x < 0.95:
		s.Proto, s.ICMPType = frame.ProtoICMP, []uint8{8, 0}[pick(2)]
		if v6 {
			s.Proto, s.ICMPType = frame.ProtoICMPv6, []uint8{128, 129}[pick(2)]
		}
	default:
		s.Proto = []uint8{47, 50, 132}[pick(3)]
	}
	s.PayloadLen = pick(300)
	return s, frame.MustBuild(s)
}

// oracleTrace runs one random spec and trace of n packets through the
// kernel and the oracle, with limits, gates, connection counts and reloads
// written along the way, and fails at the first disagreement.
func oracleTrace(t *testing.T, h *harness, rng *rand.Rand, file, n int) (drops int) {
	t.Helper()
	spec := oracleSpec(rng, file)
	h.apply(t, compile(t, spec, nil))
	starts := []uint64{second, 365 * 24 * 3600 * second, 1<<58 - 100*second}
	now := starts[rng.IntN(len(starts))]
	o := newOracle(spec, now)
	var desc []string
	for _, r := range spec.Rules {
		desc = append(desc, fmt.Sprintf("%+v", r))
		if r.PerSource != nil {
			desc = append(desc, fmt.Sprintf("  per_source %+v", *r.PerSource))
		}
		if r.Concurrency != nil {
			desc = append(desc, fmt.Sprintf("  concurrency %+v", *r.Concurrency))
		}
	}
	specText := fmt.Sprintf("allow %v deny %v malformed pass %v\n%s", spec.Allow, spec.Deny, spec.MalformedPass, strings.Join(desc, "\n"))
	before := h.counters(t)
	for i := range n {
		switch x := rng.Float64(); {
		case x < 0.3:
		case x < 0.85:
			now += rng.Uint64N(20 * second / 1000)
		case x < 0.99:
			now += rng.Uint64N(second)
		default:
			now += rng.Uint64N(3600 * second)
		}
		switch x := rng.Float64(); {
		case x < 0.01:
			// The control loop's limit, with a gate, for this rule or
			// (another epoch) not.
			ri := rng.IntN(len(spec.Rules))
			r := &spec.Rules[ri]
			slot := h.slot(t, r.Name)
			l := orLimit{set: true, mine: rng.Float64() < 0.8, rate: float64(1 + rng.IntN(400)), burst: float64(1 + rng.IntN(10)),
				deadline: (now + rng.Uint64N(500*second/1000)) >> dataplane.FakeTickShift << dataplane.FakeTickShift}
			if r.Bytes {
				l.rate, l.burst = l.rate*200, float64(1500+rng.IntN(3000))
			}
			switch x := rng.Float64(); {
			case x < 0.3:
			case x < 0.55:
				l.gate = dataplane.Gate{Drop: dataplane.GateAll}
			case x < 0.85:
				// Rounds of one rule only, as the control loop's come
				// from the clock: the kernel keeps a slot's probe count
				// across rules (epochs), so a new rule reusing the round
				// number of the slot's previous rule would find its
				// probes spent.
				l.gate = dataplane.Gate{Drop: dataplane.GateAll, Probes: uint32(1 + rng.IntN(3)), Round: uint32(file)<<8 | uint32(rng.IntN(3))}
			default:
				l.gate = dataplane.Gate{Drop: 1 + rng.Uint32N(dataplane.GateAll-1)}
			}
			b, err := dataplane.NewBucket(l.rate, l.burst, r.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			epoch := dataplane.Epoch(r.Name)
			if !l.mine {
				epoch = dataplane.Epoch(r.Name + "/other")
			}
			h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: l.deadline, Epoch: epoch, Gate: l.gate})
			o.rules[ri].limit = l
		case x < 0.02:
			// The sock_ops count of a rule's connections in flight.
			ri := rng.IntN(len(spec.Rules))
			c := orConns{mine: rng.Float64() < 0.85, count: int64(rng.IntN(12)) - 1}
			epoch := dataplane.Epoch(spec.Rules[ri].Name)
			if !c.mine {
				epoch = dataplane.Epoch(spec.Rules[ri].Name + "/other")
			}
			if err := h.tab.SetConns(h.slot(t, spec.Rules[ri].Name), dataplane.Conns{Count: c.count, Epoch: epoch}); err != nil {
				t.Fatal(err)
			}
			o.rules[ri].conns = c
		case x < 0.022:
			// A reload with new rates: buckets carry on.
			for j := range spec.Rules {
				spec.Rules[j].Rate = float64(2 + rng.IntN(300))
				if spec.Rules[j].Bytes {
					spec.Rules[j].Rate *= 200
				}
			}
			h.apply(t, compile(t, spec, h.plan))
		}
		fs, f := oracleFrame(rng)
		pass := h.kernelRun(t, f, now, 1)
		after := h.counters(t)
		if diff := o.check(orPacketOf(fs, len(f)), now, pass, deltas(after, before), h.plan); diff != "" {
			t.Fatalf("packet %d at %d ns (%.6f s into the trace): %+v\nkernel and oracle disagree:%s\nrules:\n%s",
				i, now, o.secs(now), fs, diff, specText)
		}
		before = after
		if !pass {
			drops++
		}
	}
	return drops
}

// TestOracle compares the kernel with the oracle over random rules files
// and traces.
func TestOracle(t *testing.T) {
	h := newHarness(t)
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d))
	specs, packets := 8, 3000
	if testing.Short() {
		specs = 3
	}
	total, drops := 0, 0
	for file := range specs {
		drops += oracleTrace(t, h, rng, file, packets)
		total += packets
	}
	t.Logf("%d rules files, %d packets, %d dropped: kernel and oracle agree", specs, total, drops)
	if drops == 0 || drops == total {
		t.Errorf("the traces dropped %d of %d packets: they exercise nothing", drops, total)
	}
}
