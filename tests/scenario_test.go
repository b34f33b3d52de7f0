//go:build linux

package tests

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/lab"
)

// phase is a stretch of open-loop load.
type phase struct {
	name string
	rate float64 // connections per second
	dur  time.Duration
}

// request is one connection attempt of the load.
type request struct {
	start   time.Time
	latency time.Duration
	ok      bool
}

// offerPhases opens connections from ns to addr at each phase's rate, one
// request/response each, and returns every attempt.
func offerPhases(ns *lab.NS, addr netip.AddrPort, phases []phase, timeout time.Duration) []request {
	var mu sync.Mutex
	var reqs []request
	var wg sync.WaitGroup
	dialer := &net.Dialer{Timeout: timeout}
	start := time.Now()
	var offset time.Duration
	for _, p := range phases {
		for i := 0; ; i++ {
			at := start.Add(offset + time.Duration(float64(i)/p.rate*float64(time.Second)))
			if at.Sub(start) >= offset+p.dur {
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
					_, err = c.Read(make([]byte, 3))
					ok = err == nil
					c.Close()
				}
				mu.Lock()
				reqs = append(reqs, request{start: t0, latency: time.Since(t0), ok: ok})
				mu.Unlock()
			}()
		}
		offset += p.dur
	}
	wg.Wait()
	return reqs
}

type scenarioResult struct {
	p99, p50          time.Duration
	goodput           float64
	failed, overflows int
	recovery          time.Duration
}

// BenchmarkAdaptiveScenario is docs/design.md section 7's seed scenario scaled
// by 1/10 to what this machine's namespaces carry: a service of 400
// connections/s (4 workers, 10 ms each, backlog 64); steady 200/s, a
// 1500/s spike for 20 s, then 300/s; a static bucket at 1200/s against an
// adaptive one (target 25 ms, R_min 100, R_max 1200). It prints a table;
// it asserts nothing. Run with `make bench` (root).
func BenchmarkAdaptiveScenario(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: namespaces, XDP")
	}
	const (
		workers, backlog = 4, 64
		service          = 10 * time.Millisecond
		target           = 25 * time.Millisecond
	)
	phases := []phase{{"steady", 200, 10 * time.Second}, {"spike", 1500, 20 * time.Second}, {"after", 300, 15 * time.Second}}
	run := func(behavior, extra string) scenarioResult {
		e := newEnv(b)
		addr := netip.AddrPortFrom(e.lab.ServerIP4, tcpPort)
		svc := startSlowService(e.t, e.lab.Server, addr, backlog, workers, service)
		e.startDaemon(e.writeRules("rules.yaml", fmt.Sprintf(`rules:
  - name: svc
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: 1200
    burst: 60
    behavior: %s%s
`, tcpPort, behavior, extra)))
		o0 := svc.overflow()
		start := time.Now()
		reqs := offerPhases(e.lab.Client, addr, phases, 500*time.Millisecond)
		total := time.Since(start)
		var lat []time.Duration
		res := scenarioResult{overflows: int(svc.overflow() - o0)}
		for _, r := range reqs {
			if r.ok {
				lat = append(lat, r.latency)
			} else {
				res.failed++
			}
		}
		slices.Sort(lat)
		if len(lat) > 0 {
			res.p50, res.p99 = lat[len(lat)/2], lat[len(lat)*99/100]
		}
		res.goodput = float64(len(lat)) / total.Seconds()
		// Recovery: from the end of the spike until the first whole
		// second whose P99 is back under target + service time.
		spikeEnd := start.Add(phases[0].dur + phases[1].dur)
		res.recovery = -1
		for s := time.Duration(0); s < phases[2].dur; s += 250 * time.Millisecond {
			var win []time.Duration
			for _, r := range reqs {
				if r.ok && !r.start.Before(spikeEnd.Add(s)) && r.start.Before(spikeEnd.Add(s+time.Second)) {
					win = append(win, r.latency)
				}
			}
			if len(win) == 0 {
				continue
			}
			slices.Sort(win)
			if win[len(win)*99/100] <= target+service+5*time.Millisecond {
				res.recovery = s
				break
			}
		}
		return res
	}
	for range b.N {
		static := run("reject", "")
		adaptive := run("adaptive", `
    adaptive: {target_latency: 25ms, min_rate: 100, max_rate: 1200, ka: 5, km: 0.3, signal: accept_queue}`)
		row := func(name string, r scenarioResult) string {
			rec := "never"
			if r.recovery >= 0 {
				rec = r.recovery.String()
			}
			return fmt.Sprintf("| %s | %v | %v | %.0f/s | %d | %d | %s |", name, r.p50.Round(100*time.Microsecond), r.p99.Round(100*time.Microsecond), r.goodput, r.failed, r.overflows, rec)
		}
		fmt.Printf("\ndocs/design.md §7 scenario, scaled 1/10 (service capacity 400/s; 200/s, 1500/s for 20 s, 300/s):\n\n")
		fmt.Println("| bucket | P50 | P99 | goodput | failed | listen overflows | recovery after the spike |")
		fmt.Println("|---|---|---|---|---|---|---|")
		fmt.Println(row("static 1200/s", static))
		fmt.Println(row("adaptive (target 25 ms)", adaptive))
		b.ReportMetric(float64(static.p99.Microseconds())/1000, "static-p99-ms")
		b.ReportMetric(float64(adaptive.p99.Microseconds())/1000, "adaptive-p99-ms")
	}
}
