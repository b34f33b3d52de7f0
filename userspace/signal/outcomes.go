//go:build linux

package signal

import (
	"log/slog"
	"sync"
	"time"
)

// OutcomeReader tells each rule's circuit breaker what its service did
// since the previous tick (the control loop's OutcomeSource); docs/control.md,
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
type OutcomeReader struct {
	netstat *NetStat // nil: the kernel counters cannot be read
	probes  *Probes

	at      time.Time // the tick whose delta is in delta
	delta   NetCounters
	deltaOK bool
	prev    NetCounters
	prevOK  bool

	mu   sync.Mutex
	seen map[string]uint64 // the last probe counted, per rule
}

// NewOutcomeReader reads the counters of the calling thread's network
// namespace (the daemon's, that of the protected services) and the rules'
// probes.
func NewOutcomeReader(p *Probes, log *slog.Logger) *OutcomeReader {
	b := &OutcomeReader{probes: p, seen: map[string]uint64{}}
	ns, err := OpenNetStat()
	if err != nil {
		log.Warn("cannot read the TCP counters; circuit breakers see only their probes", "err", err)
		return b
	}
	b.netstat = ns
	return b
}

// Close releases the counters.
func (b *OutcomeReader) Close() {
	if b.netstat != nil {
		_ = b.netstat.Close()
	}
}

// Outcomes returns what the rule's service did since the previous tick;
// admitted is what the kernel passed of the rule meanwhile. fresh is false
// when nothing could be read.
func (b *OutcomeReader) Outcomes(rule *Rule, admitted uint64, now time.Time) (Outcomes, bool) {
	var o Outcomes
	fresh := false
	if d, ok := b.counters(now); ok {
		o, fresh = connOutcomes(d, rule.SynOnly && !rule.Bytes, admitted), true
	}
	if b.probes == nil {
		return o, fresh
	}
	pr := b.probes.Get(rule.Name)
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
		if rule.SlowLatency > 0 && res.Latency > rule.SlowLatency {
			o.Slow++
		}
	}
	return o, true
}

// counters returns the increase of the namespace's TCP counters over the
// last tick, read once per tick.
func (b *OutcomeReader) counters(now time.Time) (NetCounters, bool) {
	if b.netstat == nil {
		return NetCounters{}, false
	}
	if now.Equal(b.at) {
		return b.delta, b.deltaOK
	}
	b.at, b.deltaOK = now, false
	cur, err := b.netstat.Read()
	if err != nil {
		b.prevOK = false
		return NetCounters{}, false
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
func connOutcomes(d NetCounters, perRule bool, admitted uint64) Outcomes {
	failed := d.ListenOverflows + d.OutRsts
	reqs := max(d.PassiveOpens+d.ListenOverflows, failed)
	if perRule {
		reqs, failed = admitted, min(failed, admitted)
	}
	const most = 1 << 30 // far beyond any tick's connections; keeps int safe
	return Outcomes{Requests: int(min(reqs, most)), Errors: int(min(failed, most))}
}
