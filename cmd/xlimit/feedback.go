//go:build linux

package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/control"
)

// feedbackMaxAge is how long a service's last report stays fresh; after
// that the rule's signal is stale and the loop holds its rate.
const feedbackMaxAge = time.Second

// feedback keeps the latest report of each service steered by `signal:
// feedback` (POST /v1/feedback). Reports arrive on API goroutines and are
// read by the loop.
type feedback struct {
	mu      sync.Mutex
	steered map[string]bool // rules with signal: feedback
	last    map[string]feedbackReport
}

type feedbackReport struct {
	delay    time.Duration
	errRate  float64
	hasRate  bool
	received time.Time
}

func newFeedback() *feedback {
	return &feedback{steered: map[string]bool{}, last: map[string]feedbackReport{}}
}

// configure records which rules take feedback; reports for others go.
func (f *feedback) configure(cfg *config.Config) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steered = map[string]bool{}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		if r.Adaptive != nil && r.Adaptive.Signal == config.SignalFeedback {
			f.steered[r.Name] = true
		}
	}
	for name := range f.last {
		if !f.steered[name] {
			delete(f.last, name)
		}
	}
}

// put takes a report. errors and requests count what the service saw
// since its previous report.
func (f *feedback) put(r api.Feedback, now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.steered[r.Rule] {
		return fmt.Errorf("%w: rule %s is not steered by feedback", api.ErrRejected, r.Rule)
	}
	rep := feedbackReport{delay: time.Duration(r.QueueingDelayMS * float64(time.Millisecond)), received: now}
	if r.Requests > 0 {
		rep.errRate, rep.hasRate = float64(r.Errors)/float64(r.Requests), true
	}
	f.last[r.Rule] = rep
	return nil
}

// get returns the rule's latest report if it is fresh.
func (f *feedback) get(rule string, now time.Time) (feedbackReport, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rep, ok := f.last[rule]
	return rep, ok && now.Sub(rep.received) <= feedbackMaxAge
}

// sampler reads the signals of every adaptive rule: the host's through
// the signal package, a service's own through its feedback reports.
type sampler struct {
	host     control.Sampler // nil when the host's signals cannot be read
	feedback *feedback
	now      func() time.Time
}

func (s *sampler) Sample(rule *control.RuleSpec, used float64) control.Signals {
	sig := control.Signals{UsedRate: used, LatencyStale: true, ErrorsStale: true, CPUStale: true}
	if s.host != nil {
		sig = s.host.Sample(rule, used)
	}
	if rule.Adaptive == nil || rule.Adaptive.Signal != config.SignalFeedback {
		return sig
	}
	sig.LatencyStale, sig.ErrorsStale = true, true
	if rep, ok := s.feedback.get(rule.Name, s.now()); ok {
		sig.Latency, sig.LatencyStale = rep.delay, false
		sig.ErrorRate, sig.ErrorsStale = 0, false
		if rep.hasRate {
			sig.ErrorRate = rep.errRate
		}
	}
	return sig
}
