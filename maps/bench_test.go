//go:build linux

package maps

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/bench/gen"
	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// benchSourceTable is the per-source table of the benchmarks: small, so
// that per_source_miss, which cycles through benchMissSources sources,
// evicts on every packet.
const (
	benchSourceTable = 4096
	benchMissSources = 65536
	// benchSingleRuns caps the runs of the one-run-per-syscall loops
	// (per_source_miss and its references): each costs a syscall.
	benchSingleRuns = 500_000
	// benchOverSources is how many sources per_source_over cycles
	// through: all of them fit the table, and every one is over its
	// limit.
	benchOverSources = 2048
)

// BenchmarkXDP measures the per-packet cost of the XDP program with
// BPF_PROG_TEST_RUN (the real clock, as in production) and reports each
// case as ns/op and as a ratio to a bare XDP_DROP program measured in the
// same sub-benchmark the same way (x-bare). `make bench` runs
//
//	go test -run '^$' -bench . -benchtime 2000000x ./maps/
//
// One CPU (a run of b.N repeats): no_rule, rule_pass, rule_drop (a
// drained bucket whose burst lets its CPU drop without reading the clock
// after a read that found it empty), rule_drop_burst1 (burst 1: every drop
// reads the clock), rule_pass_limit (a rule with the control loop's limit
// in force, whose deadline is checked), allowlisted, ipv6_ext,
// per_source_hit (one source, its bucket found in the table every time).
//
// All CPUs at once (*_allcpu: one thread pinned to each CPU, each running
// b.N repeats at the same time, against one rule), in
// benchRounds rounds that alternate with the same frame on each of those
// CPUs alone (benchInterleaved): ns/op is the kernel's mean time per
// packet on each CPU, 1cpu-ns/op the one-CPU figure (both medians over the
// rounds), x-1cpu the median of the rounds' ratios (issue 18's target: at
// most 1.1) and x-1cpu-min / x-1cpu-max their extremes. busy-cpus is the
// time the CPUs spent in the program, summed, over the wall time: near the
// number of CPUs when they really ran at once (the kernel's ~20 ms of
// setup per run lowers it), at most 1 when they took turns.
// bare-allcpu-ns/op is the bare program on all CPUs at once (what the
// machine itself loses to running them all).
//
// ipv6_ext: hop-by-hop, destination options, routing and a fragment
// header (a first fragment, which frag.h records as an IPv4 first
// fragment is: ipv4_first_frag); ipv6_ext_nofrag the same without the
// fragment header and ipv6_plain no extension header (against
// rule_pass), both from a source in no list; ipv6_ext and
// ipv6_plain_listed32 from srcA6, whose /32 holds an allowlisted prefix,
// so that the IPv6 prefilter sends it to the trie.
//
// per_source_miss: every packet from another source (65536 of them, a
// 4096-entry table), so every packet's source is not in the table and
// takes a way (bpf/source.h, xl_src_locate). per_source_over: every
// packet from another of 2048 sources, each over its limit: the live
// random-source flood's case, found in the table and refused.
// BPF_PROG_TEST_RUN repeats one frame, so this runs one packet per syscall
// (at most benchSingleRuns) and sums the kernel's time for each;
// per_source_hit_single and bare_single are measured the same way, as its
// references (x-bare against bare_single; a single run includes the
// kernel's timer overhead, so compare single with single).
//
// The issues' targets are reported by make bench (bench/conclude.go),
// never asserted here.
func BenchmarkXDP(b *testing.B) {
	requireRoot(b)
	o, err := Load(Options{SourceTableSize: benchSourceTable})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	plan, err := dataplane.Compile(&dataplane.Spec{
		Allow: []netip.Prefix{pfx("10.0.0.0/8"), pfx("2001:db8:a::/48")},
		Deny:  []netip.Prefix{pfx("10.66.0.0/16")},
		Rules: []dataplane.RuleSpec{
			{Name: "pass", Protocol: "udp", Ports: ports(53, 53), Rate: 1e9, Burst: 1e9},
			// One packet per 1000 s, burst 2: drained by the first run
			// below. Its burst leaves more than 20 ms beyond a packet, so
			// its CPU drops without a clock read after a read that found
			// the bucket empty (bucket.h, xl_cache_empty), as a rule with
			// the default burst (a second's worth) does.
			{Name: "drop", Protocol: "udp", Ports: ports(54, 54), Rate: 0.001, Burst: 2},
			// Burst 1: no room beyond a packet, so every drop reads the
			// clock (rule_drop_burst1).
			{Name: "drop1", Protocol: "udp", Ports: ports(56, 56), Rate: 0.001, Burst: 1},
			// With a control-loop limit in force (rule_pass_limit): its
			// deadline is checked on each packet.
			{Name: "adaptive", Protocol: "udp", Ports: ports(57, 57), Rate: 1e9, Burst: 1e9},
			{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1e9, Burst: 1e9},
			// Per-source buckets that never run dry at these rates.
			{Name: "src", Protocol: "udp", Ports: ports(55, 55), Rate: 1e9, Burst: 1e9,
				PerSource: &dataplane.PerSourceSpec{Rate: 1e8, Burst: 1e8, PrefixV4: 32, PrefixV6: 128}},
			// Per-source buckets that every source overruns
			// (per_source_over): one packet per 100 s, burst 2.
			{Name: "srcover", Protocol: "udp", Ports: ports(58, 58), Rate: 1e9, Burst: 1e9,
				PerSource: &dataplane.PerSourceSpec{Rate: 0.01, Burst: 2, PrefixV4: 32, PrefixV6: 128}},
		},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := o.Tables().Apply(plan); err != nil {
		b.Fatal(err)
	}
	// The control loop's limit for "adaptive", its deadline an hour ahead
	// on CLOCK_MONOTONIC (bpf_ktime_get_ns's clock).
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		b.Fatal(err)
	}
	lb, err := dataplane.NewBucket(1e9, 1e9, false)
	if err != nil {
		b.Fatal(err)
	}
	as := plan.Slot("adaptive")
	if err := o.Tables().SetLimit(as, dataplane.Limit{Bucket: lb, DeadlineNS: uint64(ts.Nano()) + 3600e9,
		Epoch: plan.Rules[as].Epoch}); err != nil {
		b.Fatal(err)
	}
	bare, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		b.Fatal(err)
	}
	defer bare.Close()
	cpus := mcCPUs(b)

	v6ext := udpTo(srcA6, 53)
	v6ext.IPv6Ext = []uint8{frame.ExtHopByHop, frame.ExtDstOpts, frame.ExtRouting, frame.ExtFragment}
	v6ext.MoreFragments = true
	// In no list of the plan, as srcA4 is (srcA6's /32 is the allowlisted
	// 2001:db8:a::/48's, which the IPv6 prefilter cannot tell apart: it
	// takes the trie lookup).
	srcU6 := netip.MustParseAddr("3fff::10")
	v6noFrag := udpTo(srcU6, 53)
	v6noFrag.IPv6Ext = []uint8{frame.ExtHopByHop, frame.ExtDstOpts, frame.ExtRouting}
	v4frag := udpTo(srcA4, 53)
	v4frag.MoreFragments = true
	passFrame, dropFrame, srcFrame := build(udpTo(srcA4, 53)), build(udpTo(srcA4, 54)), build(udpTo(srcA4, 55))
	for _, c := range []struct {
		name  string
		frame []byte
		ret   uint32
	}{
		{"no_rule", build(udpTo(srcA4, 9)), xdpPass},
		{"rule_pass", passFrame, xdpPass},
		{"rule_drop", dropFrame, xdpDrop},
		{"rule_drop_burst1", build(udpTo(srcA4, 56)), xdpDrop},
		{"rule_pass_limit", build(udpTo(srcA4, 57)), xdpPass},
		{"allowlisted", build(udpTo(netip.MustParseAddr("10.1.2.3"), 54)), xdpPass},
		{"ipv6_ext", build(v6ext), xdpPass},
		{"ipv6_ext_nofrag", build(v6noFrag), xdpPass},
		{"ipv6_plain", build(udpTo(srcU6, 53)), xdpPass},
		{"ipv6_plain_listed32", build(udpTo(srcA6, 53)), xdpPass},
		{"ipv4_first_frag", build(v4frag), xdpPass},
		{"per_source_hit", srcFrame, xdpPass},
	} {
		if _, _, err := o.Program().Benchmark(c.frame, 2, nil); err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			_, bareRun, err := bare.Benchmark(c.frame, b.N, nil)
			if err != nil {
				b.Fatal(err)
			}
			ret, run, err := o.Program().Benchmark(c.frame, b.N, b.ResetTimer)
			if err != nil {
				b.Fatal(err)
			}
			if ret != c.ret {
				b.Fatalf("returned %d, want %d", ret, c.ret)
			}
			b.ReportMetric(float64(run.Nanoseconds()), "ns/op")
			if bareRun > 0 {
				b.ReportMetric(float64(run)/float64(bareRun), "x-bare")
			}
			b.ReportMetric(float64(bareRun.Nanoseconds()), "bare-ns/op")
		})
	}

	// Every CPU hitting one rule at once.
	for _, c := range []struct {
		name  string
		frame []byte
		ret   uint32
		slot  string // the rule, for the CAS-loss count of passing cases
	}{
		{"rule_pass_allcpu", passFrame, xdpPass, "pass"},
		{"rule_drop_allcpu", dropFrame, xdpDrop, ""},
		{"per_source_hit_allcpu", srcFrame, xdpPass, "src"},
	} {
		b.Run(c.name, func(b *testing.B) {
			if len(cpus) < 2 {
				b.Skipf("needs two CPUs, has %v", cpus)
			}
			bareOne := benchEachCPU(b, bare, c.frame, b.N, cpus, xdpDrop)
			bareAll := benchOnCPUs(b, bare, c.frame, b.N, cpus, xdpDrop)
			var before dataplane.Counters
			if c.slot != "" {
				before = benchCounters(b, o, plan.Slot(c.slot))
			}
			b.ResetTimer()
			r := benchInterleaved(b, o.Program(), c.frame, b.N, cpus, c.ret)
			b.StopTimer()
			if c.slot != "" {
				// The buckets cannot run dry here: a drop is a packet that
				// lost the compare-and-swap race 8 times.
				d := benchCounters(b, o, plan.Slot(c.slot)).Sub(before)
				n := d.Packets[dataplane.VerdictPass] + d.Packets[dataplane.VerdictDrop]
				b.ReportMetric(float64(d.Packets[dataplane.VerdictDrop])/float64(n), "cas-drops/op")
			}
			b.ReportMetric(r.all, "ns/op")
			b.ReportMetric(r.busyCPUs, "busy-cpus")
			b.ReportMetric(r.one, "1cpu-ns/op")
			b.ReportMetric(r.ratio, "x-1cpu")
			b.ReportMetric(r.ratioMin, "x-1cpu-min")
			b.ReportMetric(r.ratioMax, "x-1cpu-max")
			b.ReportMetric(r.all/bareOne, "x-bare")
			b.ReportMetric(bareOne, "bare-ns/op")
			b.ReportMetric(bareAll.perPacket, "bare-allcpu-ns/op")
		})
	}

	// One packet per syscall: per_source_miss and its references.
	missFrames := make([][]byte, benchMissSources)
	rng := rand.New(rand.NewPCG(3, 4))
	seen := map[netip.Addr]bool{}
	for i := range missFrames {
		var a netip.Addr
		for a = srcA4; seen[a] || a == srcA4; {
			// 100.64.0.0/10: in no list of the plan.
			v := rng.Uint32()
			a = netip.AddrFrom4([4]byte{100, 64 | byte(v>>16)&0x3f, byte(v >> 8), byte(v)})
		}
		seen[a] = true
		missFrames[i] = build(udpTo(a, 55))
	}
	overFrames := make([][]byte, benchOverSources)
	for i := range overFrames {
		overFrames[i] = build(udpTo(netip.AddrFrom4([4]byte{100, 100, byte(i >> 8), byte(i)}), 58))
	}
	// Into the table and over their limit, right before the case: the
	// misses above would have taken their ways.
	overPrep := func(b *testing.B) {
		for _, f := range overFrames {
			for range 3 {
				if _, _, err := o.Program().Benchmark(f, 1, nil); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	for _, c := range []struct {
		name   string
		prog   *ebpf.Program
		frames [][]byte
		ret    uint32
		prep   func(*testing.B)
	}{
		{"bare_single", bare, [][]byte{srcFrame}, xdpDrop, nil},
		{"per_source_hit_single", o.Program(), [][]byte{srcFrame}, xdpPass, nil},
		{"per_source_miss", o.Program(), missFrames, xdpPass, nil},
		{"per_source_over", o.Program(), overFrames, xdpDrop, overPrep},
	} {
		b.Run(c.name, func(b *testing.B) {
			if c.prep != nil {
				c.prep(b)
			}
			n := min(b.N, benchSingleRuns)
			bareRun := benchSingle(b, bare, c.frames, n, xdpDrop)
			b.ResetTimer()
			run := benchSingle(b, c.prog, c.frames, n, c.ret)
			b.StopTimer()
			b.ReportMetric(run, "ns/op")
			b.ReportMetric(run/bareRun, "x-bare")
			b.ReportMetric(run-bareRun, "over-bare-ns/op")
			b.ReportMetric(bareRun, "bare-ns/op")
		})
	}

	b.Run("bare", func(b *testing.B) {
		_, run, err := bare.Benchmark(passFrame, b.N, b.ResetTimer)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(run.Nanoseconds()), "ns/op")
	})
}

// benchAll is a concurrent run on several CPUs.
type benchAll struct {
	perPacket float64 // the kernel's mean time per packet, averaged over the CPUs
	wall      time.Duration
	// busyCPUs is the kernel's time in the program summed over the CPUs,
	// divided by the wall time: near the number of CPUs when they ran at
	// once, at most 1 when they took turns.
	busyCPUs float64
}

// benchOnCPUs runs prog n times on each of cpus at the same time, each on
// an OS thread pinned to its CPU (the threads exit afterwards, so no
// pinned thread returns to the runtime), and checks the return code.
func benchOnCPUs(tb testing.TB, prog *ebpf.Program, frame []byte, n int, cpus []int, want uint32) benchAll {
	tb.Helper()
	runs := make([]time.Duration, len(cpus))
	rets := make([]uint32, len(cpus))
	errs := make([]error, len(cpus))
	// Every thread is pinned before any starts: then they start together.
	var pinned, wg sync.WaitGroup
	pinned.Add(len(cpus))
	wg.Add(len(cpus))
	var start time.Time
	for i, cpu := range cpus {
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with us
			var set unix.CPUSet
			set.Set(cpu)
			errs[i] = unix.SchedSetaffinity(0, &set)
			pinned.Done()
			pinned.Wait()
			if i == 0 {
				start = time.Now()
			}
			if errs[i] == nil {
				rets[i], runs[i], errs[i] = prog.Benchmark(frame, n, nil)
			}
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	var sum time.Duration
	for i := range cpus {
		if errs[i] != nil {
			tb.Fatalf("CPU %d: %v", cpus[i], errs[i])
		}
		if rets[i] != want {
			tb.Fatalf("CPU %d: returned %d, want %d", cpus[i], rets[i], want)
		}
		sum += runs[i]
	}
	return benchAll{
		perPacket: float64(sum.Nanoseconds()) / float64(len(cpus)),
		wall:      wall,
		busyCPUs:  float64(n) * float64(sum) / float64(wall),
	}
}

// benchEachCPU runs prog n times on each of cpus in turn, one CPU at a
// time, and returns the mean of the kernel's time per packet: the
// one-CPU cost on the same CPUs that the all-CPU run uses.
func benchEachCPU(tb testing.TB, prog *ebpf.Program, frame []byte, n int, cpus []int, want uint32) float64 {
	tb.Helper()
	sum := 0.0
	for i := range cpus {
		sum += benchOnCPUs(tb, prog, frame, n, cpus[i:i+1], want).perPacket
	}
	return sum / float64(len(cpus))
}

// benchRounds is how many rounds benchInterleaved splits a run into.
const benchRounds = 8

// interleaved is the all-CPU cost against the one-CPU cost, measured in
// alternating rounds.
type interleaved struct {
	all, one           float64 // ns per packet, the medians over the rounds
	ratio              float64 // the median over the rounds of all ÷ one
	ratioMin, ratioMax float64 // the rounds' extremes of all ÷ one
	busyCPUs           float64 // of the all-CPU phases, their median
}

// benchInterleaved measures prog on all of cpus at once against each CPU
// alone in benchRounds rounds of n packets per CPU. A round's runs must
// be long: the kernel's setup of each run (~20 ms) is not overlapped, and
// with n/benchRounds packets the CPUs mostly took turns (busy-cpus 0.76 to
// 1.06 in one make bench), which measures no contention at all. Each round
// runs both phases back to back, in alternating order (one then all, all
// then one), and yields its own ratio. This VM's speed drifts by tens of
// per cent within seconds: measured as one long phase after the other,
// the ratio carried that drift (0.92 to 1.35 across make bench runs of
// one build); in rounds, the drift falls mostly between rounds and the
// median ratio tells the contention apart from it.
func benchInterleaved(tb testing.TB, prog *ebpf.Program, frame []byte, n int, cpus []int, want uint32) interleaved {
	tb.Helper()
	per := n
	var all, one, ratios, busy []float64
	for round := range benchRounds {
		var a benchAll
		var o float64
		if round%2 == 0 {
			o = benchEachCPU(tb, prog, frame, per, cpus, want)
			a = benchOnCPUs(tb, prog, frame, per, cpus, want)
		} else {
			a = benchOnCPUs(tb, prog, frame, per, cpus, want)
			o = benchEachCPU(tb, prog, frame, per, cpus, want)
		}
		all, one, busy = append(all, a.perPacket), append(one, o), append(busy, a.busyCPUs)
		ratios = append(ratios, a.perPacket/o)
	}
	return interleaved{
		all: medianOf(all), one: medianOf(one), ratio: medianOf(ratios),
		ratioMin: slices.Min(ratios), ratioMax: slices.Max(ratios), busyCPUs: medianOf(busy),
	}
}

// medianOf is the median of vs (the mean of the middle two for an even
// count); it sorts a copy.
func medianOf(vs []float64) float64 {
	s := slices.Sorted(slices.Values(vs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// benchSingle runs prog once per syscall, n times, cycling through frames,
// and returns the mean of the kernel's time per run in ns.
func benchSingle(b *testing.B, prog *ebpf.Program, frames [][]byte, n int, want uint32) float64 {
	b.Helper()
	var sum time.Duration
	for i := range n {
		ret, run, err := prog.Benchmark(frames[i%len(frames)], 1, nil)
		if err != nil {
			b.Fatal(err)
		}
		if ret != want {
			b.Fatalf("run %d returned %d, want %d", i, ret, want)
		}
		sum += run
	}
	return float64(sum.Nanoseconds()) / float64(n)
}

func benchCounters(b *testing.B, o *Objects, slot int) dataplane.Counters {
	b.Helper()
	c, err := o.Tables().Counters(slot)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkClock measures what the XDP program's candidate time sources
// cost under BPF_PROG_TEST_RUN on this machine: a program that calls the
// helper clockCalls times and drops, against the same program without the
// calls (bare). ns/call is the difference per call. `make bench` runs it
// with BenchmarkXDP; docs/dataplane.md says which source the drop path
// reads and why.
func BenchmarkClock(b *testing.B) {
	requireRoot(b)
	const clockCalls = 8
	frame := build(udpTo(srcA4, 54))
	prog := func(fn asm.BuiltinFunc, calls int) *ebpf.Program {
		var ins asm.Instructions
		for range calls {
			ins = append(ins, fn.Call())
		}
		ins = append(ins, asm.Mov.Imm(asm.R0, 1), asm.Return())
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, Instructions: ins, License: "GPL"})
		if err != nil {
			b.Fatalf("load %v: %v", fn, err)
		}
		return p
	}
	bare := prog(asm.FnKtimeGetNs, 0)
	defer bare.Close()
	for _, c := range []struct {
		name string
		fn   asm.BuiltinFunc
	}{
		{"ktime_get_ns", asm.FnKtimeGetNs},
		{"ktime_get_coarse_ns", asm.FnKtimeGetCoarseNs},
		{"jiffies64", asm.FnJiffies64},
	} {
		p := prog(c.fn, clockCalls)
		b.Run(c.name, func(b *testing.B) {
			_, bareRun, err := bare.Benchmark(frame, b.N, nil)
			if err != nil {
				b.Fatal(err)
			}
			_, run, err := p.Benchmark(frame, b.N, b.ResetTimer)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(run.Nanoseconds()), "ns/op")
			b.ReportMetric(float64(bareRun.Nanoseconds()), "bare-ns/op")
			b.ReportMetric(float64(run-bareRun)/clockCalls, "ns/call")
		})
		p.Close()
	}
}

// BenchmarkCookie measures the SYN cookie answer (bpf/syncookie.h) under
// BPF_PROG_TEST_RUN on the real clock, one packet per syscall (the answer
// rewrites the frame in place, so a repeat would not see a SYN again),
// beside what it is made of and what it replaces, each against a bare
// XDP_DROP measured the same way (over-bare-ns/op):
//
//   - gen_ipv4: a program that only calls bpf_tcp_raw_gen_syncookie_ipv4
//     on the same SYN (with Linux's options) and drops it: the kernel's
//     cookie alone;
//   - rule_alone: the same SYN to a syn_only rule without cookies whose
//     bucket is empty (dropped, as the rule alone does under a flood);
//   - answer_ipv4: the SYN to a rule with syn_cookies: always, answered
//     with a SYN-ACK (XDP_TX); its over-bare-ns/op minus gen_ipv4's is the
//     rest of the answer. answers/s-per-core is 1e9 ÷ its over-bare-ns/op:
//     the answer rate one core sustains in the program (no transmit);
//   - answer_ipv4_noopts: a SYN without options, as floods send, answered
//     (with the MSS alone, bpf/syncookie.h's xl_cookie_fit);
//   - gen_ipv6, answer_ipv6: the same over IPv6 (bpf_tcp_raw_gen_syncookie_ipv6).
//
// gen_ipv4_repeat runs the helper program in one repeated run, without
// the syscall's noise.
func BenchmarkCookie(b *testing.B) {
	o, _ := cookieBench(b, 1e8,
		dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 0.001, Burst: 1, SynCookies: "always"},
		dataplane.RuleSpec{Name: "syn", Protocol: "tcp", Ports: ports(81, 81), SynOnly: true, Rate: 0.001, Burst: 1})
	synFrom := func(src string, port uint16) []byte { return benchSYN(b, src, port, true) }
	syn := func(port uint16) []byte { return synFrom("198.51.100.1", port) }
	answer, ruleOnly := syn(80), syn(81)
	answer6 := synFrom("2001:db8:1::1", 80)
	noOpts := benchSYN(b, "198.51.100.1", 80, false)
	// The kernel's cookie alone: r1 = IP header, r2 = TCP header, r3 its
	// length, after the bounds check the helper's arguments need.
	genProg := func(fn asm.BuiltinFunc, l4 int32, f []byte) *ebpf.Program {
		thLen := int32(len(f)) - l4
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type: ebpf.XDP, License: "GPL",
			Instructions: asm.Instructions{
				asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
				asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
				asm.Mov.Reg(asm.R4, asm.R2),
				asm.Add.Imm(asm.R4, l4+thLen),
				asm.JGT.Reg(asm.R4, asm.R3, "out"),
				asm.Mov.Reg(asm.R1, asm.R2),
				asm.Add.Imm(asm.R1, 14),
				asm.Add.Imm(asm.R2, l4),
				asm.Mov.Imm(asm.R3, thLen),
				fn.Call(),
				asm.Mov.Imm(asm.R0, 1).WithSymbol("out"),
				asm.Return(),
			},
		})
		if err != nil {
			b.Fatalf("load the cookie-only program: %v", err)
		}
		return p
	}
	gen := genProg(asm.FnTcpRawGenSyncookieIpv4, 34, answer)
	defer gen.Close()
	gen6 := genProg(asm.FnTcpRawGenSyncookieIpv6, 54, answer6)
	defer gen6.Close()
	bare, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.XDP, License: "GPL", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		b.Fatal(err)
	}
	defer bare.Close()
	// Drain the rule's bucket.
	for range 3 {
		if _, _, err := o.Program().Benchmark(ruleOnly, 1, nil); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name  string
		prog  *ebpf.Program
		frame []byte
		ret   uint32
	}{
		{"gen_ipv4", gen, answer, xdpDrop},
		{"rule_alone", o.Program(), ruleOnly, xdpDrop},
		{"answer_ipv4", o.Program(), answer, xdpTx},
		{"answer_ipv4_noopts", o.Program(), noOpts, xdpTx},
		{"gen_ipv6", gen6, answer6, xdpDrop},
		{"answer_ipv6", o.Program(), answer6, xdpTx},
	} {
		b.Run(c.name, func(b *testing.B) {
			n := min(b.N, benchSingleRuns)
			bareRun := benchSingle(b, bare, [][]byte{c.frame}, n, xdpDrop)
			b.ResetTimer()
			run := benchSingle(b, c.prog, [][]byte{c.frame}, n, c.ret)
			b.StopTimer()
			b.ReportMetric(run, "ns/op")
			b.ReportMetric(run-bareRun, "over-bare-ns/op")
			b.ReportMetric(bareRun, "bare-ns/op")
			if strings.HasPrefix(c.name, "answer_") && run > bareRun {
				b.ReportMetric(1e9/(run-bareRun), "answers/s-per-core")
			}
		})
	}
	b.Run("gen_ipv4_repeat", func(b *testing.B) {
		_, bareRun, err := bare.Benchmark(answer, b.N, nil)
		if err != nil {
			b.Fatal(err)
		}
		_, run, err := gen.Benchmark(answer, b.N, b.ResetTimer)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(run.Nanoseconds()), "ns/op")
		b.ReportMetric(float64((run - bareRun).Nanoseconds()), "over-bare-ns/op")
	})
}

// BenchmarkCookieRepeat measures the SYN cookie answer without a syscall
// per packet, whose noise on a shared VM is larger than the answer's own
// changes (bench/results/issue28/cookie-fit-ab-*): bench/gen's Resyn puts
// the SYN back into BPF_PROG_TEST_RUN's buffer before each repeat and
// tail-calls xlimit's program, which answers it (XDP_TX); the reference
// is the same Resyn around XDP_DROP, in cookieRounds alternating rounds.
// ns/op is the answer's time per SYN (the restore included),
// drop-ns/op the reference's, over-drop-ns/op their difference (medians
// over the rounds), answers/s-per-core 1e9 ÷ ns/op: what one core answers
// in the program, the restore counted against it. sent/op is the share of
// repeats that the rule's cookie counters count as sent (1: each one was
// answered, not a SYN-ACK seen again). Cases: ipv4 (Linux's options),
// ipv4_noopts (no options: a flood's usual SYN, answered with the MSS
// alone) and ipv6.
func BenchmarkCookieRepeat(b *testing.B) {
	o, plan := cookieBench(b, 1e9,
		dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 0.001, Burst: 1, SynCookies: "always"})
	slot := plan.Slot("web")
	drop, err := gen.NewReceiver(gen.ReceiverDrop)
	if err != nil {
		b.Fatal(err)
	}
	defer drop.Close()
	syn := func(src string, opts bool) []byte { return benchSYN(b, src, 80, opts) }
	for _, c := range []struct {
		name  string
		frame []byte
	}{
		{"ipv4", syn("198.51.100.1", true)},
		{"ipv4_noopts", syn("198.51.100.1", false)},
		{"ipv6", syn("2001:db8:1::1", true)},
	} {
		b.Run(c.name, func(b *testing.B) {
			ans, err := gen.NewResyn(o.Program(), c.frame)
			if err != nil {
				b.Fatal(err)
			}
			defer ans.Close()
			ref, err := gen.NewResyn(drop, c.frame)
			if err != nil {
				b.Fatal(err)
			}
			defer ref.Close()
			per := max(1, b.N/cookieRounds)
			before, err := o.Tables().CookieCounters(slot)
			if err != nil {
				b.Fatal(err)
			}
			var runs, refs []float64
			b.ResetTimer()
			for i := range cookieRounds {
				for j := range 2 {
					r, want := ans, uint32(xdpTx)
					if (i+j)%2 == 1 {
						r, want = ref, xdpDrop
					}
					ret, d, err := r.Run(per)
					if err != nil {
						b.Fatal(err)
					}
					if ret != want {
						b.Fatalf("returned %d, want %d", ret, want)
					}
					if want == xdpTx {
						runs = append(runs, float64(d.Nanoseconds()))
					} else {
						refs = append(refs, float64(d.Nanoseconds()))
					}
				}
			}
			b.StopTimer()
			after, err := o.Tables().CookieCounters(slot)
			if err != nil {
				b.Fatal(err)
			}
			run, dropNS := medianOf(runs), medianOf(refs)
			b.ReportMetric(run, "ns/op")
			b.ReportMetric(dropNS, "drop-ns/op")
			b.ReportMetric(run-dropNS, "over-drop-ns/op")
			b.ReportMetric(1e9/run, "answers/s-per-core")
			b.ReportMetric(float64(after.Sent-before.Sent)/float64(per*cookieRounds), "sent/op")
		})
	}
}

// cookieBench loads the objects of the cookie benchmarks (closed when b
// ends) with rules, answers from a budget of cookieRate a second, and the
// default host's addresses.
func cookieBench(b *testing.B, cookieRate float64, rules ...dataplane.RuleSpec) (*Objects, *dataplane.Plan) {
	b.Helper()
	requireRoot(b)
	o, err := Load(Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { o.Close() })
	plan, err := dataplane.Compile(&dataplane.Spec{CookieRate: cookieRate, Rules: rules}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := o.Tables().Apply(plan); err != nil {
		b.Fatal(err)
	}
	if err := o.Tables().SetHostAddrs(defaultHost()); err != nil {
		b.Fatal(err)
	}
	keepLease(b, o.Tables())
	return o, plan
}

// benchSYN is a SYN from src to port, with Linux's options or none.
func benchSYN(b *testing.B, src string, port uint16, opts bool) []byte {
	f := frame.MustBuild(frame.Spec{Src: netip.MustParseAddr(src), Proto: frame.ProtoTCP, SrcPort: 40000,
		DstPort: port, TCPFlags: frame.TCPSyn, TCPSeq: 777000})
	if opts {
		f = withTCPOptions(b, f, 14, linuxSYNOptions(99999))
	}
	return f
}

// cookieRounds is how many alternating rounds BenchmarkCookieRepeat
// splits a run into.
const cookieRounds = 6

// randomTable is BenchmarkRandomSources' per-source table: make bench's
// live random-source flood's (bench/main.go, -source-rate).
const randomTable = 131072

// BenchmarkRandomSources measures the spoofed flood against a per-source
// limit as make bench's live random-source section does (a rule of 1e8/s,
// 1 packet/s per /32 with a burst of 2, a table of 131072 sources), but by
// BPF_PROG_TEST_RUN without live frames, so that it runs where the kernel
// refuses them: bench/gen's Spoofer gives the one buffer a random source
// at each repeat and tail-calls the receiver, so a run of b.N repeats is
// b.N packets from random sources. Each case alternates benchRounds runs
// of XDP_DROP behind the same Spoofer (the reference, bare-ns/op) with
// runs of xlimit (ns/op, medians); over-bare-ns/op is xlimit's cost
// above XDP_DROP per packet, of-bare-rate the share of XDP_DROP's rate
// that xlimit keeps on one CPU (bare-ns/op ÷ ns/op: issue 28's target is
// 0.6 for the live flood, where the interface's own cost is in both),
// dropped the share of xlimit's packets it refused.
//
// sources_64k: 65536 sources (100.64.0.0/16), each tracked and over its
// limit after the warm-up: the live section's steady state.
// sources_1m: 1048576 sources (100.64.0.0/12), 8 times the table, each
// back within its emission interval (b.N packets take under a second),
// so every packet is a source the table does not hold.
func BenchmarkRandomSources(b *testing.B) {
	requireRoot(b)
	o, err := Load(Options{SourceTableSize: randomTable})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	plan, err := dataplane.Compile(&dataplane.Spec{
		Rules: []dataplane.RuleSpec{
			{Name: "random", Protocol: "udp", Ports: ports(9000, 9000), Rate: 1e8, Burst: 1e8,
				PerSource: &dataplane.PerSourceSpec{Rate: 1, Burst: 2, PrefixV4: 32, PrefixV6: 128}},
		},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := o.Tables().Apply(plan); err != nil {
		b.Fatal(err)
	}
	slot := plan.Slot("random")
	bare, err := gen.NewReceiver(gen.ReceiverDrop)
	if err != nil {
		b.Fatal(err)
	}
	defer bare.Close()
	f := build(udpTo(netip.MustParseAddr("100.64.0.1"), 9000))
	for _, c := range []struct {
		name    string
		sources netip.Prefix
		warm    int // packets before the measured runs
	}{
		{"sources_64k", pfx("100.64.0.0/16"), 8 << 16},
		{"sources_1m", pfx("100.64.0.0/12"), 1 << 20},
	} {
		b.Run(c.name, func(b *testing.B) {
			ref, err := gen.NewSpoofer(bare, c.sources)
			if err != nil {
				b.Fatal(err)
			}
			defer ref.Close()
			xl, err := gen.NewSpoofer(o.Program(), c.sources)
			if err != nil {
				b.Fatal(err)
			}
			defer xl.Close()
			if _, _, err := xl.Run(f, c.warm); err != nil {
				b.Fatal(err)
			}
			before := benchCounters(b, o, slot)
			var runs, bares []float64
			b.ResetTimer()
			for range benchRounds {
				_, d, err := ref.Run(f, b.N)
				if err != nil {
					b.Fatal(err)
				}
				bares = append(bares, float64(d.Nanoseconds()))
				if _, d, err = xl.Run(f, b.N); err != nil {
					b.Fatal(err)
				}
				runs = append(runs, float64(d.Nanoseconds()))
			}
			b.StopTimer()
			after := benchCounters(b, o, slot)
			drop := after.Packets[dataplane.VerdictDrop] - before.Packets[dataplane.VerdictDrop]
			pass := after.Packets[dataplane.VerdictPass] - before.Packets[dataplane.VerdictPass]
			if drop+pass == 0 {
				b.Fatal("the rule counted none of the packets")
			}
			run, bareRun := medianOf(runs), medianOf(bares)
			b.ReportMetric(run, "ns/op")
			b.ReportMetric(bareRun, "bare-ns/op")
			b.ReportMetric(run-bareRun, "over-bare-ns/op")
			b.ReportMetric(run/bareRun, "x-bare")
			b.ReportMetric(bareRun/run, "of-bare-rate")
			b.ReportMetric(float64(drop)/float64(drop+pass), "dropped")
		})
	}
}
