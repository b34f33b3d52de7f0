package dataplane

// Model is the Go model of the XDP program: it runs a Plan against frames
// and a clock exactly as the kernel does, keeping its own bucket state and
// counters. Tests compare it with the kernel packet by packet.
type Model struct {
	Plan     *Plan
	Limits   [MaxRules]Limit
	buckets  [MaxRules]bucketState
	Counters [CounterSlots]Counters
}

// Limit is the control loop's bucket for a slot (struct xl_limit).
type Limit struct {
	Bucket     Bucket
	DeadlineNS uint64
	Epoch      uint32
}

type bucketState struct {
	tat   uint64
	epoch uint32
}

// Counters mirrors struct xl_counters, summed over CPUs.
type Counters struct {
	Packets [VerdictMax]uint64
	Bytes   [VerdictMax]uint64
	Reasons [ReasonMax]uint64
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
			return Result{VerdictPass, r}
		}
		return Result{VerdictDrop, r}
	}
	switch pr {
	case ParseNotIP:
		return malformed(ReasonNotIP)
	case ParseMalformedL2:
		return malformed(ReasonMalformedL2)
	}
	if pkt.Family == 0 {
		return malformed(ReasonMalformedL3)
	}
	var src *PrefixEntry
	if (pkt.Family == 4 && g.Flags&GlobalPrefixesV4 != 0) || (pkt.Family == 6 && g.Flags&GlobalPrefixesV6 != 0) {
		src = p.Lookup(pkt.Src)
	}
	if src != nil && src.Flags&PrefixAllow != 0 {
		return Result{VerdictPass, ReasonAllow}
	}
	if src != nil && src.Flags&PrefixDeny != 0 {
		return Result{VerdictDrop, ReasonDeny}
	}
	switch pr {
	case ParseMalformedL3:
		return malformed(ReasonMalformedL3)
	case ParseExtLimit:
		return malformed(ReasonExtLimit)
	case ParseMalformedL4:
		return malformed(ReasonMalformedL4)
	}

	mask := m.match(&pkt, src)
	if mask == 0 {
		return Result{VerdictPass, ReasonNoRule}
	}
	res := Result{VerdictPass, ReasonAdmit}
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
		v, why := m.applyRule(r, i, &pkt, nowNS)
		if v == VerdictDrop && r.Flags&RuleShadow != 0 {
			v = VerdictWouldDrop
		}
		m.Counters[i].count(v, why, uint64(pkt.Len))
		if v == VerdictDrop {
			return Result{VerdictDrop, why}
		}
	}
	return res
}

func (m *Model) match(pkt *Packet, src *PrefixEntry) uint64 {
	g := &m.Plan.Globals
	if pkt.Exempt {
		return 0
	}
	mask := g.Portless[pkt.Proto]
	if pkt.Fragment {
		mask |= g.FragMatch[pkt.Proto]
	} else if pkt.HasPort && pkt.Proto < PortProtos {
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

func (m *Model) applyRule(r *Rule, slot int, pkt *Packet, nowNS uint64) (Verdict, Reason) {
	if pkt.Fragment && r.Flags&RuleFragDrop != 0 {
		return VerdictDrop, ReasonFragment
	}
	st := &m.buckets[slot]
	if st.epoch != r.Epoch {
		st.tat, st.epoch = nowNS<<TimeShift, r.Epoch
	}
	b := r.Fallback
	if lim := &m.Limits[slot]; lim.Epoch == r.Epoch && nowNS < lim.DeadlineNS {
		b = lim.Bucket
	}
	cost := uint64(1)
	if r.Flags&RuleBytes != 0 {
		cost = uint64(pkt.Len)
	}
	if b.GCRA(&st.tat, nowNS, cost) {
		return VerdictPass, ReasonAdmit
	}
	return VerdictDrop, ReasonRule
}
