package signal

import (
	"time"

	"github.com/xlimit/xlimit/userspace/config"
)

// HostSampler reads the signals the host shows of a rule's service (the
// Sampler of this package, or a fake in tests).
type HostSampler interface {
	Sample(rule *Rule, used float64) Signals
}

// Reader reads every adaptive rule's signals: the host's through Host, a
// service's own through its Feedback reports or its prober's measurements.
type Reader struct {
	Host     HostSampler // nil when the host's signals cannot be read
	Feedback *Feedback
	Probes   *Probes
	Now      func() time.Time

	seen map[string]*readerState // per rule, the last sample read
}

// readerState tells a rule's new probe results and reports from repeated
// ones, and keeps the minimum of its probe latencies.
type readerState struct {
	seq      uint64
	received time.Time
	base     minWindow
}

func (s *Reader) state(rule string) *readerState {
	if s.seen == nil {
		s.seen = map[string]*readerState{}
	}
	st := s.seen[rule]
	if st == nil {
		st = &readerState{}
		s.seen[rule] = st
	}
	return st
}

// Sample returns the rule's signals for this tick; used is the rate the
// kernel admitted over the last tick.
func (s *Reader) Sample(rule *Rule, used float64) Signals {
	sig := Stale(used)
	if s.Host != nil {
		sig = s.Host.Sample(rule, used)
	}
	switch rule.Signal {
	case config.SignalProbe:
		sig.LatencyStale, sig.ErrorsStale = true, true
		if pr := s.Probes.Get(rule.Name); pr != nil {
			if res, ok := pr.Last(s.Now()); ok {
				st := s.state(rule.Name)
				sig.ErrorRate, sig.ErrorsStale = res.ErrorRate, false
				if res.Latency > 0 {
					sig.Latency, sig.LatencyStale = res.Latency, false
					// A probe's latency is a whole exchange: its base,
					// the service's idle latency, is the recent minimum.
					sig.BaseLatency = st.base.observe(res.Latency, res.At)
				}
				sig.LatencyRepeated = res.Seq == st.seq
				st.seq = res.Seq
			}
		}
	case config.SignalFeedback:
		sig.LatencyStale, sig.ErrorsStale = true, true
		if s.Feedback == nil {
			break
		}
		if rep, ok := s.Feedback.Get(rule.Name, s.Now()); ok {
			st := s.state(rule.Name)
			sig.Latency, sig.LatencyStale = rep.Delay, false
			sig.LatencyRepeated = rep.Received.Equal(st.received)
			st.received = rep.Received
			sig.ErrorRate, sig.ErrorsStale = 0, false
			if rep.HasRate {
				sig.ErrorRate = rep.ErrRate
			}
		}
	}
	return sig
}
