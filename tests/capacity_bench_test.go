//go:build linux

package tests

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
)

// The benchmarks of issue 14: the adaptive law against the unprotected
// service (and static buckets for the seed scenario), in the same run, on
// a TCP service of workers × service time behind a listen backlog, offered
// open-loop connections (one request/response each, 1 s timeout: a refused
// SYN is retried by the client's kernel after 1 s, so it is a timeout).
// Each prints its tables; `make bench` copies them into the results file.
// Goodput is what the clients got: answers within their timeout, counted
// when they completed; the service's own count of completions (answers to
// clients that gave up included) is beside it.

// capScenario is one benchmark's service and load.
type capScenario struct {
	name             string
	workers, backlog int
	service          time.Duration
	phases           []phase
	// slowAfter, when not 0, changes the service time to slowService at
	// that offset from the start (the capacity step).
	slowAfter   time.Duration
	slowService time.Duration
	// internal: the service queues inside itself (one accept loop handing
	// every connection to a pool of workers, as Go's net/http, nginx and
	// Node do), and the clients send a request line first.
	internal bool
	// overload is the phase whose goodput and latency are the targets'.
	overload int
	target   time.Duration
	timeout  time.Duration
}

// capVariant is one protection of the service: rules "" is none.
type capVariant struct {
	name, rules string
}

// secStat is one second of a run: the served requests that started in it.
type secStat struct {
	offered, ok int
	p50, p99    time.Duration
}

// capResult is one variant's run.
type capResult struct {
	variant           string
	reqs              []request
	start             time.Time
	phaseStart        []time.Duration
	offeredPerPhase   []float64 // attempts per second really started
	served            int       // completed by the service (its counter)
	servedOverload    float64   // goodput: answers the clients got within their timeout, per second, completed during the overload phase
	completedOverload float64   // what the service completed per second during it (its counter: answers to clients gone included)
	overflows         uint64
	failed            int
	p50, p99          time.Duration
	worstP99          time.Duration // of the seconds of the run
	worstP99Overload  time.Duration
	seconds           []secStat
	recovery          time.Duration // after the overload phase; −1: never
	refusedAfter      int           // failed requests started later than 100 ms after the overload phase
	rates             []ratePoint   // the rate in force, polled
}

type ratePoint struct {
	at   time.Duration
	rate float64
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// runCapScenario runs sc against one variant in a fresh lab.
func runCapScenario(b *testing.B, sc capScenario, v capVariant) capResult {
	e := newEnv(b)
	addr := netip.AddrPortFrom(e.lab.ServerIP4, tcpPort)
	var svc *slowService
	if sc.internal {
		svc = startInternalQueueService(e.t, e.lab.Server, addr, sc.backlog, sc.workers, sc.service)
	} else {
		svc = startSlowService(e.t, e.lab.Server, addr, sc.backlog, sc.workers, sc.service)
	}
	res := capResult{variant: v.name, recovery: -1}
	var d *daemon
	if v.rules != "" {
		d = e.startDaemon(e.writeRules("rules.yaml", v.rules))
		if dir := os.Getenv("XLIMIT_BENCH_LOGS"); dir != "" {
			// The daemon's log (a line per rule and tick at debug level),
			// for a look at what the law did.
			b.Cleanup(func() {
				name := strings.NewReplacer(" ", "_", ",", "", "/", "_").Replace(sc.name + "-" + v.name)
				_ = os.WriteFile(dir+"/"+name+".log", []byte(d.Log()), 0o644)
			})
		}
	}
	var total time.Duration
	for _, p := range sc.phases {
		res.phaseStart = append(res.phaseStart, total)
		total += p.dur
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	res.start = time.Now()
	// The service's own count at the edges of the overload phase.
	ovStart, ovEnd := res.phaseStart[sc.overload], res.phaseStart[sc.overload]+sc.phases[sc.overload].dur
	var servedAt [2]int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, at := range []time.Duration{ovStart, ovEnd} {
			select {
			case <-time.After(time.Until(res.start.Add(at))):
				servedAt[i] = svc.served.Load()
			case <-ctx.Done():
				return
			}
		}
	}()
	if sc.slowAfter > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(time.Until(res.start.Add(sc.slowAfter))):
				svc.SetService(sc.slowService)
			case <-ctx.Done():
			}
		}()
	}
	o0 := svc.overflow()
	s0 := svc.served.Load()
	var req []byte
	if sc.internal {
		req = []byte("req\n")
	}
	res.reqs = offerPhasesWith(e.lab.Client, addr, sc.phases, sc.timeout, req)
	cancel()
	wg.Wait()
	res.served = int(svc.served.Load() - s0)
	if d != nil {
		// The rate in force at every tick, from the daemon's debug log
		// (polling `xlimit status` would load the host the service runs on).
		res.rates = tickRates(d.Log(), "svc", res.start)
	}
	res.overflows = svc.overflow() - o0
	res.completedOverload = float64(servedAt[1]-servedAt[0]) / sc.phases[sc.overload].dur.Seconds()

	// Per phase: the offered rate really started.
	counts := make([]int, len(sc.phases))
	var lat []time.Duration
	nsec := int(total/time.Second) + 1
	bySec := make([][]time.Duration, nsec)
	offSec := make([]int, nsec)
	for _, r := range res.reqs {
		off := r.start.Sub(res.start)
		for i := len(sc.phases) - 1; i >= 0; i-- {
			if off >= res.phaseStart[i] {
				counts[i]++
				break
			}
		}
		s := min(int(off/time.Second), nsec-1)
		offSec[s]++
		if !r.ok {
			res.failed++
			if off > ovEnd+100*time.Millisecond {
				res.refusedAfter++
			}
			continue
		}
		lat = append(lat, r.latency)
		bySec[s] = append(bySec[s], r.latency)
		if done := off + r.latency; done >= ovStart && done < ovEnd {
			res.servedOverload++
		}
	}
	res.servedOverload /= sc.phases[sc.overload].dur.Seconds()
	for i, p := range sc.phases {
		res.offeredPerPhase = append(res.offeredPerPhase, float64(counts[i])/p.dur.Seconds())
	}
	res.p50, res.p99 = percentile(lat, 0.5), percentile(lat, 0.99)
	for s := range nsec {
		st := secStat{offered: offSec[s], ok: len(bySec[s]), p50: percentile(bySec[s], 0.5), p99: percentile(bySec[s], 0.99)}
		res.seconds = append(res.seconds, st)
		if st.ok >= 20 {
			res.worstP99 = max(res.worstP99, st.p99)
			if at := time.Duration(s) * time.Second; at >= ovStart && at < ovEnd {
				res.worstP99Overload = max(res.worstP99Overload, st.p99)
			}
		}
	}
	// Recovery: from the end of the overload phase to the start of the
	// first whole second whose P99 is back under target + service time
	// + 5 ms (250 ms steps).
	end := res.start.Add(ovEnd)
	last := sc.service
	if sc.slowAfter > 0 {
		last = sc.slowService
	}
	for s := time.Duration(0); s+time.Second <= total-ovEnd; s += 250 * time.Millisecond {
		var win []time.Duration
		for _, r := range res.reqs {
			if r.ok && !r.start.Before(end.Add(s)) && r.start.Before(end.Add(s+time.Second)) {
				win = append(win, r.latency)
			}
		}
		if len(win) > 0 && percentile(win, 0.99) <= sc.target+last+5*time.Millisecond {
			res.recovery = s
			break
		}
	}
	return res
}

// tickRates parses the daemon's "control tick" debug lines of rule into the
// rate in force per tick, timed from start.
func tickRates(log, rule string, start time.Time) []ratePoint {
	var out []ratePoint
	for line := range strings.Lines(log) {
		if !strings.Contains(line, "msg=\"control tick\"") || !strings.Contains(line, " rule="+rule+" ") {
			continue
		}
		var at time.Time
		rate := -1.0
		for _, f := range strings.Fields(line) {
			switch {
			case strings.HasPrefix(f, "time="):
				at, _ = time.Parse(time.RFC3339Nano, strings.TrimPrefix(f, "time="))
			case strings.HasPrefix(f, "rate="):
				fmt.Sscanf(strings.TrimPrefix(f, "rate="), "%g", &rate)
			}
		}
		if rate >= 0 && !at.Before(start) {
			out = append(out, ratePoint{at.Sub(start), rate})
		}
	}
	return out
}

// loadAvg is the host's load, printed next to every table (the machine
// is shared).
func loadAvg() string {
	out, err := exec.Command("uptime").Output()
	if err != nil {
		return "uptime: " + err.Error()
	}
	return strings.TrimSpace(string(out))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// printCapTable prints the results of one scenario, the first variant
// being the reference (unprotected) of the ratios.
func printCapTable(sc capScenario, rs []capResult) {
	ref := rs[0]
	fmt.Printf("\n%s — %d workers × %v (capacity %.0f/s), backlog %d, target %v, client timeout %v; load: %s\n\n",
		sc.name, sc.workers, sc.service, float64(sc.workers)/sc.service.Seconds(), sc.backlog, sc.target, sc.timeout, loadAvg())
	var ph []string
	for i, p := range sc.phases {
		ph = append(ph, fmt.Sprintf("%s %.0f/s for %v", p.name, p.rate, p.dur))
		_ = i
	}
	fmt.Printf("Phases: %s", strings.Join(ph, ", "))
	if sc.slowAfter > 0 {
		fmt.Printf("; service time %v from %v", sc.slowService, sc.slowAfter)
	}
	fmt.Printf(". Overload phase: %s.\n\n", sc.phases[sc.overload].name)
	fmt.Println("| variant | offered per phase (really started) | goodput in overload | vs first | service completed in overload | P50 | P99 | worst 1-s P99 in overload | worst 1-s P99 | served / offered | listen overflows | vs first | timeouts | refused > 100 ms after | recovery |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		var off []string
		for _, o := range r.offeredPerPhase {
			off = append(off, fmt.Sprintf("%.0f", o))
		}
		rec := "never"
		if r.recovery >= 0 {
			rec = r.recovery.String()
		}
		ovr := "—"
		if ref.overflows > 0 {
			ovr = fmt.Sprintf("%.1f %%", 100*float64(r.overflows)/float64(ref.overflows))
		}
		good := "—"
		if ref.servedOverload > 0 {
			good = fmt.Sprintf("%.1f %%", 100*r.servedOverload/ref.servedOverload)
		}
		fmt.Printf("| %s | %s | %.0f/s | %s | %.0f/s | %s | %s | %s | %s | %.1f %% (%d / %d) | %d | %s | %d | %d | %s |\n",
			r.variant, strings.Join(off, " / "), r.servedOverload, good, r.completedOverload, ms(r.p50), ms(r.p99), ms(r.worstP99Overload), ms(r.worstP99),
			100*float64(len(r.reqs)-r.failed)/float64(max(len(r.reqs), 1)), len(r.reqs)-r.failed, len(r.reqs),
			r.overflows, ovr, r.failed, r.refusedAfter, rec)
	}
	fmt.Println()
	for _, r := range rs {
		var ps []string
		for _, s := range r.seconds {
			ps = append(ps, fmt.Sprintf("%d:%s", s.ok, strings.TrimSuffix(ms(s.p99), " ms")))
		}
		fmt.Printf("- %s, per second served:P99 ms: %s\n", r.variant, strings.Join(ps, " "))
		if len(r.rates) > 0 {
			var rr []string
			for i, p := range r.rates {
				if i%5 == 0 {
					rr = append(rr, fmt.Sprintf("%.0f", p.rate))
				}
			}
			fmt.Printf("  rate in force, every 5th tick: %s\n", strings.Join(rr, " "))
		}
	}
	fmt.Println()
}

func requireBenchRoot(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: namespaces, XDP")
	}
}

// adaptiveRule is the rules file of an adaptive syn_only rule on the
// service's port.
func adaptiveRule(rate, minRate, maxRate float64, target time.Duration, extra string) string {
	return fmt.Sprintf(`rules:
  - name: svc
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: %g
    burst: %g
    behavior: adaptive
    adaptive: {target_latency: %v, min_rate: %g, max_rate: %g, signal: accept_queue%s}
`, tcpPort, rate, max(rate/20, 1), target, minRate, maxRate, extra)
}

func staticRule(rate float64) string {
	return fmt.Sprintf(`rules:
  - name: svc
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: %g
    burst: %g
`, tcpPort, rate, max(rate/20, 1))
}

func runCapBench(b *testing.B, sc capScenario, variants []capVariant) []capResult {
	requireBenchRoot(b)
	var rs []capResult
	for range b.N {
		rs = rs[:0]
		for _, v := range variants {
			rs = append(rs, runCapScenario(b, sc, v))
		}
		printCapTable(sc, rs)
	}
	return rs
}

// BenchmarkAdaptiveScenarioSpike: the spike. 10 workers × 10 ms
// (1000/s), backlog 64; 500/s for 5 s, 2000/s for 10 s, 500/s for 5 s.
func BenchmarkAdaptiveScenarioSpike(b *testing.B) {
	sc := capScenario{name: "Spike", workers: 10, backlog: 64, service: 10 * time.Millisecond,
		phases:   []phase{{"before", 500, 5 * time.Second}, {"spike", 2000, 10 * time.Second}, {"after", 500, 5 * time.Second}},
		overload: 1, target: 25 * time.Millisecond, timeout: time.Second}
	rs := runCapBench(b, sc, []capVariant{
		{"unprotected", ""},
		{"adaptive track, accept_queue", adaptiveRule(1000, 100, 5000, sc.target, "")},
	})
	if len(rs) == 2 && rs[0].servedOverload > 0 {
		b.ReportMetric(rs[1].servedOverload/rs[0].servedOverload, "goodput-ratio")
		b.ReportMetric(float64(rs[1].worstP99Overload.Microseconds())/1000, "worst-p99-ms")
	}
}

// BenchmarkAdaptiveScenarioCapacityStep: offered 1500/s to the same
// service while its service time goes from 10 to 25 ms (1000/s → 400/s)
// after 5 s.
func BenchmarkAdaptiveScenarioCapacityStep(b *testing.B) {
	sc := capScenario{name: "Capacity step", workers: 10, backlog: 64, service: 10 * time.Millisecond,
		phases:    []phase{{"fast", 1500, 5 * time.Second}, {"slow", 1500, 10 * time.Second}},
		slowAfter: 5 * time.Second, slowService: 25 * time.Millisecond,
		overload: 1, target: 25 * time.Millisecond, timeout: time.Second}
	rs := runCapBench(b, sc, []capVariant{
		{"unprotected", ""},
		{"adaptive track, accept_queue", adaptiveRule(1000, 100, 5000, sc.target, "")},
	})
	if len(rs) == 2 && rs[0].servedOverload > 0 {
		b.ReportMetric(rs[1].servedOverload/rs[0].servedOverload, "goodput-ratio")
		b.ReportMetric(float64(rs[1].worstP99Overload.Microseconds())/1000, "worst-p99-ms")
	}
}

// BenchmarkAdaptiveScenarioSteadyOverload: 3× the capacity for 20 s; the
// rate in force at every tick from the 5th second on.
func BenchmarkAdaptiveScenarioSteadyOverload(b *testing.B) {
	sc := capScenario{name: "Steady overload", workers: 10, backlog: 64, service: 10 * time.Millisecond,
		phases:   []phase{{"overload", 3000, 20 * time.Second}},
		overload: 0, target: 25 * time.Millisecond, timeout: time.Second}
	rs := runCapBench(b, sc, []capVariant{
		{"unprotected", ""},
		{"adaptive track, accept_queue", adaptiveRule(1000, 100, 5000, sc.target, "")},
		{"adaptive aimd, accept_queue (design §5.4 gains)", adaptiveRule(1000, 100, 5000, sc.target, ", law: aimd")},
	})
	for _, r := range rs[1:] {
		var in []float64
		for _, p := range r.rates {
			if p.at >= 5*time.Second {
				in = append(in, p.rate)
			}
		}
		if len(in) == 0 {
			continue
		}
		lo, hi := slices.Min(in), slices.Max(in)
		var mean float64
		for _, x := range in {
			mean += x / float64(len(in))
		}
		// Averaged over whole seconds (what the service sees).
		var secs []float64
		for s := 5; s < 20; s++ {
			var sum float64
			n := 0
			for _, p := range r.rates {
				if p.at >= time.Duration(s)*time.Second && p.at < time.Duration(s+1)*time.Second {
					sum += p.rate
					n++
				}
			}
			if n > 0 {
				secs = append(secs, sum/float64(n))
			}
		}
		c := r.completedOverload
		fmt.Printf("%s: rate in force from 5 s on, per tick %.0f–%.0f/s (mean %.0f/s): ±%.1f %% of the %.0f/s the service completed",
			r.variant, lo, hi, mean, 100*(hi-lo)/2/c, c)
		if len(secs) > 0 {
			fmt.Printf("; per-second means %.0f–%.0f/s: ±%.1f %%", slices.Min(secs), slices.Max(secs), 100*(slices.Max(secs)-slices.Min(secs))/2/c)
		}
		fmt.Println()
	}
	fmt.Println()
}

// startInternalQueueService is a service that queues inside itself: one
// goroutine accepts every connection at once and hands it to workers
// through an unbounded queue; each worker reads the request line, takes
// the service time, answers and closes. Its accept queue stays empty.
func startInternalQueueService(t testing.TB, ns *lab.NS, addr netip.AddrPort, backlog, workers int, service time.Duration) *slowService {
	t.Helper()
	s := startSlowService(t, ns, addr, backlog, 0, service)
	var mu sync.Mutex
	var queue []net.Conn
	cond := sync.NewCond(&mu)
	closed := false
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.ln.Accept()
			if err != nil {
				mu.Lock()
				closed = true
				cond.Broadcast()
				mu.Unlock()
				return
			}
			mu.Lock()
			queue = append(queue, c)
			cond.Signal()
			mu.Unlock()
		}
	}()
	for range workers {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			buf := make([]byte, 64)
			for {
				mu.Lock()
				for len(queue) == 0 && !closed {
					cond.Wait()
				}
				if len(queue) == 0 {
					mu.Unlock()
					return
				}
				c := queue[0]
				queue = queue[1:]
				mu.Unlock()
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := c.Read(buf); err == nil {
					time.Sleep(time.Duration(s.service.Load()))
					_, _ = c.Write([]byte("ok\n"))
					s.served.Add(1)
				}
				c.Close()
			}
		}()
	}
	t.Cleanup(func() {
		mu.Lock()
		for _, c := range queue {
			c.Close()
		}
		queue = nil
		mu.Unlock()
	})
	return s
}

// daemonAccepts reports whether the daemon binary takes the rules file
// (xlimit check), and its complaint when it does not.
func daemonAccepts(b *testing.B, rules string) (bool, string) {
	f, err := os.CreateTemp(b.TempDir(), "rules-*.yaml")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := f.WriteString(rules); err != nil {
		b.Fatal(err)
	}
	f.Close()
	out, err := exec.Command(xlimitBin, "check", f.Name()).CombinedOutput()
	return err == nil, strings.TrimSpace(string(out))
}

// BenchmarkAdaptiveScenarioInternalQueue: the spike against a service that
// queues inside itself (an accept loop feeding 10 workers × 10 ms): its
// accept queue stays empty, so accept_queue sees nothing; the response time
// measured on the wire (signal response_time, the kernel half of issue 14)
// is what can steer it. A variant the daemon under test does not accept
// is reported as pending, not run.
func BenchmarkAdaptiveScenarioInternalQueue(b *testing.B) {
	requireBenchRoot(b)
	sc := capScenario{name: "Spike, service queueing inside itself", workers: 10, backlog: 64, service: 10 * time.Millisecond,
		internal: true,
		phases:   []phase{{"before", 500, 5 * time.Second}, {"spike", 2000, 10 * time.Second}, {"after", 500, 5 * time.Second}},
		overload: 1, target: 25 * time.Millisecond, timeout: time.Second}
	var variants []capVariant
	for _, v := range []capVariant{
		{"unprotected", ""},
		{"adaptive track, accept_queue", adaptiveRule(1000, 100, 5000, sc.target, "")},
		{"adaptive track, response_time", strings.Replace(adaptiveRule(1000, 100, 5000, sc.target, ""), "signal: accept_queue", "signal: response_time", 1)},
	} {
		if v.rules != "" {
			if ok, why := daemonAccepts(b, v.rules); !ok {
				fmt.Printf("\n%s: %s — pending, not run: the daemon under test refuses it: %s\n", sc.name, v.name, why)
				continue
			}
		}
		variants = append(variants, v)
	}
	runCapBench(b, sc, variants)
}
