package daemon

import (
	"strings"
	"testing"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/signal"
)

// A breaker is enforced; only its slow check without a probe is not.
func TestBreakerNotEnforced(t *testing.T) {
	for _, c := range []struct {
		breaker string
		warn    bool
	}{
		{"{error_ratio: 0.5}", false},
		{"{slow_latency: 100ms, slow_ratio: 0.5}", true},
	} {
		cfg, err := config.Parse("t.yaml", []byte("rules:\n  - name: b\n    protocol: tcp\n    ports: [80]\n    syn_only: true\n    rate: 100\n    circuit_breaker: "+c.breaker+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		got := notEnforced(cfg)
		if warned := len(got) == 1 && strings.Contains(got[0], "slow_ratio without a probe"); warned != c.warn || (!c.warn && len(got) != 0) {
			t.Errorf("%s: not enforced %q, want a slow_ratio warning: %v", c.breaker, got, c.warn)
		}
	}
}

// An adaptive rule on response_time counts and caps its requests in
// flight (the kernel's bpf/request.h): its signal rule is marked; one on
// the accept queue, or a static rule, is not. docs/examples/http-service.yaml
// as it ships is marked.
func TestRequestsMarked(t *testing.T) {
	for _, c := range []struct {
		rule string
		want bool
	}{
		{"rate: 100\n    behavior: adaptive\n    adaptive: {signal: response_time, target_latency: 30ms, min_rate: 10, max_rate: 10000}", true},
		{"rate: 100\n    behavior: adaptive\n    adaptive: {signal: accept_queue, target_latency: 30ms, min_rate: 10, max_rate: 10000}", false},
		{"rate: 100", false},
	} {
		cfg, err := config.Parse("t.yaml", []byte("rules:\n  - name: web\n    protocol: tcp\n    ports: [80]\n    syn_only: true\n    "+c.rule+"\n"))
		if err != nil {
			t.Fatalf("%s: %v", c.rule, err)
		}
		s := Translate(cfg)
		sr := s.Signals["web"]
		if got := sr != nil && sr.Requests; got != c.want {
			t.Errorf("%s: counts requests %v, want %v", c.rule, got, c.want)
		}
	}
	cfg, err := config.Load("../docs/examples/http-service.yaml")
	if err != nil {
		t.Fatal(err)
	}
	marked := 0
	for _, sr := range Translate(cfg).Signals {
		if sr.Requests {
			marked++
		}
	}
	if marked == 0 {
		t.Error("docs/examples/http-service.yaml: no rule counts requests")
	}
}

// The measures answer for the rules marked as counting requests only, and
// only where an interface's maps count them: none here.
func TestRequestsInFlightUnmarked(t *testing.T) {
	k := &kernelMeasures{attached: func(f func([]*loader.Attachment, map[string]*dataplane.Plan)) { f(nil, nil) }}
	for _, r := range []*signal.Rule{{Name: "web"}, {Name: "web", Requests: true}} {
		if n, ok := k.RequestsInFlight(r); ok {
			t.Errorf("%+v: %d requests in flight with nothing attached", r, n)
		}
	}
}
