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
				sig.ErrorRate, sig.ErrorsStale = res.ErrorRate, false
				if res.Latency > 0 {
					sig.Latency, sig.LatencyStale = res.Latency, false
				}
			}
		}
	case config.SignalFeedback:
		sig.LatencyStale, sig.ErrorsStale = true, true
		if s.Feedback == nil {
			break
		}
		if rep, ok := s.Feedback.Get(rule.Name, s.Now()); ok {
			sig.Latency, sig.LatencyStale = rep.Delay, false
			sig.ErrorRate, sig.ErrorsStale = 0, false
			if rep.HasRate {
				sig.ErrorRate = rep.ErrRate
			}
		}
	}
	return sig
}
