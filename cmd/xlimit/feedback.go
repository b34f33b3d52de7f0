//go:build linux

package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/control"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
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

// probes runs a prober per rule steered by `signal: probe`.
type probes struct {
	mu sync.Mutex
	by map[string]*xsignal.Prober
}

// configure starts probers for new or changed probe rules and stops the
// others; unchanged ones keep running.
func (p *probes) configure(cfg *config.Config) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.by == nil {
		p.by = map[string]*xsignal.Prober{}
	}
	want := map[string]config.Probe{}
	for i := range cfg.Rules {
		r := &cfg.Rules[i]
		if r.Adaptive != nil && r.Adaptive.Signal == config.SignalProbe && r.Adaptive.Probe != nil {
			want[r.Name] = *r.Adaptive.Probe
		}
	}
	for name, pr := range p.by {
		if spec, ok := want[name]; !ok || spec != pr.Spec() {
			pr.Close()
			delete(p.by, name)
		}
	}
	for name, spec := range want {
		if _, ok := p.by[name]; ok {
			continue
		}
		pr, err := xsignal.StartProber(spec)
		if err != nil {
			return fmt.Errorf("probe for rule %s: %w", name, err)
		}
		p.by[name] = pr
	}
	return nil
}

func (p *probes) get(rule string) *xsignal.Prober {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.by[rule]
}

func (p *probes) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, pr := range p.by {
		pr.Close()
		delete(p.by, name)
	}
}

// sampler reads the signals of every adaptive rule: the host's through
// the signal package, a service's own through its feedback reports or a
// prober's measurements.
type sampler struct {
	host     control.Sampler // nil when the host's signals cannot be read
	feedback *feedback
	probes   *probes
	now      func() time.Time
}

func (s *sampler) Sample(rule *control.RuleSpec, used float64) control.Signals {
	sig := control.Signals{UsedRate: used, LatencyStale: true, ErrorsStale: true, CPUStale: true}
	if s.host != nil {
		sig = s.host.Sample(rule, used)
	}
	if rule.Adaptive == nil {
		return sig
	}
	switch rule.Adaptive.Signal {
	case config.SignalProbe:
		sig.LatencyStale, sig.ErrorsStale = true, true
		if pr := s.probes.get(rule.Name); pr != nil {
			if res, ok := pr.Last(s.now()); ok {
				sig.ErrorRate, sig.ErrorsStale = res.ErrorRate, false
				if res.Latency > 0 {
					sig.Latency, sig.LatencyStale = res.Latency, false
				}
			}
		}
		return sig
	case config.SignalFeedback:
	default:
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
