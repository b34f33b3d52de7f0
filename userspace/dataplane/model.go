package dataplane

// Model is the Go model of the XDP program: it runs a Plan against frames
// and a clock exactly as the kernel does, keeping its own bucket state and
// counters. Tests compare it with the kernel packet by packet.
//
// The model is one CPU: the kernel's per-CPU token caches agree with it
// when the kernel runs every packet on one CPU (tests pin their thread).
type Model struct {
	Plan    *Plan
	Limits  [MaxRules]Limit
	buckets [MaxRules]bucketState
	caches  [MaxRules]Cache
	// SrcSets and SrcSeed are the per-source table's sets and hash key
	// (srctable.go): the kernel's (maps' Objects.SourceSets and
	// Tables.SourceSeed). SrcSets 0: the default table's.
	SrcSets int
	SrcSeed uint32
	// NoXDPTx is the kernel's xl_cfg_no_tx (maps.Options.NoXDPTx): the
	// program never answers from XDP.
	NoXDPTx bool
	sources srcTable
	// srcCredits is the CPU's credit for the source it last admitted for
	// each rule (struct xl_src_credit).
	srcCredits [MaxRules]srcCredit
	// SrcFilterLines is the per-source filter's lines on a CPU (the
	// kernel's Objects.SourceFilterLines); 0: SrcFilterLines(SrcSets, 1).
	SrcFilterLines int
	srcFilter      map[uint32]*srcFilterLine // its one CPU's lines
	// noSrcFilter leaves the filter out (its tests compare a model with
	// it and one without); srcFilterDrops counts the packets it refused,
	// by slot.
	noSrcFilter    bool
	srcFilterDrops [MaxRules]uint64
	frags          map[FragKey]*fragState
	fragSeen       map[uint32]uint64 // xl_frag_seen's marked slots
	resetTAT       uint64            // the reset bucket of all rules (xl_reset_budget)
	// SYN cookies (cookie.go): each rule's state and the budget's.
	cookies         [MaxRules]cookieState
	cookieShares    [2 * MaxRules]cookieShare // xl_cookie_share: the first share, then cookieShareSocket
	cookieBudgetTAT uint64
	// CookieCounters are the rules' cookie counters (xl_cookie_stats).
	CookieCounters [MaxRules]CookieCounters
	// AnswerCounters are the rules' answering classes (xl_answer_stats).
	AnswerCounters [MaxRules]AnswerCounters
	Counters       [CounterSlots]Counters
	// Host holds the host's own addresses (xl_host_addrs): a refused SYN
	// is answered with a reset only when addressed to them.
	Host HostAddrs
	// Conns are the connections in flight per slot (struct xl_conns),
	// which the kernel's sock_ops program counts; tests set them.
	Conns [MaxRules]Conns
	// Rand stands for bpf_get_prandom_u32 in the probabilistic gates; nil
	// draws 0 (admit nothing that a probability may drop).
	Rand func() uint32
	// flood is the CPU's flood memo (bpf/flood.h); reloads counts Reload.
	flood   floodMemo
	reloads uint64
	// wholeRule: the rule being applied decides for a first fragment's
	// whole datagram (frag.go), and applyRuleBuckets takes its cost whole.
	wholeRule bool
}

// floodMemo is the Go model of struct xl_flood: the last drop in a run,
// for the packets that match the same rules in the same plan and tick,
// and what is left of the run, which it took over from the rule's cache.
type floodMemo struct {
	plan    *Plan
	reloads uint64
	mask    uint64
	tick    uint64
	left    uint32
	slot    int
	syn     bool
}

// Reload stands for the kernel's reload of the same or another plan
// (maps.Tables.Apply): the generation changes, which voids the flood memo
// even when Plan stays the same.
func (m *Model) Reload() { m.reloads++ }

// floodDrop is the Go model of flood.h's xl_flood_drop: whether the memo
// answers a packet that matched mask, and then it takes one of the run's
// drops and counts it to the rule.
func (m *Model) floodDrop(mask uint64, syn bool, nowNS uint64, length int) bool {
	f := &m.flood
	tick := FakeTick(nowNS)
	if f.mask != mask || f.plan != m.Plan || f.reloads != m.reloads || f.syn != syn || f.left == 0 || f.tick != tick {
		return false
	}
	f.left--
	m.Counters[f.slot].count(VerdictDrop, ReasonRule, uint64(length))
	return true
}

// floodNote is the Go model of flood.h's xl_flood_repeatable and
// xl_flood_note: it memoizes rule r's drop in a run of a packet that
// matched mask when nothing but the run decided it.
func (m *Model) floodNote(r *Rule, slot int, pkt *Packet, mask uint64, lim *Limit, fresh bool) {
	c := &m.caches[slot]
	if mask&(1<<slot-1) != 0 || pkt.Fragment || pkt.FirstFrag || c.Skip == 0 {
		return
	}
	if r.Flags&(RuleShadow|RuleBytes|RulePerSource) != 0 {
		return
	}
	if pkt.SYN && (r.Flags&(RuleCookieAuto|RuleCookieAlways|RuleRefuseReset|RuleConcurrency) != 0 ||
		(fresh && (lim.Gate.Drop != 0 || lim.ConcCap != 0))) {
		return
	}
	m.flood = floodMemo{plan: m.Plan, reloads: m.reloads, mask: mask, tick: c.Tick, left: c.Skip, slot: slot, syn: pkt.SYN}
	c.Skip = 0
}

// srcCreditReturn is the Go model of source.h's xl_src_credit_return:
// the credit goes back to its source's bucket, when that is still the
// rule's.
func (m *Model) srcCreditReturn(cr *srcCredit, r *Rule) {
	credit := cr.credit
	cr.credit = 0
	if credit == 0 {
		return
	}
	w, _ := m.srcLocate(cr.key, r, 0, false)
	if w != nil && w.Epoch == cr.epoch && cr.tol == r.Source.Tol && w.Units == UnitsCode(r.Source.Tol) {
		w.TAT -= credit
	}
}

// Conns is a slot's count of connections in flight (struct xl_conns).
type Conns struct {
	Count int64
	Epoch uint32
}

// SourceKey is a per-source bucket's key (struct xl_source_key).
type SourceKey struct {
	Slot      uint32
	Family    uint8
	PrefixLen uint8
	Addr      [16]byte
}

// SourceState is a per-source bucket (struct xl_source).
type SourceState struct {
	TAT, OverSinceNS, BannedUntilNS, Drops uint64
	Epoch                                  uint32
	// Units is the tolerance TAT was written under, as UnitsCode has it
	// (0: unknown).
	Units uint32
}

// NewSourceKey masks the packet's source to the rule's prefix length.
func NewSourceKey(r *Rule, slot int, pkt *Packet) SourceKey {
	k := SourceKey{Slot: uint32(slot), Family: pkt.Family}
	plen := int(r.Prefix6)
	src := pkt.Src.As16()
	if pkt.Family == 4 {
		plen = int(r.Prefix4)
		a4 := pkt.Src.As4()
		src = [16]byte{}
		copy(src[:], a4[:])
	}
	k.PrefixLen = uint8(plen)
	for i := range 16 {
		bits := plen - 8*i
		var mask byte
		switch {
		case bits >= 8:
			mask = 0xff
		case bits > 0:
			mask = 0xff << (8 - bits)
		}
		k.Addr[i] = src[i] & mask
	}
	return k
}

// Limit is the control loop's bucket for a slot (struct xl_limit).
type Limit struct {
	Bucket     Bucket
	DeadlineNS uint64
	Epoch      uint32
	Gate       Gate // the circuit breaker's gate on new connections
	// ConcCap, when not 0, refuses new connections while the rule's
	// connections in flight are at least ConcCap (the loop's in-flight
	// cap, docs/control.md).
	ConcCap uint32
	// ReqCap, when not 0, refuses new requests of a rule with signal
	// response_time while its requests in flight (bpf/request.h) are at
	// least ReqCap: the kernel resets the connection both ways at the
	// request's first segment (bpf/request_tc.h). The XDP verdict is a
	// pass either way, so the model has nothing to decide.
	ReqCap uint32
}

// GateAll is the Gate.Drop value that drops every new connection.
const GateAll = 0xffffffff

// Gate is what a rule's circuit breaker does to new TCP connections (SYN
// without ACK) while its Limit is in force; established traffic is never
// gated. Dropped SYNs count as drop/breaker.
type Gate struct {
	// Drop is the probability, in units of 2^-32, that a SYN is dropped;
	// 0 gates nothing, GateAll drops all (breaker OPEN).
	Drop uint32
	// Probes SYNs of each Round pass a GateAll gate (breaker HALF_OPEN):
	// the kernel counts them; a new Round value starts a new count.
	Probes uint32
	Round  uint32
}

type bucketState struct {
	tat      uint64
	units    uint64 // the tolerance tat and resetTAT were written under (0: unknown)
	epoch    uint32
	probes   uint64 // half-open probes: round << 32 | passed
	resetTAT uint64 // the bucket of the resets answering refused SYNs
}

// Counters mirrors struct xl_counters, summed over CPUs.
type Counters struct {
	Packets [VerdictMax]uint64
	Bytes   [VerdictMax]uint64
	Reasons [ReasonMax]uint64
	// Resets counts a rule's refused SYNs by what became of their reset.
	Resets [ResetMax]uint64
}

// Add adds o to c.
func (c *Counters) Add(o *Counters) {
	for i := range c.Packets {
		c.Packets[i] += o.Packets[i]
		c.Bytes[i] += o.Bytes[i]
	}
	for i := range c.Reasons {
		c.Reasons[i] += o.Reasons[i]
	}
	for i := range c.Resets {
		c.Resets[i] += o.Resets[i]
	}
}

// Sub returns c - o, the counts between two reads.
func (c Counters) Sub(o Counters) Counters {
	for i := range c.Packets {
		c.Packets[i] -= o.Packets[i]
		c.Bytes[i] -= o.Bytes[i]
	}
	for i := range c.Reasons {
		c.Reasons[i] -= o.Reasons[i]
	}
	for i := range c.Resets {
		c.Resets[i] -= o.Resets[i]
	}
	return c
}

func (c *Counters) count(v Verdict, r Reason, bytes uint64) {
	c.Packets[v]++
	c.Bytes[v] += bytes
	c.Reasons[r]++
}

// Result is the model's verdict on one frame.
type Result struct {
	Verdict Verdict // VerdictPass or VerdictDrop
	Reason  Reason
	// Reset: the dropped SYN is answered with a TCP reset (the kernel
	// returns XDP_TX with the frame rewritten; reset.h).
	Reset bool
	// Cookie: the SYN is answered with a SYN-ACK carrying a SYN cookie
	// (XDP_TX; syncookie.h).
	Cookie bool
}

// Pass reports whether the kernel would return XDP_PASS.
func (r Result) Pass() bool { return r.Verdict != VerdictDrop }

// Eval runs one frame through the model at time nowNS.
func (m *Model) Eval(frame []byte, nowNS uint64) Result {
	res := m.eval(frame, nowNS)
	m.Counters[GlobalSlot].count(res.Verdict, res.Reason, uint64(len(frame)))
	return res
}

func (m *Model) eval(frame []byte, nowNS uint64) Result {
	p := m.Plan
	g := &p.Globals
	pkt, pr := Parse(frame)
	malformed := func(r Reason) Result {
		if r == ReasonNotIP || g.Flags&GlobalMalformedPass != 0 {
			return Result{Verdict: VerdictPass, Reason: r}
		}
		return Result{Verdict: VerdictDrop, Reason: r}
	}
	switch pr {
	case ParseNotIP:
		return malformed(ReasonNotIP)
	case ParseMalformedL2:
		return malformed(ReasonMalformedL2)
	case ParseVLANDepth:
		return malformed(ReasonVLANDepth)
	}
	if pkt.Family == 0 {
		return malformed(ReasonMalformedL3)
	}
	var src *PrefixEntry
	if (pkt.Family == 4 && g.Flags&GlobalPrefixesV4 != 0) || (pkt.Family == 6 && g.Flags&GlobalPrefixesV6 != 0) {
		src = p.Lookup(pkt.Src)
	}
	if src != nil && src.Flags&PrefixAllow != 0 {
		return Result{Verdict: VerdictPass, Reason: ReasonAllow}
	}
	if src != nil && src.Flags&PrefixDeny != 0 {
		return Result{Verdict: VerdictDrop, Reason: ReasonDeny}
	}
	switch pr {
	case ParseMalformedL3:
		return malformed(ReasonMalformedL3)
	case ParseExtLimit:
		return malformed(ReasonExtLimit)
	case ParseMalformedL4:
		return malformed(ReasonMalformedL4)
	case ParseNDInvalid:
		return malformed(ReasonNDInvalid)
	}

	// Later fragments are orphans or pass on their first fragment's
	// decision, and an IPv6 one takes its protocol (frag.h).
	var frag *fragState
	if pkt.Fragment && m.fragTracked(&pkt) {
		k := pkt.FragKey()
		l4, ok := uint8(0), false
		if e, found := m.frags[k]; found {
			if e.dropped != 0 {
				m.Counters[e.dropped-1].count(VerdictDrop, ReasonFragment, uint64(pkt.Len))
				return Result{Verdict: VerdictDrop, Reason: ReasonFragment}
			}
			if !m.fragLater(e, pkt.Len) {
				return Result{Verdict: VerdictDrop, Reason: ReasonFragment}
			}
			frag, l4, ok = e, e.l4, true
		} else if l4, ok = m.fragSeenAt(k, nowNS); !ok {
			return Result{Verdict: VerdictDrop, Reason: ReasonFragOrphan}
		}
		if pkt.Family == 6 && ok {
			pkt.L4, pkt.Proto = l4, protoClass(int(l4))
		}
	}
	mask := m.match(&pkt, src)
	if mask != 0 && !pkt.Fragment && !pkt.FirstFrag && m.floodDrop(mask, pkt.SYN, nowNS, pkt.Len) {
		return Result{Verdict: VerdictDrop, Reason: ReasonRule}
	}
	// Later fragments take their datagram's rules: those that follow
	// fragments (port rules, and rules without ports of TCP and UDP) from
	// its first fragment's entry alone (xlimit.c).
	if pkt.Fragment && m.fragTracked(&pkt) && m.fragFollowed(&pkt) {
		mask &^= g.FragMatch[pkt.Proto]
	}
	if frag != nil {
		mask |= frag.rules
	}
	res, dropped, whole := m.applyRules(frame, mask, &pkt, nowNS)
	switch {
	case frag != nil:
		if dropped != 0 {
			frag.dropped = dropped
		}
		if res.Reason == ReasonNoRule && frag.whole != 0 {
			res.Reason = ReasonAdmit
		}
	case pkt.FirstFrag && m.fragTracked(&pkt):
		// Only datagrams that met a port rule taking fragments are
		// kept; the others' first fragments mark xl_frag_seen.
		var followed uint64
		if m.fragFollowed(&pkt) {
			followed = mask & g.FragMatch[pkt.Proto]
		}
		if followed != 0 {
			m.fragRecord(frame, &pkt, followed, whole, dropped)
		} else if dropped == 0 {
			m.fragSee(&pkt, nowNS)
		}
	}
	return res
}

// fragFollowed is frag.h's xl_frag_followed: whether a port rule of the
// packet's protocol takes fragments.
func (m *Model) fragFollowed(pkt *Packet) bool {
	return pkt.Proto < PortProtos && m.Plan.Globals.FragMatch[pkt.Proto] != 0
}

// applyRules runs the rules of mask in slot order until one drops the
// packet. It returns the result, the dropping slot + 1 (0: none), and the
// rules that admitted a first fragment's whole datagram.
func (m *Model) applyRules(frame []byte, mask uint64, pkt *Packet, nowNS uint64) (Result, int, uint64) {
	p := m.Plan
	res := Result{Verdict: VerdictPass, Reason: ReasonNoRule}
	if mask != 0 {
		res.Reason = ReasonAdmit
	}
	var whole uint64
	for i := range MaxRules {
		if mask>>i == 0 {
			break
		}
		if mask>>i&1 == 0 {
			continue
		}
		r := &p.Rules[i]
		if !r.Active() {
			continue
		}
		m.wholeRule = false
		v, why, reset, cookie := m.applyRule(frame, r, i, pkt, mask, nowNS)
		if v == VerdictDrop && r.Flags&RuleShadow != 0 {
			v = VerdictWouldDrop
		}
		m.Counters[i].count(v, why, uint64(pkt.Len))
		if v == VerdictDrop {
			return Result{Verdict: VerdictDrop, Reason: why, Reset: reset, Cookie: cookie}, i + 1, whole
		}
		if m.wholeRule && v == VerdictPass {
			whole |= 1 << i
		}
	}
	return res, 0, whole
}

func (m *Model) match(pkt *Packet, src *PrefixEntry) uint64 {
	g := &m.Plan.Globals
	if pkt.Exempt {
		return 0
	}
	// A later fragment has no port: eval adds its datagram's port rules.
	mask := g.Portless[pkt.Proto]
	if pkt.HasPort && pkt.Proto < PortProtos {
		mask |= m.Plan.Ports[PortKey(pkt.Proto, pkt.DstPort)]
	}
	if !pkt.SYN {
		mask &^= g.SynOnly
	}
	var rules uint64
	if src != nil {
		rules = src.Rules
	}
	return mask & (^g.SrcFiltered | rules)
}

// applyRule is xlimit.c's xl_apply_rule: the rule's verdict and reason,
// whether the drop is answered with a reset, and whether with a cookie.
func (m *Model) applyRule(frame []byte, r *Rule, slot int, pkt *Packet, mask, nowNS uint64) (Verdict, Reason, bool, bool) {
	v, why, reset, answer := m.applyRuleCookie(frame, r, slot, pkt, mask, nowNS)
	// `auto`: a SYN the bucket refused goes to the cookie path too,
	// unless it has been there already (answer is then set).
	if why == ReasonRule && answer == AnswerMax && m.cookieOverflow(r, slot, pkt, nowNS) {
		answer = m.cookieAsk(frame, r, slot, pkt, nowNS)
		if !cookieFallback(answer) {
			why = cookieReason(answer)
			if answer == answerKernel {
				v = VerdictPass
			}
		}
	}
	return v, why, reset, why == ReasonCookie && answer == AnswerOK
}

// answerShadow is xlimit.c's XL_ANSWER_SHADOW: a shadow rule's SYN for the
// cookie path, counted as a cookie, answered never.
const answerShadow = AnswerMax + 1

// answerKernel is xlimit.c's XL_ANSWER_KERNEL: a SYN for the cookie path
// on an interface without XDP_TX (NoXDPTx), passed to the kernel, whose
// own SYN cookies answer it.
const answerKernel = AnswerMax + 2

// cookieAsk is xlimit.c's xl_cookie_ask: the cookie path's class for a SYN
// of rule r in slot.
func (m *Model) cookieAsk(frame []byte, r *Rule, slot int, pkt *Packet, nowNS uint64) Answer {
	switch {
	case r.Flags&RuleShadow != 0:
		return answerShadow
	case m.NoXDPTx:
		return answerKernel
	}
	return m.cookieTake(frame, pkt, slot, nowNS)
}

// applyRuleCookie is xl_apply_rule up to its last step: the cookie path
// before the buckets, the gates and the buckets; and the cookie path's
// class when the SYN went there (AnswerMax: it did not).
func (m *Model) applyRuleCookie(frame []byte, r *Rule, slot int, pkt *Packet, mask, nowNS uint64) (Verdict, Reason, bool, Answer) {
	if (pkt.Fragment || pkt.FirstFrag) && r.Flags&RuleFragDrop != 0 {
		return VerdictDrop, ReasonFragment, false, AnswerMax
	}
	st, b, lim, c, fresh := m.claim(r, slot, nowNS)
	cost := uint64(1)
	if r.Flags&RuleBytes != 0 {
		cost = uint64(pkt.Len)
	}
	// A first fragment: the rule may decide for its whole datagram (frag.go).
	if whole, ok := m.fragWhole(frame, r, slot, pkt); ok {
		cost, m.wholeRule = whole, true
	}
	inc := b.Inc(cost)
	answer := AnswerMax
	if m.cookieFirst(r, slot, pkt, b, inc, nowNS) {
		answer = m.cookieAsk(frame, r, slot, pkt, nowNS)
		if !cookieFallback(answer) {
			if answer == answerKernel {
				return VerdictPass, ReasonCookie, false, answer
			}
			return VerdictDrop, cookieReason(answer), false, answer
		}
		// Not answerable at XDP: through the rule's share for such SYNs (one
		// for those to a socket of the host's, one for the others)
		// first; refused there as by the rate (xlimit.c's out: a reset
		// under `refuse: reset`). Not while no daemon maintains the host
		// addresses: XDP answers nothing then, and the bucket is the
		// kernel's whole.
		if m.Host.Maintained(nowNS) && !m.cookieShareTake(r, slot, answer, b, inc, nowNS) {
			if r.Flags&RuleRefuseReset == 0 || m.NoXDPTx {
				return VerdictDrop, ReasonRule, false, answer
			}
			out := m.resetDecide(frame, pkt, slot, st, &b, inc, nowNS)
			m.Counters[slot].Resets[out]++
			return VerdictDrop, ReasonRule, out == ResetSent, answer
		}
	}
	v, why, reset := m.applyRuleBuckets(frame, r, slot, pkt, mask, nowNS, st, b, lim, c, fresh, inc)
	return v, why, reset, answer
}

// claim is xl_apply_rule's (and xl_cookie_charge's) start: the slot's
// bucket state and cache claimed for rule r, and the bucket in force (the
// control loop's limit while fresh, else the rule's own).
func (m *Model) claim(r *Rule, slot int, nowNS uint64) (st *bucketState, b Bucket, lim *Limit, c *Cache, fresh bool) {
	st = &m.buckets[slot]
	if st.epoch != r.Epoch {
		st.tat, st.units, st.epoch, st.resetTAT, st.probes = nowNS<<TimeShift, 0, r.Epoch, 0, 0
	}
	b = r.Fallback
	lim = &m.Limits[slot]
	c = &m.caches[slot]
	fresh = lim.Epoch == r.Epoch && c.Time(nowNS) < lim.DeadlineNS
	if fresh {
		b = lim.Bucket
	}
	if c.Claim(b, r.Epoch) && m.flood.slot == slot {
		m.flood.left = 0
	}
	return st, b, lim, c, fresh
}

// applyRuleBuckets is xl_apply_rule's gates and buckets.
func (m *Model) applyRuleBuckets(frame []byte, r *Rule, slot int, pkt *Packet, mask, nowNS uint64,
	st *bucketState, b Bucket, lim *Limit, c *Cache, fresh bool, inc uint64) (Verdict, Reason, bool) {
	if pkt.SYN {
		why := ReasonRule
		if fresh && !m.gateAdmit(&lim.Gate, st) {
			why = ReasonBreaker
		} else if r.Flags&RuleConcurrency != 0 && !m.concAdmit(r, slot) {
			why = ReasonConcurrency
		}
		if why != ReasonRule {
			if r.Flags&RuleShadow != 0 || m.NoXDPTx {
				return VerdictDrop, why, false
			}
			out := m.resetDecide(frame, pkt, slot, st, &b, inc, nowNS)
			m.Counters[slot].Resets[out]++
			return VerdictDrop, why, out == ResetSent
		}
	}
	// A SYN refused over the rate: answered with a reset under
	// `refuse: reset` (refuse.h), through the gates' reset path.
	refuse := func(why Reason) (Verdict, Reason, bool) {
		if !pkt.SYN || r.Flags&RuleRefuseReset == 0 || r.Flags&RuleShadow != 0 || m.NoXDPTx {
			return VerdictDrop, why, false
		}
		out := m.resetDecide(frame, pkt, slot, st, &b, inc, nowNS)
		m.Counters[slot].Resets[out]++
		return VerdictDrop, why, out == ResetSent
	}
	// The loop's in-flight cap refuses as the rate does (conns.h's
	// xl_cap_refusal).
	if pkt.SYN && fresh && lim.ConcCap != 0 && !m.capAdmit(r, slot, lim.ConcCap) {
		return refuse(ReasonConcurrency)
	}
	runs := r.Flags&RulePerSource == 0 // bucket.h, xl_runs
	if c.Empty(inc, nowNS, runs) {
		v, why, reset := refuse(ReasonRule)
		if !reset {
			m.floodNote(r, slot, pkt, mask, lim, fresh)
		}
		return v, why, reset
	}
	if r.Flags&RulePerSource != 0 && !m.sourceAdmit(r, slot, pkt, nowNS) {
		return refuse(ReasonSource)
	}
	whole := m.wholeRule
	if whole {
		// The whole datagram's take, in the units of the settings in
		// force as every take is (bucket.h, xl_state_units).
		UnitsClaim(&st.units, &st.tat, &st.resetTAT, b.Tol, nowNS<<TimeShift)
	}
	if whole && FragTake(&st.tat, b, inc, nowNS) || !whole && c.Admit(&st.tat, &st.units, &st.resetTAT, b, inc, nowNS, runs) {
		return VerdictPass, ReasonAdmit, false
	}
	return refuse(ReasonRule)
}

func (m *Model) rand() uint32 {
	if m.Rand == nil {
		return 0
	}
	return m.Rand()
}

// gateAdmit is the Go model of conns.h's xl_gate_admit (one CPU: the
// compare-and-swap always wins).
func (m *Model) gateAdmit(g *Gate, st *bucketState) bool {
	switch {
	case g.Drop == 0:
		return true
	case g.Drop != GateAll:
		return m.rand() >= g.Drop
	case g.Probes == 0:
		return false
	}
	next := uint64(g.Round)<<32 | 1
	if uint32(st.probes>>32) == g.Round {
		next = st.probes + 1
	}
	if uint32(next) > g.Probes {
		return false
	}
	st.probes = next
	return true
}

// concAdmit is the Go model of conns.h's xl_conc_admit.
func (m *Model) concAdmit(r *Rule, slot int) bool {
	c := &m.Conns[slot]
	if c.Epoch != r.Epoch {
		return true
	}
	switch {
	case c.Count < int64(r.ConcSoft):
		return true
	case c.Count >= int64(r.ConcMax):
		return false
	}
	span := uint64(r.ConcMax - r.ConcSoft)
	return uint64(m.rand())*span>>32 >= uint64(c.Count-int64(r.ConcSoft))
}

// capAdmit is whether the Go model of conns.h's xl_cap_refusal lets a SYN
// in.
func (m *Model) capAdmit(r *Rule, slot int, cap uint32) bool {
	c := &m.Conns[slot]
	return c.Epoch != r.Epoch || c.Count < int64(cap)
}

// srcCredit is the Go model of struct xl_src_credit.
type srcCredit struct {
	key       SourceKey
	credit    uint64
	mult, tol uint64
	epoch     uint32
}

// sourceAdmit is the Go model of source.h's xl_source_admit_in, its
// credit and its table (srctable.go) included.
func (m *Model) sourceAdmit(r *Rule, slot int, pkt *Packet, nowNS uint64) bool {
	b := r.Source
	inc := b.Inc(1)
	k := NewSourceKey(r, slot, pkt)
	var cr *srcCredit
	if r.Flags&RuleBan == 0 {
		cr = &m.srcCredits[slot]
	}
	same := cr != nil && cr.epoch == r.Epoch && cr.mult == b.Mult && cr.tol == b.Tol && cr.key == k
	if same && cr.credit >= inc {
		cr.credit -= inc
		return true
	}
	// The filter (srcfilter.go).
	line := m.srcFilterLineOf(k)
	fp := SrcFilterFP(k, m.SrcSeed, r.Epoch, UnitsCode(r.Source.Tol))
	fway, carry := -1, uint32(0)
	if m.noSrcFilter {
		line = &srcFilterLine{} // written, never read
	} else if i := srcfFind(line, fp); i >= 0 {
		if srcfHolds(line, i, nowNS) && line.e[i]&0xff < SrcFilterCountMax {
			line.e[i]++
			m.srcFilterDrops[slot]++
			return false
		}
		fway, carry = i, uint32(line.e[i]&0xff)
	}
	now := nowNS << TimeShift
	s, x := m.srcLocate(k, r, now, true)
	if s.Epoch != r.Epoch {
		s.TAT, s.Units, s.Drops, s.Epoch = now, UnitsCode(b.Tol), 0, r.Epoch
		s.Meta &^= SrcBanned
	}
	srcUnitsClaim(&s.Units, &s.TAT, b.Tol, now)
	refilled := int64(s.TAT-now) <= 0
	var ok bool
	if same {
		batch := min(uint64(BatchNS)<<TimeShift, b.Tol/4)
		need := inc - cr.credit
		took, _ := b.Take(&s.TAT, nowNS, need, max(need, batch))
		ok = took != 0
		if ok {
			cr.credit = cr.credit + took - inc
		}
	} else {
		m.srcCreditName(cr, k, r, b)
		ok = b.GCRA(&s.TAT, nowNS, 1)
	}
	var next uint64 // a ban's next change of state
	if r.Flags&RuleBan != 0 {
		ok = srcBan(s, x, k, r, nowNS, ok, refilled)
		switch {
		case x.BannedUntilNS != 0:
			next = x.BannedUntilNS
		case x.OverSinceNS != 0:
			next = x.OverSinceNS + r.BanAfterNS
		}
	}
	add := carry
	if !ok {
		add++
	}
	if add != 0 && s.Drops < SrcDropsMax {
		s.Drops += add
	}
	var till uint64
	if !ok {
		var credit uint64
		if cr != nil {
			credit = cr.credit
		}
		if ahead := int64(s.TAT + inc - b.Tol - credit - now); ahead > 0 {
			till = now>>TimeShift + uint64(ahead)>>TimeShift
		}
		if next != 0 && next < till {
			till = next
		}
	}
	srcfWrite(line, fway, fp, nowNS, till)
	return ok
}

// srcCreditName is the Go model of source.h's xl_src_credit_name: the
// credit goes back to the source it held and now names k.
func (m *Model) srcCreditName(cr *srcCredit, k SourceKey, r *Rule, b Bucket) {
	if cr == nil {
		return
	}
	m.srcCreditReturn(cr, r)
	*cr = srcCredit{key: k, epoch: r.Epoch, mult: b.Mult, tol: b.Tol}
}
