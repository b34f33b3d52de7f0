//go:build linux

package maps

import (
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// BenchmarkXDP measures the per-packet cost of the whole XDP path with
// BPF_PROG_TEST_RUN (the real clock, as in production), and reports it as
// ns/op and as a ratio to a bare XDP_DROP program measured in the same
// sub-benchmark with the same repeat count; rule_pass_2cpu runs the same
// frame on both CPUs at once against one rule (ns/op is the mean time per
// run on each CPU). Run with
//
//	go test -run '^$' -bench BenchmarkXDP ./maps/
func BenchmarkXDP(b *testing.B) {
	requireRoot(b)
	o, err := Load(Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	plan, err := dataplane.Compile(&dataplane.Spec{
		Allow: []netip.Prefix{pfx("10.0.0.0/8"), pfx("2001:db8:a::/48")},
		Deny:  []netip.Prefix{pfx("10.66.0.0/16")},
		Rules: []dataplane.RuleSpec{
			{Name: "pass", Protocol: "udp", Ports: ports(53, 53), Rate: 1e9, Burst: 1e9},
			// One packet per 1000 s: drained by the first run below.
			{Name: "drop", Protocol: "udp", Ports: ports(54, 54), Rate: 0.001, Burst: 1},
			{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1e9, Burst: 1e9},
		},
	}, nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := o.Tables().Apply(plan); err != nil {
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

	v6ext := udpTo(srcA6, 53)
	v6ext.IPv6Ext = []uint8{dataplane.ExtHopByHop, dataplane.ExtDstOpts, dataplane.ExtRouting, dataplane.ExtFragment}
	v6ext.MoreFragments = true
	for _, c := range []struct {
		name  string
		frame []byte
		ret   uint32
	}{
		{"no_rule", build(udpTo(srcA4, 9)), xdpPass},
		{"rule_pass", build(udpTo(srcA4, 53)), xdpPass},
		{"rule_drop", build(udpTo(srcA4, 54)), xdpDrop},
		{"allowlisted", build(udpTo(netip.MustParseAddr("10.1.2.3"), 54)), xdpPass},
		{"ipv6_ext", build(v6ext), xdpPass},
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
	// Both CPUs hitting one rule: the shared bucket's cache line bounces.
	frame := build(udpTo(srcA4, 53))
	b.Run("rule_pass_2cpu", func(b *testing.B) {
		ncpu := min(runtime.NumCPU(), 2)
		if ncpu < 2 {
			b.Skip("needs two CPUs")
		}
		_, bareRun, err := bare.Benchmark(frame, b.N, nil)
		if err != nil {
			b.Fatal(err)
		}
		slot := plan.Slot("pass")
		before, err := o.Tables().Counters(slot)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		runs := make([]time.Duration, ncpu)
		errs := make([]error, ncpu)
		var wg sync.WaitGroup
		start := time.Now()
		for cpu := range ncpu {
			wg.Add(1)
			go func() {
				defer wg.Done()
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				var set unix.CPUSet
				set.Set(cpu)
				if errs[cpu] = unix.SchedSetaffinity(0, &set); errs[cpu] != nil {
					return
				}
				_, runs[cpu], errs[cpu] = o.Program().Benchmark(frame, b.N, nil)
			}()
		}
		wg.Wait()
		// Wall time per packet of one CPU: close to ns/op when the two
		// CPUs really ran at the same time.
		b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "wall-ns/op")
		var sum time.Duration
		for cpu := range ncpu {
			if errs[cpu] != nil {
				b.Fatal(errs[cpu])
			}
			sum += runs[cpu]
		}
		after, err := o.Tables().Counters(slot)
		if err != nil {
			b.Fatal(err)
		}
		// The rule's bucket (1e9/s, burst 1e9) cannot run dry here: a drop
		// is a packet that lost the compare-and-swap race 8 times.
		d := after.Sub(before)
		b.ReportMetric(float64(d.Packets[dataplane.VerdictDrop])/float64(d.Packets[dataplane.VerdictPass]+d.Packets[dataplane.VerdictDrop]), "cas-drops/op")
		per := float64(sum.Nanoseconds()) / float64(ncpu)
		b.ReportMetric(per, "ns/op")
		if bareRun > 0 {
			b.ReportMetric(per/float64(bareRun.Nanoseconds()), "x-bare")
		}
		b.ReportMetric(float64(bareRun.Nanoseconds()), "bare-ns/op")
	})
	b.Run("bare", func(b *testing.B) {
		_, run, err := bare.Benchmark(build(udpTo(srcA4, 53)), b.N, b.ResetTimer)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(run.Nanoseconds()), "ns/op")
	})
}
