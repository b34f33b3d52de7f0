//go:build linux

package tests

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
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
	return offerPhasesWith(ns, addr, phases, timeout, nil)
}

// offerPhasesWith is offerPhases writing req on each connection before
// reading the answer (nil: read only).
func offerPhasesWith(ns *lab.NS, addr netip.AddrPort, phases []phase, timeout time.Duration, req []byte) []request {
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
					if req != nil {
						_, err = c.Write(req)
					}
					if err == nil {
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
		offset += p.dur
	}
	wg.Wait()
	return reqs
}

// BenchmarkAdaptiveScenario is docs/design.md section 7's seed scenario
// scaled by 1/10 to what this machine's namespaces carry: steady 200/s, a
// 1500/s spike for 20 s, then 300/s; target 25 ms, R_min 100, R_max 1200,
// in front of a service whose capacity is R_max (12 workers × 10 ms, backlog
// 64), which the seed's published figures imply (81 % served). Every
// variant in the same run: unprotected, static buckets at the capacity and
// at 5× it, the adaptive law (track) and AIMD. It prints a table; it
// asserts nothing. Run with `make bench` (root).
func BenchmarkAdaptiveScenario(b *testing.B) {
	sc := capScenario{name: "Seed scenario (docs/design.md §7) scaled 1/10", workers: 12, backlog: 64, service: 10 * time.Millisecond,
		phases:   []phase{{"steady", 200, 10 * time.Second}, {"spike", 1500, 20 * time.Second}, {"after", 300, 15 * time.Second}},
		overload: 1, target: 25 * time.Millisecond, timeout: time.Second}
	rs := runCapBench(b, sc, []capVariant{
		{"unprotected", ""},
		{"static 1200/s (capacity)", staticRule(1200)},
		{"static 6000/s (5× capacity)", staticRule(6000)},
		{"adaptive track", adaptiveRule(1200, 100, 1200, sc.target, "")},
		{"adaptive aimd (design §5.4 gains)", adaptiveRule(1200, 100, 1200, sc.target, ", law: aimd")},
	})
	for _, r := range rs {
		if strings.HasPrefix(r.variant, "adaptive track") {
			b.ReportMetric(float64(r.p99.Microseconds())/1000, "track-p99-ms")
		}
	}
}
