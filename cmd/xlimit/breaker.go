//go:build linux

package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/xlimit/xlimit/userspace/control"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
)

// breakerOutcomes tells each rule's circuit breaker what its service did
// since the previous tick (control.OutcomeSource); docs/control.md,
// "Circuit breaker", defines what counts:
//
//   - new connections, from the kernel counters of the daemon's network
//     namespace: connections established (Tcp PassiveOpens), handshakes
//     refused by a full accept queue (TcpExt ListenOverflows) and RSTs sent
//     (Tcp OutRsts). An overflow or an RST is a failed connection. For a
//     syn_only packet rule the requests are the connections the rule
//     admitted at XDP this tick and no more of the namespace's failures
//     than that are charged to it; other rules take the namespace's counts.
//   - the rule's probe, when it has one (adaptive with signal: probe):
//     every completed probe is a request, a failed one an error, one slower
//     than slow_latency a slow call. The probe is the only timed call, so
//     slow_ratio needs it. It runs in the daemon's namespace, so its
//     connections never cross the XDP hook of the protected interface: the
//     breaker's gate never stops it, and it keeps measuring the service in
//     every state; in HALF_OPEN its result counts as a probe's.
//
// The loop calls it from one goroutine; the counters are read once per
// tick and shared by the rules.
type breakerOutcomes struct {
	netstat *xsignal.NetStat // nil: the kernel counters cannot be read
	probes  *probes

	at      time.Time // the tick whose delta is in delta
	delta   xsignal.NetCounters
	deltaOK bool
	prev    xsignal.NetCounters
	prevOK  bool

	mu   sync.Mutex
	seen map[string]uint64 // the last probe counted, per rule
}

// newBreakerOutcomes reads the counters of the calling thread's network
// namespace (the daemon's, that of the protected services).
func newBreakerOutcomes(p *probes, log *slog.Logger) *breakerOutcomes {
	b := &breakerOutcomes{probes: p, seen: map[string]uint64{}}
	ns, err := xsignal.OpenNetStat()
	if err != nil {
		log.Warn("cannot read the TCP counters; circuit breakers see only their probes", "err", err)
		return b
	}
	b.netstat = ns
	return b
}

func (b *breakerOutcomes) close() {
	if b.netstat != nil {
		_ = b.netstat.Close()
	}
}

// Outcomes implements control.OutcomeSource.
func (b *breakerOutcomes) Outcomes(rule *control.RuleSpec, admitted uint64, now time.Time) (control.Outcomes, bool) {
	var o control.Outcomes
	fresh := false
	if d, ok := b.counters(now); ok {
		o, fresh = connOutcomes(d, rule.SynOnly && !rule.Bytes, admitted), true
	}
	if b.probes == nil {
		return o, fresh
	}
	pr := b.probes.get(rule.Name)
	if pr == nil {
		return o, fresh
	}
	res, ok := pr.Last(now)
	if !ok {
		return o, fresh
	}
	b.mu.Lock()
	last := b.seen[rule.Name]
	b.seen[rule.Name] = res.Seq
	b.mu.Unlock()
	if res.Seq == last {
		return o, true // no new probe this tick; the last one was fresh
	}
	// Probes completing faster than the loop ticks count once per tick.
	o.Requests++
	switch {
	case !res.OK:
		o.Errors++
	default:
		o.Timed++
		if rule.CircuitBreaker != nil && rule.CircuitBreaker.SlowLatency > 0 && res.Latency > rule.CircuitBreaker.SlowLatency {
			o.Slow++
		}
	}
	return o, true
}

// counters returns the increase of the namespace's TCP counters over the
// last tick, read once per tick.
func (b *breakerOutcomes) counters(now time.Time) (xsignal.NetCounters, bool) {
	if b.netstat == nil {
		return xsignal.NetCounters{}, false
	}
	if now.Equal(b.at) {
		return b.delta, b.deltaOK
	}
	b.at, b.deltaOK = now, false
	cur, err := b.netstat.Read()
	if err != nil {
		b.prevOK = false
		return xsignal.NetCounters{}, false
	}
	if b.prevOK {
		b.delta, b.deltaOK = cur.Sub(b.prev)
	}
	b.prev, b.prevOK = cur, true
	return b.delta, b.deltaOK
}

// connOutcomes turns a tick's counter increases into connection outcomes.
// An RST sent or a handshake refused by a full accept queue is a failed
// connection; a connection to a closed port shows only as an RST, so the
// requests are at least the failures. perRule: the rule admitted exactly
// admitted new connections (a syn_only packet rule); they are the requests
// and at most that many of the namespace's failures are the rule's.
func connOutcomes(d xsignal.NetCounters, perRule bool, admitted uint64) control.Outcomes {
	failed := d.ListenOverflows + d.OutRsts
	reqs := max(d.PassiveOpens+d.ListenOverflows, failed)
	if perRule {
		reqs, failed = admitted, min(failed, admitted)
	}
	const most = 1 << 30 // far beyond any tick's connections; keeps int safe
	return control.Outcomes{Requests: int(min(reqs, most)), Errors: int(min(failed, most))}
}

// logBreakers logs every breaker's change of state.
func (d *daemon) logBreakers(rep control.TickReport) {
	for _, r := range rep.Rules {
		if t := r.Transition; t != nil {
			level := slog.LevelWarn
			if t.To == control.BreakerClosed {
				level = slog.LevelInfo
			}
			d.log.Log(context.Background(), level, "circuit breaker", "rule", r.Name, "from", t.From.String(), "to", t.To.String(), "reason", t.Reason)
		}
	}
}
