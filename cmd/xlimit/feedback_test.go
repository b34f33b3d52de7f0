//go:build linux

package main

import (
	"errors"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/control"
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
	fb := newFeedback()
	fb.configure(cfg)
	now := time.Unix(1000, 0)
	if err := fb.put(api.Feedback{Rule: "aq", QueueingDelayMS: 5}, now); !errors.Is(err, api.ErrRejected) {
		t.Errorf("feedback for an accept_queue rule: %v, want ErrRejected", err)
	}
	if err := fb.put(api.Feedback{Rule: "fb", QueueingDelayMS: 40, Errors: 2, Requests: 50}, now); err != nil {
		t.Fatal(err)
	}
	clock := now
	s := &sampler{feedback: fb, now: func() time.Time { return clock }}
	rule := &control.RuleSpec{Name: "fb", Adaptive: cfg.Rules[0].Adaptive}
	sig := s.Sample(rule, 700)
	if sig.LatencyStale || sig.Latency != 40*time.Millisecond || sig.ErrorsStale || sig.ErrorRate != 0.04 || sig.UsedRate != 700 {
		t.Errorf("fresh report: %+v", sig)
	}
	clock = now.Add(feedbackMaxAge + time.Millisecond)
	if sig := s.Sample(rule, 700); !sig.LatencyStale || !sig.ErrorsStale {
		t.Errorf("a report older than %v is still fresh: %+v", feedbackMaxAge, sig)
	}
	// A reload that drops the rule forgets its reports.
	cfg.Rules = cfg.Rules[1:]
	fb.configure(cfg)
	if _, ok := fb.get("fb", now); ok {
		t.Error("a removed rule's report survived the reload")
	}
}
