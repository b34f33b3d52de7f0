//go:build linux

package tests

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// concurrencyRun is what one run of the slow-service scenario measured
// over its slow phase.
type concurrencyRun struct {
	attempts, ok     int
	p50, p99         time.Duration // of the successful requests
	failP50          time.Duration // how long the failed attempts took to fail
	served           int64
	maxInFlight      int64 // the kernel's count, sampled every 20 ms (-1: no limit)
	concurrencyDrops uint64
}

// TestConcurrencyLimitSlowService (docs/design.md §5.7): a TCP service of 8
// workers whose service time rises from 5 ms to 200 ms mid-test (capacity
// 1600 → 40 connections/s), offered 100 connections/s, behind a rule with a
// generous rate. Without a concurrency limit its backlog fills and the
// requests it admits wait for seconds and time out; with `concurrency:
// {soft: 6, max: 8}` the connections in flight stay at the workers' number,
// admitted requests keep the service's own latency, and the excess is
// refused at XDP, with a reset, before it costs the service anything.
func TestConcurrencyLimitSlowService(t *testing.T) {
	const (
		workers, backlog = 8, 128
		fast, slow       = 5 * time.Millisecond, 200 * time.Millisecond
		offered          = 100.0
		before, during   = 2 * time.Second, 8 * time.Second
		timeout          = time.Second
	)
	run := func(t *testing.T, limit bool) concurrencyRun {
		e := newEnv(t)
		addr := netip.AddrPortFrom(e.lab.ServerIP4, tcpPort)
		svc := startSlowService(t, e.lab.Server, addr, backlog, workers, fast)
		conc := ""
		if limit {
			conc = "\n    concurrency: {soft: 6, max: 8}"
		}
		e.startDaemon(e.writeRules("rules.yaml", fmt.Sprintf(`rules:
  - name: svc
    protocol: tcp
    ports: [%d]
    rate: 100000%s
`, tcpPort, conc)))
		tab, err := maps.OpenPinned(filepath.Join(e.bpffs, "xlimit", e.lab.ServerIf), true)
		if err != nil {
			t.Fatal(err)
		}
		defer tab.Close()
		plan, err := tab.ReadPlan()
		if err != nil {
			t.Fatal(err)
		}
		slot := plan.Slot("svc")

		// Sample the kernel's count of connections in flight.
		res := concurrencyRun{maxInFlight: -1}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		if limit {
			res.maxInFlight = 0
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						if c, err := tab.Conns(slot); err == nil {
							res.maxInFlight = max(res.maxInFlight, c.Count)
						}
					}
				}
			}()
		}
		c0, err := tab.Counters(slot)
		if err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(before, func() { svc.SetService(slow) })
		reqs := offerPhases(e.lab.Client, addr, []phase{{"fast", offered, before}, {"slow", offered, during}}, timeout)
		close(stop)
		wg.Wait()
		c1, err := tab.Counters(slot)
		if err != nil {
			t.Fatal(err)
		}
		res.served = svc.served.Load()
		if limit {
			// What the kernel counts is in `xlimit status` too.
			out, err := e.xlimit("status", "--iface", e.lab.ServerIf)
			if err != nil || !strings.Contains(string(out), "connections in flight (concurrency soft 6, max 8)") {
				t.Errorf("xlimit status: %v, no connections in flight for svc:\n%s", err, out)
			}
		}
		res.concurrencyDrops = c1.Reasons[dataplane.ReasonConcurrency] - c0.Reasons[dataplane.ReasonConcurrency]

		// The slow phase, once the first slow requests are through.
		var okLat, failLat []time.Duration
		t0 := reqs[0].start
		for _, r := range reqs {
			if r.start.Sub(t0) < before+time.Second {
				continue
			}
			res.attempts++
			if r.ok {
				res.ok++
				okLat = append(okLat, r.latency)
			} else {
				failLat = append(failLat, r.latency)
			}
		}
		res.p50, res.p99 = quantile(okLat, 0.5), quantile(okLat, 0.99)
		res.failP50 = quantile(failLat, 0.5)
		return res
	}
	without := run(t, false)
	with := run(t, true)
	for _, r := range []struct {
		name string
		r    concurrencyRun
	}{{"without limit", without}, {"concurrency {soft 6, max 8}", with}} {
		t.Logf("e2e concurrency, service 5 ms -> 200 ms, 8 workers, offered %.0f conn/s, slow phase: %s: %d/%d ok, ok latency p50 %v p99 %v, failures took p50 %v, served %d in all, max in flight %d, SYNs refused for concurrency %d",
			offered, r.name, r.r.ok, r.r.attempts, r.r.p50.Round(time.Millisecond), r.r.p99.Round(time.Millisecond),
			r.r.failP50.Round(time.Millisecond), r.r.served, r.r.maxInFlight, r.r.concurrencyDrops)
	}

	// Without the limit the service saturates: what it admits waits in
	// its backlog far beyond its own 200 ms.
	if without.p50 < 3*slow && without.ok > without.attempts/2 {
		t.Errorf("without a limit: p50 %v with %d/%d ok: the scenario does not saturate the service", without.p50, without.ok, without.attempts)
	}
	// With it: in flight at the workers' number (a SYN passes the gate one
	// handshake before it counts: allow two), admitted requests at the
	// service's latency, the excess refused by the gate.
	if with.maxInFlight > 8+2 {
		t.Errorf("with the limit: %d connections in flight, max 8", with.maxInFlight)
	}
	if with.p99 > 2*slow+100*time.Millisecond {
		t.Errorf("with the limit: admitted p99 %v, want near the 200 ms service time", with.p99)
	}
	if with.concurrencyDrops == 0 {
		t.Error("with the limit: no SYN refused for concurrency")
	}
	// Refused connections fail fast: XDP answers their SYN with a reset,
	// where without a limit they wait out the client's timeout.
	if with.failP50 >= timeout/2 {
		t.Errorf("with the limit: refused connections took %v to fail (p50), want a reset well before the %v timeout", with.failP50, timeout)
	}
	// The service keeps serving at its capacity (40/s in the slow phase).
	if with.ok < int(0.6*40*(during-time.Second).Seconds()) {
		t.Errorf("with the limit: %d requests served in the slow phase, capacity about %d", with.ok, int(40*(during-time.Second).Seconds()))
	}
}

func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}
