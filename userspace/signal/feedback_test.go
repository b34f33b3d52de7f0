package signal

import (
	"errors"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
)

func TestFeedbackSignal(t *testing.T) {
	cfg, err := config.Parse("t.yaml", []byte(`rules:
  - name: fb
    protocol: tcp
    ports: [80]
    rate: 1000
    behavior: adaptive
    adaptive: {target_latency: 25ms, min_rate: 100, max_rate: 5000, signal: feedback}
  - name: aq
    protocol: tcp
    ports: [81]
    rate: 1000
    behavior: adaptive
    adaptive: {target_latency: 25ms, min_rate: 100, max_rate: 5000}
`))
	if err != nil {
		t.Fatal(err)
	}
	fb := NewFeedback()
	fb.Configure(feedbackRules(cfg))
	now := time.Unix(1000, 0)
	if err := fb.Put("aq", 5*time.Millisecond, 0, 0, now); !errors.Is(err, ErrNotSteered) {
		t.Errorf("feedback for an accept_queue rule: %v, want ErrNotSteered", err)
	}
	if err := fb.Put("fb", 40*time.Millisecond, 2, 50, now); err != nil {
		t.Fatal(err)
	}
	clock := now
	s := &Reader{Feedback: fb, Now: func() time.Time { return clock }}
	rule := &Rule{Name: "fb", Signal: cfg.Rules[0].Adaptive.Signal}
	sig := s.Sample(rule, 700)
	if sig.LatencyStale || sig.Latency != 40*time.Millisecond || sig.ErrorsStale || sig.ErrorRate != 0.04 || sig.UsedRate != 700 {
		t.Errorf("fresh report: %+v", sig)
	}
	clock = now.Add(FeedbackMaxAge + time.Millisecond)
	if sig := s.Sample(rule, 700); !sig.LatencyStale || !sig.ErrorsStale {
		t.Errorf("a report older than %v is still fresh: %+v", FeedbackMaxAge, sig)
	}
	// A reload that drops the rule forgets its reports.
	cfg.Rules = cfg.Rules[1:]
	fb.Configure(feedbackRules(cfg))
	if _, ok := fb.Get("fb", now); ok {
		t.Error("a removed rule's report survived the reload")
	}
}

func feedbackRules(cfg *config.Config) []string {
	var names []string
	for _, r := range cfg.Rules {
		if r.Adaptive != nil && r.Adaptive.Signal == config.SignalFeedback {
			names = append(names, r.Name)
		}
	}
	return names
}
