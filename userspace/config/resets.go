package config

import "github.com/xlimit/xlimit/userspace/dataplane"

// The host's budget of TCP resets: the top-level resets section
// (docs/config.md, "resets"; bpf/reset.h). Every reset that XDP sends, a
// gate's refusal or a `refuse: reset` rule's, is taken from one bucket per
// interface, all rules together, after the rule's own: what a spoofed SYN
// flood can make the host reflect.

// Resets is the top-level resets section.
type Resets struct {
	// Rate is the most resets per second that XDP sends on one
	// interface, all rules together; Burst how many at once (default:
	// one second's worth, Rate).
	Rate, Burst float64
	Line        int
}

// Bounds of resets.rate and resets.burst: at least one; at most 14.88
// million, a 10 Gbit/s port's line rate of minimum frames (a reset of 54
// to 74 bytes fills less than it). The burst lasts at most
// dataplane.MaxBurstTime at the rate.
const (
	MinResetRate = 1
	MaxResetRate = 14_880_000
)

// DefaultResetRate and DefaultResetBurst are the budget when the section
// is absent.
const (
	DefaultResetRate  = dataplane.DefaultResetRate
	DefaultResetBurst = dataplane.DefaultResetBurst
)

var resetKeys = []string{"rate", "burst"}

// resets decodes the top-level resets section into c.
func (p *parser) resets(m *mapping, c *Config) {
	s := p.section(m, "resets", resetKeys)
	if s == nil {
		return
	}
	c.Resets = &Resets{Rate: DefaultResetRate, Line: m.keyAt("resets").line()}
	p.required(s, "rate")
	if v, vat, ok := p.number(s, "rate"); ok {
		if v < MinResetRate || v > MaxResetRate {
			p.errorf(vat, "must be between %d and %d resets per second, got %v", MinResetRate, MaxResetRate, v)
		} else {
			c.Resets.Rate = v
		}
	}
	c.Resets.Burst = c.Resets.Rate
	if v, vat, ok := p.number(s, "burst"); ok {
		switch {
		case v < MinResetRate || v > MaxResetRate:
			p.errorf(vat, "must be between %d and %d resets, got %v", MinResetRate, MaxResetRate, v)
		case v/c.Resets.Rate > dataplane.MaxBurstTime.Seconds():
			p.errorf(vat, "%v resets at %v per second last more than %v", v, c.Resets.Rate, dataplane.MaxBurstTime)
		default:
			c.Resets.Burst = v
		}
	}
}
