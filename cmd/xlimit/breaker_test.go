//go:build linux

package main

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/control"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
)

func TestConnOutcomes(t *testing.T) {
	for _, c := range []struct {
		name     string
		d        xsignal.NetCounters
		perRule  bool
		admitted uint64
		want     control.Outcomes
	}{
		{"healthy", xsignal.NetCounters{PassiveOpens: 10}, false, 0, control.Outcomes{Requests: 10}},
		{"accepted then reset", xsignal.NetCounters{PassiveOpens: 10, OutRsts: 10}, false, 0, control.Outcomes{Requests: 10, Errors: 10}},
		{"accept queue full", xsignal.NetCounters{PassiveOpens: 2, ListenOverflows: 8}, false, 0, control.Outcomes{Requests: 10, Errors: 8}},
		{"port closed", xsignal.NetCounters{OutRsts: 4}, false, 0, control.Outcomes{Requests: 4, Errors: 4}},
		// A syn_only rule: its own admitted connections are the requests,
		// and no more failures than those are its.
		{"per rule", xsignal.NetCounters{PassiveOpens: 50, OutRsts: 30}, true, 6, control.Outcomes{Requests: 6, Errors: 6}},
		{"per rule, idle", xsignal.NetCounters{OutRsts: 30}, true, 0, control.Outcomes{}},
		{"per rule, healthy", xsignal.NetCounters{PassiveOpens: 6, OutRsts: 1}, true, 6, control.Outcomes{Requests: 6, Errors: 1}},
	} {
		if got := connOutcomes(c.d, c.perRule, c.admitted); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// A rule's probe counts once per completed probe: failed is an error,
// slower than slow_latency is slow, a tick without a new probe adds none.
func TestBreakerOutcomesProbe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	probe := &config.Probe{Kind: config.ProbeTCP, Address: ln.Addr().String(), Interval: 30 * time.Millisecond, Timeout: 30 * time.Millisecond}
	cfg := &config.Config{Rules: []config.Rule{{Name: "p", Adaptive: &config.Adaptive{Signal: config.SignalProbe, Probe: probe}}}}
	var ps probes
	if err := ps.configure(cfg); err != nil {
		t.Fatal(err)
	}
	defer ps.close()
	b := &breakerOutcomes{probes: &ps, seen: map[string]uint64{}} // no counters
	rule := &control.RuleSpec{Name: "p", CircuitBreaker: &config.CircuitBreaker{SlowLatency: time.Hour, SlowRatio: 0.5}}
	sum := func(d time.Duration) (o control.Outcomes) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			got, _ := b.Outcomes(rule, 0, time.Now())
			o.Requests += got.Requests
			o.Errors += got.Errors
			o.Timed += got.Timed
			o.Slow += got.Slow
		}
		return o
	}
	o := sum(300 * time.Millisecond)
	if o.Requests < 3 || o.Errors != 0 || o.Timed != o.Requests || o.Slow != 0 {
		t.Errorf("healthy probes: %+v", o)
	}
	rule.CircuitBreaker.SlowLatency = time.Nanosecond
	if o := sum(300 * time.Millisecond); o.Requests < 3 || o.Slow != o.Timed {
		t.Errorf("every probe slower than 1ns: %+v", o)
	}
	ln.Close()
	time.Sleep(100 * time.Millisecond)
	if o := sum(300 * time.Millisecond); o.Requests < 3 || o.Errors != o.Requests {
		t.Errorf("refused probes: %+v", o)
	}
}

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
