//go:build linux

package maps

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The bound on over-admission of a rule's bucket with per-CPU token caches
// (bpf/bucket.h): every token is charged to the shared bucket before a CPU
// spends it, and a CPU's cache holds at most one batch,
// max(1 packet, rate × XL_BATCH_NS), so over any interval of length T the
// CPUs together admit at most
//
//	rate·T + burst + nCPU · max(1, rate × 50 µs)
//
// and, while the rule is saturated, at least rate·T − nCPU · batch (what
// the caches may hold unspent at the end). These tests run the program on
// every CPU at once and count admissions from the counters.

// mcBatch is a CPU cache's largest batch, in packets, for a packet rule.
func mcBatch(b dataplane.Bucket) float64 {
	batch := min(uint64(dataplane.BatchNS)<<dataplane.TimeShift, b.Tol/4)
	return max(1, float64(batch)/float64(b.Inc(1)))
}

// mcCPUs lists the CPUs this process may run on.
func mcCPUs(tb testing.TB) []int {
	tb.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		tb.Fatalf("read CPU affinity: %v", err)
	}
	var cpus []int
	for i := 0; len(cpus) < set.Count(); i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

// mcRun is one BPF_PROG_TEST_RUN of a worker.
type mcRun struct {
	start, end time.Time
	n          int
	perPacket  time.Duration // the kernel's mean time per run
	ret        uint32
	err        error
}

// mcWorker runs the program on one CPU: a goroutine locked to an OS
// thread bound to that CPU. The thread exits with the goroutine, so no
// pinned thread returns to the runtime.
type mcWorker struct {
	cpu  int
	todo chan int // packets to run; closed to stop
	done chan mcRun
}

func startWorkers(tb testing.TB, o *Objects, frame []byte, cpus []int) []*mcWorker {
	tb.Helper()
	ws := make([]*mcWorker, len(cpus))
	for i, cpu := range cpus {
		w := &mcWorker{cpu: cpu, todo: make(chan int), done: make(chan mcRun)}
		ws[i] = w
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with us
			var set unix.CPUSet
			set.Set(w.cpu)
			pinErr := unix.SchedSetaffinity(0, &set)
			for n := range w.todo {
				r := mcRun{n: n, err: pinErr}
				r.start = time.Now()
				if r.err == nil {
					r.ret, r.perPacket, r.err = o.Program().Benchmark(frame, n, nil)
				}
				r.end = time.Now()
				w.done <- r
			}
		}()
	}
	tb.Cleanup(func() {
		for _, w := range ws {
			close(w.todo)
		}
	})
	return ws
}

// perCPUPasses reads a slot's passes on each CPU.
func perCPUPasses(tb testing.TB, tab *Tables, slot int) []uint64 {
	tb.Helper()
	var per []xdpXlCounters
	if err := tab.stats.Lookup(uint32(slot), &per); err != nil {
		tb.Fatal(err)
	}
	out := make([]uint64, len(per))
	for i := range per {
		out[i] = per[i].Packets[dataplane.VerdictPass]
	}
	return out
}

// overlap is the fraction of the longest run during which all runs were
// in progress (from user space: it includes the kernel's setup).
func overlap(runs []mcRun) float64 {
	s, e := runs[0].start, runs[0].end
	longest := time.Duration(0)
	for _, r := range runs {
		if r.start.After(s) {
			s = r.start
		}
		if r.end.Before(e) {
			e = r.end
		}
		longest = max(longest, r.end.Sub(r.start))
	}
	if e.Before(s) || longest == 0 {
		return 0
	}
	return float64(e.Sub(s)) / float64(longest)
}

// TestMultiCoreBound runs one rule on every CPU at once with the fake
// clock. A coordinator sets the clock for each step, every CPU runs a
// batch of packets at that instant (a barrier per step), then the clock
// advances. Each step refills 1e6 packets, and each CPU offers 1.2e6, so
// every CPU alone could take the whole refill: the CPUs compete for the
// bucket, and the rule is saturated at every step. The first step also
// offers the burst (1.25e6 packets, more than a step's refill, so no token
// is lost to a full bucket). A last pair of steps makes the caches carry
// credit across a step boundary (see below), which is where the cache
// term of the bound is spent.
//
// Checked over the whole run and every window of steps i..j: admitted ≤
// rate·(t_j − t_i) + burst + nCPU·batch (the stated bound). And for the
// windows after the first step, when the bucket was drained at the end of
// step i−1: |admitted − rate·(t_j − t_{i−1})| ≤ nCPU·batch + 1 (exact up to
// what the caches held). The whole run also admits at least
// rate·T + burst − nCPU·batch − 1: no CPU's cache starves the rule.
func TestMultiCoreBound(t *testing.T) {
	requireRoot(t)
	cpus := mcCPUs(t)
	if len(cpus) < 2 {
		t.Skipf("needs two CPUs, has %v", cpus)
	}
	const (
		refill  = 1e6 // packets a step
		perCPU  = 1.2e6
		burst   = 1.25e6
		steps   = 8
		startNS = 1000 * second
	)
	for _, rate := range []float64{1000, 1e5, 1e7} {
		t.Run(fmt.Sprintf("%g/s", rate), func(t *testing.T) {
			o, tab, plan, slot := loadMC(t, Options{FakeClock: true}, rate, burst)
			b := plan.Rules[slot].Fallback
			batch := mcBatch(b)
			step := uint64(math.Round(refill / rate * 1e9))
			ws := startWorkers(t, o, build(udpTo(srcA4, 53)), cpus)

			// phase runs ns[i] packets on worker i (none when 0), all at
			// once, and waits for them.
			phase := func(ns []int) []mcRun {
				var runs []mcRun
				for i, w := range ws {
					if ns[i] > 0 {
						w.todo <- ns[i]
					}
				}
				for i, w := range ws {
					if ns[i] > 0 {
						r := <-w.done
						if r.err != nil {
							t.Fatalf("CPU %d: %v", w.cpu, r.err)
						}
						runs = append(runs, r)
					}
				}
				return runs
			}
			each := func(n int) []int {
				ns := make([]int, len(ws))
				for i := range ns {
					ns[i] = n
				}
				return ns
			}
			// Steps 0..steps saturate every CPU. Then a step that leaves
			// the caches holding credit while the bucket is drained: each
			// CPU in turn runs one packet (borrowing a whole batch), then
			// the first CPU alone drains the bucket. The last step
			// saturates every CPU again and spends that credit on top of
			// its refill: the cache term of the bound at work.
			carry := steps + 1
			last := steps + 2
			admitted := make([]float64, last+1) // per step
			at := make([]uint64, last+1)
			// minShare: the smallest share of a step's admissions taken by
			// one CPU; bestBalance: the step where the CPUs shared most
			// evenly (its smallest share).
			var minShare, bestBalance, sumOverlap float64 = 1, 0, 0
			var before uint64
			var prevPer []uint64
			start := time.Now()
			for k := range last + 1 {
				at[k] = startNS + uint64(k)*step
				if err := tab.SetClock(at[k]); err != nil {
					t.Fatal(err)
				}
				switch k {
				case 0:
					sumOverlap += overlap(phase(each(int(perCPU + burst))))
				case carry:
					for i := range ws {
						ns := make([]int, len(ws))
						ns[i] = 1
						phase(ns)
					}
					ns := make([]int, len(ws))
					ns[0] = int(perCPU)
					phase(ns)
				default:
					sumOverlap += overlap(phase(each(int(perCPU))))
				}
				c, err := tab.Counters(slot)
				if err != nil {
					t.Fatal(err)
				}
				admitted[k] = float64(c.Packets[dataplane.VerdictPass] - before)
				before = c.Packets[dataplane.VerdictPass]
				per := perCPUPasses(t, tab, slot)
				if k > 0 && k != carry {
					stepMin := 1.0
					for _, cpu := range cpus {
						stepMin = min(stepMin, float64(per[cpu]-prevPer[cpu])/admitted[k])
					}
					minShare = min(minShare, stepMin)
					bestBalance = max(bestBalance, stepMin)
				}
				prevPer = per
			}
			sumOverlap /= float64(last)
			wall := time.Since(start)

			total := 0.0
			for _, a := range admitted {
				total += a
			}
			T := float64(at[last]-at[0]) / 1e9
			slack := float64(len(cpus)) * batch
			stated := rate*T + burst + slack
			// Largest excess over the stated bound's rate·T + burst, and
			// largest deviation from the exact steady-state count, over
			// every window.
			worstStated, worstSteady := math.Inf(-1), 0.0
			for i := 0; i <= last; i++ {
				sum := 0.0
				for j := i; j <= last; j++ {
					sum += admitted[j]
					win := float64(at[j]-at[i]) / 1e9
					excess := sum - rate*win - burst
					worstStated = max(worstStated, excess)
					if excess > slack {
						t.Errorf("steps %d..%d: admitted %.0f, bound rate·T + burst + nCPU·batch = %.0f", i, j, sum, rate*win+burst+slack)
					}
					if i == 0 {
						continue
					}
					exact := rate * float64(at[j]-at[i-1]) / 1e9
					dev := sum - exact
					if math.Abs(dev) > math.Abs(worstSteady) {
						worstSteady = dev
					}
					if math.Abs(dev) > slack+1 {
						t.Errorf("steps %d..%d after a drained bucket: admitted %.0f, want rate·T = %.0f within nCPU·batch + 1 = %.0f",
							i, j, sum, exact, slack+1)
					}
				}
			}
			t.Logf("%d CPUs, rate %g/s, burst %g, batch %g packets; %d steps of %v, %.3g packets offered per CPU per step",
				len(cpus), rate, burst, batch, steps, time.Duration(step), perCPU)
			t.Logf("whole run: admitted %.0f, rate·T + burst = %.0f (%+.0f), stated bound %.0f (+%.0f); worst window excess over rate·T + burst %+.0f, "+
				"worst steady-state deviation %+.0f (allowed ±%.0f); smallest CPU share of a step's admissions %.2f (%.2f in the most even step), "+
				"mean overlap of the runs %.2f; %v",
				total, rate*T+burst, total-rate*T-burst, stated, slack, worstStated, worstSteady, slack+1,
				minShare, bestBalance, sumOverlap, wall.Round(time.Millisecond))
			// Every CPU alone could take a step's whole refill: only CPUs
			// that ran at the same time share one.
			if bestBalance < 0.05 {
				t.Errorf("in no step did every CPU take 5%% of the admissions (best %.3f): the CPUs never competed for "+
					"the bucket, so the run says nothing about concurrency", bestBalance)
			}
			carried := admitted[last] - rate*float64(step)/1e9
			t.Logf("credit carried into the last step: %+.0f packets over its refill (the caches' term allows %.0f; "+
				"%d CPUs each holding a batch less one packet, less the CPU that drained the bucket: %.0f)",
				carried, slack, len(cpus), float64(len(cpus)-1)*(batch-1))
			if total > stated {
				t.Errorf("admitted %.0f over the whole run, bound %.0f", total, stated)
			}
			if low := rate*T + burst - slack - 1; total < low {
				t.Errorf("admitted %.0f over the whole run, want at least %.0f (saturated on every CPU)", total, low)
			}
		})
	}

	// The same on the real clock (bpf_ktime_get_ns), a high rate on every
	// CPU for 2 s. The bucket starts full at its first packet, which is
	// after t0 (CLOCK_MONOTONIC read before the runs start), and every
	// packet is before t1 (read after they all ended): at most
	// rate·(t1 − t0) + burst + nCPU·batch pass. At least rate·(L − F) +
	// burst − nCPU·batch − 1 pass, where F is no earlier than the first
	// packet (a first run's end less its packets' kernel time) and L no
	// later than the last (a last run's start plus its packets' time), as
	// long as no CPU ran short of offered load and no gap left the bucket
	// full (the burst lasts 250 ms; a gap between runs lasts tens of ms).
	t.Run("real clock", func(t *testing.T) {
		const rate, burst, perRun = 5e6, 1.25e6, 1_000_000
		const duration = 2 * time.Second
		o, tab, plan, slot := loadMC(t, Options{}, rate, burst)
		batch := mcBatch(plan.Rules[slot].Fallback)
		frame := build(udpTo(srcA4, 53))

		var ts unix.Timespec
		mono := func() float64 {
			if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
				t.Fatal(err)
			}
			return float64(ts.Nano()) / 1e9
		}
		runs := make([][]mcRun, len(cpus))
		var wg sync.WaitGroup
		t0 := mono()
		begin := time.Now()
		for i, cpu := range cpus {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread() // never unlocked: the thread ends with us
				var set unix.CPUSet
				set.Set(cpu)
				if err := unix.SchedSetaffinity(0, &set); err != nil {
					runs[i] = append(runs[i], mcRun{err: err})
					return
				}
				for time.Since(begin) < duration {
					r := mcRun{n: perRun, start: time.Now()}
					r.ret, r.perPacket, r.err = o.Program().Benchmark(frame, perRun, nil)
					r.end = time.Now()
					runs[i] = append(runs[i], r)
					if r.err != nil {
						return
					}
				}
			}()
		}
		wg.Wait()
		t1 := mono()
		end := time.Now()

		c, err := tab.Counters(slot)
		if err != nil {
			t.Fatal(err)
		}
		g, err := tab.Counters(dataplane.GlobalSlot)
		if err != nil {
			t.Fatal(err)
		}
		admitted := float64(c.Packets[dataplane.VerdictPass])
		offered := float64(g.Packets[dataplane.VerdictPass] + g.Packets[dataplane.VerdictDrop])
		// F and L on the monotonic clock, from the wall-clock offsets of
		// the runs (time.Time carries a monotonic reading).
		first, last := math.Inf(1), math.Inf(-1)
		var busy time.Duration
		for i := range runs {
			for _, r := range runs[i] {
				if r.err != nil {
					t.Fatalf("CPU %d: %v", cpus[i], r.err)
				}
				busy += time.Duration(r.n) * r.perPacket
			}
			f, l := runs[i][0], runs[i][len(runs[i])-1]
			first = min(first, t0+(f.end.Sub(begin)-time.Duration(f.n)*f.perPacket).Seconds())
			last = max(last, t0+(l.start.Sub(begin)+time.Duration(l.n)*l.perPacket).Seconds())
		}
		elapsed := t1 - t0
		slack := float64(len(cpus)) * batch
		upper := rate*elapsed + burst + slack
		lower := rate*(last-first) + burst - slack - 1
		t.Logf("%d CPUs for %.3f s (CLOCK_MONOTONIC; wall %v): offered %.0f (%.3g/s, %.0f%% of the CPUs' time in the program), "+
			"admitted %.0f = burst + %.0f/s; bound rate·T + burst + nCPU·batch = %.0f (margin %.0f), lower bound %.0f over [F, L] = %.3f s (margin %.0f)",
			len(cpus), elapsed, end.Sub(begin).Round(time.Millisecond), offered, offered/elapsed, 100*busy.Seconds()/(elapsed*float64(len(cpus))),
			admitted, (admitted-burst)/elapsed, upper, upper-admitted, lower, last-first, admitted-lower)
		if admitted > upper {
			t.Errorf("admitted %.0f in %.3f s of real time, bound %.0f", admitted, elapsed, upper)
		}
		if offered < 2*rate*elapsed {
			t.Logf("the CPUs offered only %.3g/s, under twice the rate: the lower bound is not checked", offered/elapsed)
		} else if admitted < lower {
			t.Errorf("admitted %.0f in %.3f s of real time, want at least %.0f", admitted, elapsed, lower)
		}
	})
}

// loadMC loads the program (closed when the test ends) with one UDP rule
// "mc" on port 53 at rate and burst, and returns its objects, tables, plan
// and the rule's slot.
func loadMC(t *testing.T, opts Options, rate, burst float64) (*Objects, *Tables, *dataplane.Plan, int) {
	t.Helper()
	o, err := Load(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	tab := o.Tables()
	plan := compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "mc", Protocol: "udp", Ports: ports(53, 53), Rate: rate, Burst: burst},
	}}, nil)
	if err := tab.Apply(plan); err != nil {
		t.Fatal(err)
	}
	return o, tab, plan, plan.Slot("mc")
}
