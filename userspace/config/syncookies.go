package config

import "github.com/xlimit/xlimit/userspace/dataplane"

// SYN cookies' host-wide settings: the top-level syn_cookies section
// (docs/config.md, "syn_cookies"; docs/dataplane.md, "SYN cookies").

// SynCookies is the top-level syn_cookies section.
type SynCookies struct {
	// AnswerRate is the most SYN-ACKs with a cookie per second that XDP
	// sends on one interface, all rules together: what the host may
	// reflect towards spoofed sources. Its burst is a tenth of a second's
	// worth (dataplane.CookieBudgetSeconds).
	AnswerRate float64
	Line       int
}

// Bounds of syn_cookies.answer_rate: at least one answer per second; at
// most 14.88 million, a 10 Gbit/s port's line rate of minimum frames (a
// SYN-ACK of 74 bytes fills less than it).
const (
	MinCookieAnswerRate = 1
	MaxCookieAnswerRate = 14_880_000
)

// DefaultCookieAnswerRate is answer_rate when the section is absent.
const DefaultCookieAnswerRate = dataplane.DefaultCookieRate

var synCookieKeys = []string{"answer_rate"}

// synCookies decodes the top-level syn_cookies section into c, and checks
// that a rule uses it.
func (p *parser) synCookies(m *mapping, c *Config) {
	s := p.section(m, "syn_cookies", synCookieKeys)
	if s == nil {
		return
	}
	at := m.keyAt("syn_cookies")
	c.SynCookies = &SynCookies{AnswerRate: DefaultCookieAnswerRate, Line: at.line()}
	p.required(s, "answer_rate")
	if v, vat, ok := p.number(s, "answer_rate"); ok {
		if v < MinCookieAnswerRate || v > MaxCookieAnswerRate {
			p.errorf(vat, "must be between %d and %d SYN-ACKs per second, got %v", MinCookieAnswerRate, MaxCookieAnswerRate, v)
		} else {
			c.SynCookies.AnswerRate = v
		}
	}
}

// checkSynCookies warns when the syn_cookies section applies to no rule.
func (p *parser) checkSynCookies(m *mapping, c *Config) {
	if c.SynCookies == nil {
		return
	}
	for i := range c.Rules {
		if m := c.Rules[i].SynCookies; m != "" && m != SynCookiesOff {
			return
		}
	}
	p.warnf(m.keyAt("syn_cookies"), "no rule has syn_cookies auto or always: the section has no effect")
}
