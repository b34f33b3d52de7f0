//go:build linux

package signal

import (
	"net"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
)

func TestConnOutcomes(t *testing.T) {
	for _, c := range []struct {
		name     string
		d        NetCounters
		perRule  bool
		admitted uint64
		want     Outcomes
	}{
		{"healthy", NetCounters{PassiveOpens: 10}, false, 0, Outcomes{Requests: 10}},
		{"accepted then reset", NetCounters{PassiveOpens: 10, OutRsts: 10}, false, 0, Outcomes{Requests: 10, Errors: 10}},
		{"accept queue full", NetCounters{PassiveOpens: 2, ListenOverflows: 8}, false, 0, Outcomes{Requests: 10, Errors: 8}},
		{"port closed", NetCounters{OutRsts: 4}, false, 0, Outcomes{Requests: 4, Errors: 4}},
		// A syn_only rule: its own admitted connections are the requests,
		// and no more failures than those are its.
		{"per rule", NetCounters{PassiveOpens: 50, OutRsts: 30}, true, 6, Outcomes{Requests: 6, Errors: 6}},
		{"per rule, idle", NetCounters{OutRsts: 30}, true, 0, Outcomes{}},
		{"per rule, healthy", NetCounters{PassiveOpens: 6, OutRsts: 1}, true, 6, Outcomes{Requests: 6, Errors: 1}},
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
	var ps Probes
	if err := ps.Configure(map[string]config.Probe{"p": *probe}); err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	b := &OutcomeReader{probes: &ps, seen: map[string]uint64{}} // no counters
	rule := &Rule{Name: "p", SlowLatency: time.Hour}
	sum := func(d time.Duration) (o Outcomes) {
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
	rule.SlowLatency = time.Nanosecond
	if o := sum(300 * time.Millisecond); o.Requests < 3 || o.Slow != o.Timed {
		t.Errorf("every probe slower than 1ns: %+v", o)
	}
	ln.Close()
	time.Sleep(100 * time.Millisecond)
	if o := sum(300 * time.Millisecond); o.Requests < 3 || o.Errors != o.Requests {
		t.Errorf("refused probes: %+v", o)
	}
}
