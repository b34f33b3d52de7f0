package config

import "math"

// fleetKeys are the keys of a rule's fleet section (docs/fleet.md).
var fleetKeys = []string{"rate", "burst", "key", "safe_rate"}

func init() { ruleKeys = append(ruleKeys, "fleet") }

// MaxFleetKey bounds the length of a fleet key (a part of Redis keys).
const MaxFleetKey = 200

// Fleet shares a budget among the hosts of a fleet (xlimit run --fleet):
// the rule's own rate stays this host's ceiling.
type Fleet struct {
	Rate  float64 // the fleet-wide rate (packets/s)
	Burst float64 // the fleet-wide burst; filled in: max(Rate, 1) when not given
	// Key names the budget in the store; the rule's name when not given.
	// The hosts whose rules have the same key share one budget.
	Key string
	// SafeRate is the fallback of a host without a lease; 0: the budget
	// ÷ the last known number of hosts.
	SafeRate float64
	keyAt    loc
}

// StaticRate is the rate the kernel falls back to when the daemon stops
// steering a fleet rule: min(the host's ceiling, safe_rate). Without
// safe_rate it is the ceiling (docs/fleet.md).
func (r *Rule) StaticRate() float64 {
	if f := r.Fleet; f != nil && f.SafeRate > 0 {
		return math.Min(r.Rate, f.SafeRate)
	}
	return r.Rate
}

func (p *parser) fleet(rule *mapping, ctx ruleCtx, name string) *Fleet {
	s := p.section(rule, "fleet", fleetKeys)
	if s == nil {
		return nil
	}
	at := rule.keyAt("fleet")
	if ctx.unitOK && ctx.unit != UnitPackets {
		p.errorf(at, "a fleet budget counts packets (the offered rate is counted in packets): requires unit packets")
	}
	f := &Fleet{Key: name, keyAt: at}
	p.required(s, "rate")
	rate, rateAt, rateOK := p.number(s, "rate")
	if rateOK {
		rateOK = p.checkRate(rateAt, rate, UnitPackets, true)
	}
	f.Rate, f.Burst = rate, math.Max(rate, 1)
	if b, bAt, ok := p.number(s, "burst"); ok {
		switch {
		case b < 1:
			p.errorf(bAt, "%g is smaller than one packet (minimum 1)", b)
		case rateOK:
			p.checkBurstSeconds(bAt, b, rate)
		}
		f.Burst = b
	}
	if k, kAt, ok := p.str(s, "key"); ok {
		switch {
		case k == "" || hasSpaceOrControl(k):
			p.errorf(kAt, "want a non-empty name without spaces or control characters")
		case len(k) > MaxFleetKey:
			p.errorf(kAt, "%d bytes long (at most %d)", len(k), MaxFleetKey)
		}
		f.Key, f.keyAt = k, kAt
	}
	if v, vAt, ok := p.number(s, "safe_rate"); ok {
		switch {
		case v < 1:
			p.errorf(vAt, "%g is below 1 packet/s", v)
		case rateOK && v > rate:
			p.errorf(vAt, "%g exceeds the fleet's rate %g", v, rate)
		}
		f.SafeRate = v
	} else if !s.has("safe_rate") && rateOK {
		p.warnf(at, "no safe_rate: while the store is lost a host falls back to the budget ÷ the last known number of hosts, but if the daemon stops, the kernel falls back to the rule's own rate (the host's ceiling); set safe_rate to bound that too")
	}
	return f
}

// checkFleet checks that no two rules of the file share a fleet key: a
// host reports one demand per key.
func (p *parser) checkFleet(c *Config) {
	seen := map[string]int{}
	for i := range c.Rules {
		f := c.Rules[i].Fleet
		if f == nil {
			continue
		}
		if pc := c.Rules[i].Paced; pc != nil && pc.Queue == QueueKernel {
			p.errorf(f.keyAt, "a fleet share steers the XDP rate; a kernel queue paces at the static rate: use queue: xdp or no fleet")
		}
		if first, dup := seen[f.Key]; dup {
			p.errorf(f.keyAt, "fleet key %s is already the key of another rule (line %d): a host has one share per key", quote(f.Key), first)
			continue
		}
		seen[f.Key] = f.keyAt.line()
	}
}
