//go:build linux

package tests

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/tests/kit/xdppass"
)

// pooledService is a TCP service that queues inside itself, as Go's
// net/http, nginx and Node do: one accept loop takes every connection at
// once (the accept queue stays empty) and hands it to a pool of workers
// through an unbounded queue; each worker reads the request line, works
// for the service time, answers and closes.
type pooledService struct {
	ln     net.Listener
	served atomic.Int64 // answers written
	mu     sync.Mutex
	cond   *sync.Cond
	queue  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

func startPooledService(t testing.TB, ns *lab.NS, addr netip.AddrPort, workers int, service time.Duration) *pooledService {
	t.Helper()
	s := &pooledService{}
	s.cond = sync.NewCond(&s.mu)
	if err := ns.Do(func() error {
		var err error
		s.ln, err = net.Listen("tcp", addr.String())
		return err
	}); err != nil {
		t.Fatalf("start pooled service: %v", err)
	}
	s.wg.Add(1)
	go func() { // the accept loop
		defer s.wg.Done()
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.queue = append(s.queue, c)
			s.mu.Unlock()
			s.cond.Signal()
		}
	}()
	for range workers {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				s.mu.Lock()
				for len(s.queue) == 0 && !s.closed {
					s.cond.Wait()
				}
				if s.closed {
					s.mu.Unlock()
					return
				}
				c := s.queue[0]
				s.queue = s.queue[1:]
				s.mu.Unlock()
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
					time.Sleep(service)
					if _, err := c.Write([]byte("ok\n")); err == nil {
						s.served.Add(1)
					}
				}
				c.Close()
			}
		}()
	}
	t.Cleanup(func() {
		s.ln.Close()
		s.mu.Lock()
		s.closed = true
		for _, c := range s.queue {
			c.Close()
		}
		s.mu.Unlock()
		s.cond.Broadcast()
		s.wg.Wait()
	})
	return s
}

// offerRequests opens connections from ns at rate per second for d, each
// sending one request line and reading the answer within timeout (from
// the dial on), and returns every attempt.
func offerRequests(ns *lab.NS, addr netip.AddrPort, rate float64, d, timeout time.Duration) []request {
	var mu sync.Mutex
	var reqs []request
	var wg sync.WaitGroup
	dialer := &net.Dialer{Timeout: timeout}
	start := time.Now()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if at.Sub(start) >= d {
			break
		}
		time.Sleep(time.Until(at))
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			var c net.Conn
			err := ns.Do(func() error {
				var err error
				c, err = dialer.Dial("tcp", addr.String())
				return err
			})
			ok := false
			if err == nil {
				_ = c.SetDeadline(t0.Add(timeout))
				if _, err = c.Write([]byte("GET / HTTP/1.0\n")); err == nil {
					_, err = c.Read(make([]byte, 3))
				}
				ok = err == nil
				c.Close()
			}
			mu.Lock()
			reqs = append(reqs, request{start: t0, latency: time.Since(t0), ok: ok})
			mu.Unlock()
		}()
	}
	wg.Wait()
	return reqs
}

type requestStats struct {
	attempts, ok int
	p50, p99     time.Duration // of the answered requests
}

func statsOf(reqs []request) requestStats {
	s := requestStats{attempts: len(reqs)}
	var lat []time.Duration
	for _, r := range reqs {
		if r.ok {
			s.ok++
			lat = append(lat, r.latency)
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		s.p50, s.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return s
}

// TestResponseTimeInternalQueue: a service that queues inside itself (one
// accept loop feeding 4 workers × 10 ms: 400 requests/s) offered 1000
// connections/s, each one request with a 1 s timeout. Its accept queue
// stays empty, so only the time to its answer shows the overload.
// Unprotected, its internal queue grows without bound and the answers
// come too late; with an adaptive rule on signal response_time (the
// kernel's on-wire measure: XDP stamps the request, TC egress times the
// answer) the rate follows the service and the answered requests keep
// their latency near the 25 ms target plus the service time.
func TestResponseTimeInternalQueue(t *testing.T) {
	const (
		workers = 4
		service = 10 * time.Millisecond
		offered = 1000.0
		warm    = 3 * time.Second
		dur     = 10 * time.Second
		timeout = time.Second
	)
	run := func(t *testing.T, adaptive bool) (requestStats, float64, float64) {
		e := newEnv(t)
		addr := netip.AddrPortFrom(e.lab.ServerIP4, tcpPort)
		svc := startPooledService(t, e.lab.Server, addr, workers, service)
		rule := fmt.Sprintf(`rules:
  - name: svc
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: 100000
`, tcpPort)
		if adaptive {
			rule = fmt.Sprintf(`rules:
  - name: svc
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: 1000
    burst: 50
    behavior: adaptive
    adaptive: {target_latency: 25ms, min_rate: 50, max_rate: 2000, signal: response_time}
`, tcpPort)
		}
		e.startDaemon(e.writeRules("rules.yaml", rule))
		offerRequests(e.lab.Client, addr, offered, warm, timeout)
		s0 := svc.served.Load()
		st := statsOf(offerRequests(e.lab.Client, addr, offered, dur, timeout))
		served := float64(svc.served.Load()-s0) / dur.Seconds()
		_, _, rate, _ := e.status().rule("svc")
		return st, served, rate
	}
	un, unServed, _ := run(t, false)
	ad, adServed, rate := run(t, true)
	good := func(s requestStats) float64 { return float64(s.ok) / dur.Seconds() }
	t.Logf("e2e response_time (capacity %d/s, offered %.0f/s, timeout %v): unprotected: %d/%d answered in time (%.0f/s), p50 %v p99 %v, the service answered %.0f/s; "+
		"adaptive response_time: %d/%d answered in time (%.0f/s), p50 %v p99 %v, the service answered %.0f/s, rate in force at the end %.0f/s",
		workers*int(time.Second/service), offered, timeout, un.ok, un.attempts, good(un), un.p50, un.p99, unServed,
		ad.ok, ad.attempts, good(ad), ad.p50, ad.p99, adServed, rate)

	capacity := float64(workers) * float64(time.Second/service)
	if good(un) > 0.5*capacity {
		t.Errorf("unprotected: %.0f/s answered in time: the test does not overload the service", good(un))
	}
	// Protected: the answered requests wait about the target, not the
	// whole internal queue, and most of the capacity answers in time.
	if ad.p50 > 4*25*time.Millisecond+service {
		t.Errorf("adaptive response_time: median latency %v, want near the 25 ms target + %v service", ad.p50, service)
	}
	if g := good(ad); g < 0.6*capacity {
		t.Errorf("adaptive response_time: %.0f/s answered in time, want at least 60 %% of the capacity %.0f/s", g, capacity)
	}
}

// TestRefuseReset: a rule with `refuse: reset` answers the SYNs over its
// rate with a reset, so that the client fails at once (connection
// refused); with the default, `refuse: drop`, the same SYNs are dropped and
// the client waits for its timeout.
func TestRefuseReset(t *testing.T) {
	const timeout = 700 * time.Millisecond
	run := func(t *testing.T, refuse string) (refused, timedOut, connected int, slowest time.Duration) {
		e := newEnv(t)
		addr := netip.AddrPortFrom(e.lab.ServerIP4, tcpPort)
		startSlowService(t, e.lab.Server, addr, 64, 2, 0)
		e.startDaemon(e.writeRules("rules.yaml", fmt.Sprintf(`rules:
  - name: svc
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: 1
    burst: 2
    refuse: %s
`, tcpPort, refuse)))
		// The client's veth runs an XDP pass program: a veth delivers its
		// peer's XDP_TX frames (the resets) at once only then
		// (xdppass.Attach); otherwise they wait in its ring for the
		// next frame of the server's stack, which a refused client never
		// gets (seen on a quiet machine: 0 of 4 resets arrived).
		if err := e.lab.Client.Do(func() error {
			c, err := xdppass.Attach(e.lab.ClientIf)
			if err == nil {
				t.Cleanup(func() { c.Close() })
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		// Six connections at once: two within the burst, the rest over it.
		dialer := &net.Dialer{Timeout: timeout}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t0 := time.Now()
				var c net.Conn
				err := e.lab.Client.Do(func() error {
					var err error
					c, err = dialer.Dial("tcp", addr.String())
					return err
				})
				took := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					connected++
					c.Close()
				case errors.Is(err, syscall.ECONNREFUSED):
					refused++
					slowest = max(slowest, took)
				default:
					timedOut++
				}
			}()
		}
		wg.Wait()
		return
	}
	rr, rt, rc, slowest := run(t, "reset")
	dr, dt, dc, _ := run(t, "drop")
	t.Logf("e2e refuse (rate 1/s, burst 2, 6 connections at once): reset: %d connected, %d refused (slowest refusal %v), %d timed out; drop: %d connected, %d refused, %d timed out after %v",
		rc, rr, slowest, rt, dc, dr, dt, timeout)
	if rc != 2 || rr != 2 || rt != 2 {
		// The rule's reset budget is its rate and burst: 2 resets, then drops.
		t.Errorf("refuse reset: %d connected, %d refused, %d timed out; want 2, 2 (the rule's reset burst), 2", rc, rr, rt)
	}
	if slowest > 100*time.Millisecond {
		t.Errorf("refuse reset: a refusal took %v, want a reset in milliseconds", slowest)
	}
	if dc != 2 || dr != 0 || dt != 4 {
		t.Errorf("refuse drop: %d connected, %d refused, %d timed out; want 2, 0, 4", dc, dr, dt)
	}
}
