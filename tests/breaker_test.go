//go:build linux

package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
)

// flakyService is a line-echo TCP service in a namespace that can be
// switched to failing: it then accepts each connection and resets it at
// once (SO_LINGER 0), as a crashing worker behind a live listener does.
type flakyService struct {
	ln       *net.TCPListener
	failing  atomic.Bool
	accepted atomic.Int64
	wg       sync.WaitGroup
}

func startFlakyService(t *testing.T, ns *lab.NS, addr netip.AddrPort) *flakyService {
	t.Helper()
	s := &flakyService{}
	err := ns.Do(func() error {
		ln, err := net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(addr))
		s.ln = ln
		return err
	})
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.ln.AcceptTCP()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			if s.failing.Load() {
				_ = c.SetLinger(0)
				c.Close()
				continue
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				if err == nil {
					_, _ = io.WriteString(c, line)
				}
			}()
		}
	}()
	t.Cleanup(func() {
		s.ln.Close()
		s.wg.Wait()
	})
	return s
}

// breakerClient opens connections from ns to addr at a steady rate, one
// line echoed on each, and counts what succeeded and what failed.
type breakerClient struct {
	ok, failed atomic.Int64
}

func (c *breakerClient) run(ctx context.Context, ns *lab.NS, addr netip.AddrPort, every time.Duration) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if c.once(ns, addr, seq) {
					c.ok.Add(1)
				} else {
					c.failed.Add(1)
				}
			}()
		}
	}()
	return &wg
}

func (c *breakerClient) once(ns *lab.NS, addr netip.AddrPort, seq int) bool {
	deadline := time.Now().Add(300 * time.Millisecond)
	var conn net.Conn
	err := ns.Do(func() error {
		d := net.Dialer{Deadline: deadline}
		var err error
		conn, err = d.Dial("tcp", addr.String())
		return err
	})
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	want := fmt.Sprintf("breaker %d\n", seq)
	if _, err := io.WriteString(conn, want); err != nil {
		return false
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	return err == nil && got == want
}

// scrapeMetricsAt reads the daemon's metrics at addr from inside ns.
func scrapeMetricsAt(t *testing.T, ns *lab.NS, addr string) string {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			var c net.Conn
			err := ns.Do(func() error {
				var d net.Dialer
				var err error
				c, err = d.DialContext(ctx, network, a)
				return err
			})
			return c, err
		},
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read metrics: %v", err)
	}
	return string(body)
}

// breakerDrops reads the rule's drop/breaker counter from the pins.
func breakerDrops(t *testing.T, e *env, rule string) uint64 {
	t.Helper()
	out, err := e.xlimit("status", "--json", "--iface", e.lab.ServerIf)
	if err != nil {
		t.Fatalf("xlimit status: %v: %s", err, out)
	}
	var rep struct {
		Interfaces []struct {
			Rules []struct {
				Name     string `json:"name"`
				Counters struct {
					Reasons map[string]uint64 `json:"reasons"`
				} `json:"counters"`
			} `json:"rules"`
		} `json:"interfaces"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Interfaces) != 1 {
		t.Fatalf("decode status (%v): %s", err, out)
	}
	for _, r := range rep.Interfaces[0].Rules {
		if r.Name == rule {
			return r.Counters.Reasons["breaker"]
		}
	}
	t.Fatalf("status has no rule %s: %s", rule, out)
	return 0
}

// waitFor polls cond every 10 ms until it holds or timeout passes, and
// returns how long it took.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// A TCP service that starts resetting every connection trips its rule's
// breaker within a fraction of a second; while OPEN it receives no new
// connections although clients keep trying (their SYNs count as
// drop/breaker at XDP), apart from one half-open probe per retry timeout;
// once it recovers, the next half-open probe succeeds and the breaker lets
// everyone back in.
func TestBreakerTripsAndRecovers(t *testing.T) {
	e := newEnv(t)
	addr := netip.AddrPortFrom(e.lab.ServerIP4, 8470)
	svc := startFlakyService(t, e.lab.Server, addr)
	const retry = 2 * time.Second
	rules := e.writeRules("rules.yaml", fmt.Sprintf(`
rules:
  - name: svc
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: 1000
    circuit_breaker: {error_ratio: 0.5, min_requests: 5, window: 1s, retry_timeout: %v}
`, addr.Port(), retry))
	const metricsAddr = "127.0.0.1:19542"
	d := e.startDaemon(rules, "--metrics-addr", metricsAddr)
	state := func() string {
		m := regexp.MustCompile(`xlimit_rule_state\{rule="svc",state="(closed|open|half_open)"\} 1`).FindStringSubmatch(scrapeMetricsAt(t, e.lab.Server, metricsAddr))
		if m == nil {
			return ""
		}
		return m[1]
	}

	ctx, cancel := context.WithCancel(context.Background())
	var client breakerClient
	wg := client.run(ctx, e.lab.Client, addr, 25*time.Millisecond) // 40 connections/s
	defer func() { cancel(); wg.Wait() }()

	// Healthy: wait until 20 connections succeeded (half a second at 40/s),
	// 5 s at most.
	for deadline := time.Now().Add(5 * time.Second); client.ok.Load() < 20 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if s := state(); s != "closed" || client.ok.Load() < 20 {
		t.Fatalf("healthy service: breaker %q, %d ok, %d failed", s, client.ok.Load(), client.failed.Load())
	}

	// The service fails: the breaker opens.
	svc.failing.Store(true)
	trip := waitFor(t, "breaker open", 5*time.Second, func() bool { return strings.Contains(d.Log(), "to=open") })
	t.Logf("trip: breaker OPEN %v after the service started resetting connections", trip.Round(time.Millisecond))
	if s := state(); s != "open" {
		t.Errorf("metrics say %q after the trip, want open", s)
	}

	// While open, the clients keep trying and the service sees nothing
	// new: sample most of the retry timeout (a connection admitted just
	// before the gate closed may still be accepted at its start).
	time.Sleep(100 * time.Millisecond)
	acc0, drops0, failed0 := svc.accepted.Load(), breakerDrops(t, e, "svc"), client.failed.Load()
	time.Sleep(retry - 500*time.Millisecond)
	acc1, drops1, failed1 := svc.accepted.Load(), breakerDrops(t, e, "svc"), client.failed.Load()
	t.Logf("open for %v: accepted %d -> %d, drop/breaker %d -> %d, client failures %d -> %d",
		retry-500*time.Millisecond, acc0, acc1, drops0, drops1, failed0, failed1)
	if acc1 != acc0 {
		t.Errorf("the service accepted %d connections while the breaker was open", acc1-acc0)
	}
	if drops1-drops0 < 20 || failed1-failed0 < 20 {
		t.Errorf("clients kept trying but drop/breaker grew by %d and failures by %d (want ≥ 20 each at 40/s)", drops1-drops0, failed1-failed0)
	}

	// Still failing: the half-open probe fails and the breaker reopens.
	waitFor(t, "half-open probe failed", 2*retry, func() bool { return strings.Contains(d.Log(), "from=half_open to=open") })

	// The service recovers: the next half-open probe closes the breaker.
	svc.failing.Store(false)
	healed := time.Now()
	recovery := waitFor(t, "breaker closed", 2*retry+time.Second, func() bool { return strings.Contains(d.Log(), "to=closed") })
	t.Logf("recovery: breaker CLOSED %v after the service recovered (retry timeout %v)", recovery.Round(time.Millisecond), retry)
	if recovery > retry+time.Second {
		t.Errorf("closed %v after recovery, want within the retry timeout %v and a margin", recovery, retry)
	}
	ok0, acc2 := client.ok.Load(), svc.accepted.Load()
	time.Sleep(time.Second)
	ok1, acc3 := client.ok.Load(), svc.accepted.Load()
	t.Logf("after closing: %d connections succeeded and %d accepted in 1 s (%v after recovery)", ok1-ok0, acc3-acc2, time.Since(healed).Round(time.Millisecond))
	if s := state(); s != "closed" || ok1-ok0 < 20 || acc3-acc2 < 20 {
		t.Errorf("after recovery: breaker %q, %d ok and %d accepted in 1 s, want closed and ≥ 20", s, ok1-ok0, acc3-acc2)
	}
	if m := regexp.MustCompile(`xlimit_drops_total\{iface="[^"]+",reason="breaker",rule="svc"\} (\d+)`).FindStringSubmatch(scrapeMetricsAt(t, e.lab.Server, metricsAddr)); m == nil || m[1] == "0" {
		t.Errorf("metrics: no drop/breaker counted for svc (%v)", m)
	}
}
