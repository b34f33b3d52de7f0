package dataplane

import (
	"encoding/binary"
	"fmt"
	"math"
)

// SYN cookies (bpf/syncookie.h, docs/dataplane.md "SYN cookies").

// Cookie modes of a rule (RuleSpec.SynCookies).
const (
	CookiesOff    = "off"
	CookiesAuto   = "auto"
	CookiesAlways = "always"
)

// DefaultCookieRate is the budget of SYN cookie answers of all rules, per
// second and interface, when the Spec gives none: about what the kernel
// alone answers under a full-speed spoofed flood on one 10 Gbit/s port
// (SYN-ACKs of 74 bytes: 0.6 Gbit/s at most).
const DefaultCookieRate = 1e6

// CookieBudgetSeconds is the burst of the cookie budget, in seconds of its
// rate.
const CookieBudgetSeconds = 0.1

// CookieHoldNS is how long an `auto` rule keeps answering with cookies
// after the SYNs offered to it were last over its rate (XL_COOKIE_HOLD_NS).
const CookieHoldNS = 1_000_000_000

// Cookies mirrors struct xl_cookie_cfg: one generation's cookie settings.
type Cookies struct {
	Budget Bucket // answers of all rules, packets
	// Rules are the slots with syn_cookies, shadow rules excepted: those
	// whose ACKs the TC program checks.
	Rules      uint64
	MSS4, MSS6 uint16
}

// CookieCounters mirrors struct xl_cookie_counters, summed over CPUs, and
// xl_cookie_sock (ToSocket: SYNs left to a socket the host already
// had for their 4-tuple, TIME_WAIT or open, or whose listener is MPTCP;
// the model has no sockets and never counts it).
type CookieCounters struct {
	Sent, OverBudget, NotLocal, Unanswerable uint64
	Validated, Failed, Refused, AssignFailed uint64
	// RefusedReset: of Refused, the ACKs a rule with refuse: reset
	// refused, answered with a reset by the kernel's listener
	// (xl_cookie_reset).
	RefusedReset uint64
	ToSocket     uint64
}

// Add adds o to c.
func (c *CookieCounters) Add(o CookieCounters) {
	c.Sent += o.Sent
	c.OverBudget += o.OverBudget
	c.NotLocal += o.NotLocal
	c.Unanswerable += o.Unanswerable
	c.Validated += o.Validated
	c.Failed += o.Failed
	c.Refused += o.Refused
	c.RefusedReset += o.RefusedReset
	c.AssignFailed += o.AssignFailed
	c.ToSocket += o.ToSocket
}

func compileCookies(spec *Spec) (Cookies, error) {
	rate := spec.CookieRate
	if rate == 0 {
		rate = DefaultCookieRate
	}
	b, err := NewBucket(rate, math.Max(1, math.Round(rate*CookieBudgetSeconds)), false)
	if err != nil {
		return Cookies{}, fmt.Errorf("compile syn_cookie_rate: %w", err)
	}
	return Cookies{Budget: b, MSS4: spec.MSS4, MSS6: spec.MSS6}, nil
}

func compileRuleCookies(r *RuleSpec, pr *Rule, c *Cookies, bit uint64) error {
	switch r.SynCookies {
	case "", CookiesOff:
		return nil
	case CookiesAuto:
		pr.Flags |= RuleCookieAuto
	case CookiesAlways:
		pr.Flags |= RuleCookieAlways
	default:
		return fmt.Errorf("compile rule %s: syn_cookies %q: want off, auto or always", r.Name, r.SynCookies)
	}
	if !r.SynOnly || r.Protocol != "tcp" {
		return fmt.Errorf("compile rule %s: syn_cookies needs protocol tcp and syn_only", r.Name)
	}
	if !r.Shadow {
		c.Rules |= bit
	}
	return nil
}

// HasCookies reports whether a rule of the plan answers with SYN cookies.
func (p *Plan) HasCookies() bool {
	for i := range p.Rules {
		if p.Rules[i].Active() && p.Rules[i].Flags&(RuleCookieAuto|RuleCookieAlways) != 0 {
			return true
		}
	}
	return false
}

// cookieState mirrors struct xl_cookie_state.
type cookieState struct {
	synTAT, untilNS, lastNS uint64
	epoch                   uint32
}

func (m *Model) cookieClaim(r *Rule, slot int, nowNS uint64) *cookieState {
	cs := &m.cookies[slot]
	if cs.epoch != r.Epoch {
		*cs = cookieState{synTAT: nowNS << TimeShift, epoch: r.Epoch}
	}
	return cs
}

// cookieFirst is the Go model of syncookie.h's xl_cookie_first.
func (m *Model) cookieFirst(r *Rule, slot int, pkt *Packet, b Bucket, inc, nowNS uint64) bool {
	if !pkt.SYN || r.Flags&(RuleCookieAuto|RuleCookieAlways) == 0 {
		return false
	}
	if r.Flags&RuleCookieAlways != 0 {
		return true
	}
	cs := m.cookieClaim(r, slot, nowNS)
	if took, _ := b.Take(&cs.synTAT, nowNS, inc, inc); took == 0 {
		cs.untilNS = nowNS + CookieHoldNS
	}
	return nowNS < cs.untilNS
}

// cookieOverflow is the Go model of syncookie.h's xl_cookie_overflow.
func (m *Model) cookieOverflow(r *Rule, slot int, pkt *Packet, nowNS uint64) bool {
	if !pkt.SYN || r.Flags&RuleCookieAuto == 0 {
		return false
	}
	m.cookieClaim(r, slot, nowNS).untilNS = nowNS + CookieHoldNS
	return true
}

// cookieTake is the Go model of syncookie.h's xl_cookie_take: the class
// of a SYN that rule slot sends to the cookie path (AnswerOK: answered),
// counted. The model has no sockets: AnswerSocket (a socket other than a
// listener, or an MPTCP listener, xl_cookie_has_socket) never happens here.
func (m *Model) cookieTake(frame []byte, pkt *Packet, slot int, nowNS uint64) Answer {
	class := m.answerClass(frame, pkt, nowNS)
	if class == AnswerOK {
		b := m.Plan.Cookies.Budget
		if b.Tol == 0 || !b.GCRA(&m.cookieBudgetTAT, nowNS, 1) {
			class = AnswerBudget
		}
	}
	m.AnswerCounters[slot].Cookie[class]++
	cnt := &m.CookieCounters[slot]
	switch class {
	case AnswerOK:
		// The kernel may still fail the rewrite (a frame it cannot
		// resize: no tailroom); BPF_PROG_TEST_RUN gives every frame its
		// tailroom.
		cnt.Sent++
		m.cookies[slot].lastNS = nowNS
	case AnswerBudget:
		cnt.OverBudget++
	case AnswerDstMAC, AnswerDstIP:
		cnt.NotLocal++
	case AnswerSocket:
		cnt.ToSocket++
	default:
		cnt.Unanswerable++
	}
	if class == AnswerShape && cookieDiscard(frame, pkt) {
		class |= answerDiscard
	}
	if (class == AnswerDstMAC || class == AnswerDstIP) && (m.Host.Incomplete() || !m.Host.Maintained(nowNS)) {
		class |= answerUnlisted
	}
	return class
}

// answerUnlisted is answer.h's XL_ANSWER_UNLISTED: the flag cookieTake
// adds to a SYN to a destination that an incomplete host-address map does
// not list (it may be the host's): counted as its class, it goes on to
// the rule's bucket.
const answerUnlisted Answer = 0x80

// answerDiscard is syncookie.h's XL_ANSWER_DISCARD: the flag cookieTake
// adds to a SYN of class shape whose TCP header runs past the frame or its
// IP packet: Linux would discard it, so it is dropped as malformed_l4.
const answerDiscard Answer = 0x20

// cookieDiscard is syncookie.h's xl_cookie_discard: whether the TCP header
// (its data offset) runs past the frame, or past the end the IP header
// gives (IPv4's total length, IPv6's payload length unless 0).
func cookieDiscard(frame []byte, pkt *Packet) bool {
	l3, l4 := pkt.L3Off, pkt.L4Off
	if l4 > 1024 || l4 < l3 || len(frame) < l4+20 {
		return false
	}
	want := l4 + int(frame[l4+12]>>4)*4
	if want > len(frame) {
		return true
	}
	ipend := 0
	if pkt.Family == 4 {
		if len(frame) < l3+20 {
			return false
		}
		ipend = l3 + int(binary.BigEndian.Uint16(frame[l3+2:]))
	} else {
		if len(frame) < l3+40 {
			return false
		}
		if plen := int(binary.BigEndian.Uint16(frame[l3+4:])); plen != 0 {
			ipend = l3 + 40 + plen
		}
	}
	return ipend != 0 && want > ipend
}

// cookieReason is syncookie.h's xl_cookie_reason: the reason of a SYN the
// cookie path keeps.
func cookieReason(a Answer) Reason {
	if a&answerDiscard != 0 {
		return ReasonMalformedL4
	}
	return ReasonCookie
}

// CookieShareShift is syncookie.h's XL_COOKIE_SHARE_SHIFT: the SYNs a
// rule's cookie path cannot answer take at most 2^-CookieShareShift of the
// rule's rate and burst, in each of its two shares.
const CookieShareShift = 2

// cookieShareSocket is syncookie.h's XL_COOKIE_SHARE_SOCKET: the offset of
// the rules' shares for SYNs to a socket the host has (class socket).
const cookieShareSocket = MaxRules

// cookieShare mirrors struct xl_cookie_share.
type cookieShare struct {
	tat   uint64
	epoch uint32
	units uint32 // UnitsCode of the tolerance tat was written under
}

// cookieShareTake is syncookie.h's xl_cookie_share_take: a SYN of cost inc
// and class that rule slot's cookie path cannot answer, taken from the
// rule's share for such SYNs (tolerance b.Tol, at least one SYN): the
// second share for class socket, the first for the others. The model has
// no sockets, but keeps the kernel's two shares.
func (m *Model) cookieShareTake(r *Rule, slot int, class Answer, b Bucket, inc, nowNS uint64) bool {
	k := slot
	if class == AnswerSocket {
		k += cookieShareSocket
	}
	s := &m.cookieShares[k]
	need := inc << CookieShareShift
	sb := Bucket{Tol: max(b.Tol, need)}
	if s.epoch != r.Epoch {
		*s = cookieShare{tat: nowNS << TimeShift, epoch: r.Epoch, units: UnitsCode(sb.Tol)}
	}
	// A change of the rule's rate keeps how full the share is (issue 41).
	srcUnitsClaim(&s.units, &s.tat, sb.Tol, nowNS<<TimeShift)
	took, _ := sb.Take(&s.tat, nowNS, need, need)
	return took != 0
}

// cookieFallback is syncookie.h's xl_cookie_fallback: whether a SYN of
// class goes on to the rule's gates and bucket.
func cookieFallback(a Answer) bool {
	return a&answerUnlisted != 0 || a == AnswerShape || a == AnswerSocket || a == AnswerBudget
}

// CookieACK is the Go model of syncookie_tc.c's charging of an ACK whose
// cookie the rule in slot answered (the TC program finds that rule by the
// offset its cookie carries; the model has no cookies, so the caller says
// which). The ACK stands for its SYN: it charges the syn_only rules it
// matches from that slot on (those before it charged the SYN at XDP), as
// xl_cookie_charge does, and reports whether one of them refused it. A
// shadow rule that would refuse counts would_drop and refuses nothing. An
// allowlisted or denylisted source is not charged.
func (m *Model) CookieACK(frame []byte, answered int, nowNS uint64) (refused bool) {
	refused, _ = m.CookieACKRefusal(frame, answered, nowNS)
	return refused
}

// CookieACKRefusal is CookieACK that also says how the refusal is
// answered: reset when the rule that refused it has refuse: reset (the
// TC program leaves the ACK to the kernel's listener, TCX_NEXT, which has
// no request for it and answers it with a reset, counted RefusedReset),
// else the ACK is dropped (TC_ACT_SHOT).
func (m *Model) CookieACKRefusal(frame []byte, answered int, nowNS uint64) (refused, reset bool) {
	p := m.Plan
	g := &p.Globals
	pkt, _ := Parse(frame)
	pkt.SYN, pkt.Proto = true, ProtoTCP
	var src *PrefixEntry
	if (pkt.Family == 4 && g.Flags&GlobalPrefixesV4 != 0) || (pkt.Family == 6 && g.Flags&GlobalPrefixesV6 != 0) {
		src = p.Lookup(pkt.Src)
	}
	if src != nil && src.Flags&(PrefixAllow|PrefixDeny) != 0 {
		return false, false
	}
	mask := m.match(&pkt, src) & g.SynOnly
	for i := answered; i < MaxRules && mask>>i != 0; i++ {
		r := &p.Rules[i]
		if mask>>i&1 == 0 || !r.Active() {
			continue
		}
		why := m.cookieCharge(r, i, &pkt, nowNS)
		v := VerdictPass
		switch {
		case why == ReasonAdmit:
		case r.Flags&RuleShadow != 0:
			v = VerdictWouldDrop
		default:
			v = VerdictDrop
		}
		m.Counters[i].count(v, why, uint64(len(frame)))
		if v == VerdictDrop {
			m.CookieCounters[answered].Refused++
			if r.Flags&RuleRefuseReset != 0 {
				m.CookieCounters[answered].RefusedReset++
				return true, true
			}
			return true, false
		}
	}
	return false, false
}

// cookieCharge is syncookie_tc.c's xl_cookie_charge: the gates, the
// per-source bucket and the rule's bucket, as a SYN meets them.
func (m *Model) cookieCharge(r *Rule, slot int, pkt *Packet, nowNS uint64) Reason {
	st, b, lim, c, fresh := m.claim(r, slot, nowNS)
	// The TC program brings the state to the units first
	// (syncookie_tc.c, xl_cookie_units), and its take does not.
	UnitsClaim(&st.units, &st.tat, &st.resetTAT, b.Tol, nowNS<<TimeShift)
	inc := b.Inc(1)
	runs := r.Flags&RulePerSource == 0
	switch {
	case fresh && !m.gateAdmit(&lim.Gate, st):
		return ReasonBreaker
	case r.Flags&RuleConcurrency != 0 && !m.concAdmit(r, slot):
		return ReasonConcurrency
	case c.Empty(inc, nowNS, runs):
		return ReasonRule
	case r.Flags&RulePerSource != 0 && !m.sourceAdmit(r, slot, pkt, nowNS):
		return ReasonSource
	case !c.Admit(&st.tat, &st.units, &st.resetTAT, b, inc, nowNS, runs):
		return ReasonRule
	}
	return ReasonAdmit
}
