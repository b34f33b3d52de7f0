package config

import "time"

// Upper bounds of durations whose excess would lock legitimate traffic
// out for longer than an operator could mean (docs/config.md).
const (
	// MaxBanDuration is the longest ban of a source: a source banned by
	// mistake (a NAT, a shared proxy) gets back within a day at most.
	MaxBanDuration = 24 * time.Hour
	// MaxBanAfter is the longest a source may be over its limit before
	// its ban: beyond an hour the ban is not a response to a flood.
	MaxBanAfter = time.Hour
	// MinProbeInterval is the shortest interval of an adaptive rule's
	// probe: a probe is a connection to the protected service, which must
	// not become load on it.
	MinProbeInterval = 100 * time.Millisecond
)

// durationAtLeast is duration with a lower bound.
func (p *parser) durationAtLeast(m *mapping, key string, limit time.Duration) (time.Duration, loc, bool) {
	d, at, ok := p.duration(m, key, false)
	if ok && d < limit {
		p.errorf(at, "%s is shorter than the minimum of %s", d, limit)
		return 0, at, false
	}
	return d, at, ok
}

// durationAtMost is duration with an upper bound.
func (p *parser) durationAtMost(m *mapping, key string, allowZero bool, limit time.Duration) (time.Duration, loc, bool) {
	d, at, ok := p.duration(m, key, allowZero)
	if ok && d > limit {
		p.errorf(at, "%s is longer than the maximum of %s", d, limit)
		return 0, at, false
	}
	return d, at, ok
}
