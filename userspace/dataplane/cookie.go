package dataplane

import (
	"fmt"
	"math"
	"net/netip"
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
// had for their 4-tuple, TIME_WAIT or open; the model has no sockets and
// never counts it).
type CookieCounters struct {
	Sent, OverBudget, NotLocal, Unanswerable uint64
	Validated, Failed, Refused, AssignFailed uint64
	ToSocket                                 uint64
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

// cookieAnswer is the Go model of syncookie.h's xl_reply_cookie, up to the
// rewrite: whether the SYN is answered (XDP_TX), counting the outcome.
func (m *Model) cookieAnswer(frame []byte, pkt *Packet, slot int, nowNS uint64) bool {
	cnt := &m.CookieCounters[slot]
	l3 := pkt.L3Off
	plain := l3 <= 22 && ((pkt.Family == 4 && pkt.L4Off == l3+20) || (pkt.Family == 6 && pkt.L4Off == l3+40))
	if plain && (len(frame) < pkt.L4Off+13 || len(frame) < pkt.L4Off+int(frame[pkt.L4Off+12]>>4)*4) {
		plain = false // the kernel cannot copy the TCP header for the helper
	}
	if !plain {
		cnt.Unanswerable++
		return false
	}
	var dst netip.Addr
	if pkt.Family == 4 && len(frame) >= l3+20 {
		dst = netip.AddrFrom4([4]byte(frame[l3+16 : l3+20]))
	} else if pkt.Family == 6 && len(frame) >= l3+40 {
		dst = netip.AddrFrom16([16]byte(frame[l3+24 : l3+40]))
	}
	if !dst.IsValid() || !m.Host.Has(IPKey(dst)) {
		cnt.NotLocal++
		return false
	}
	b := m.Plan.Cookies.Budget
	if b.Tol == 0 || !b.GCRA(&m.cookieBudgetTAT, nowNS, 1) {
		cnt.OverBudget++
		return false
	}
	// The kernel may still fail the rewrite (a SYN whose TCP header is
	// cut short, a frame it cannot resize); the corpus has no such SYN
	// that parses as one.
	cnt.Sent++
	m.cookies[slot].lastNS = nowNS
	return true
}
