//go:build linux

package main

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"time"
)

// spread is the median, min and max of a series.
type spread struct{ med, min, max float64 }

func spreadOf(vs []float64) spread {
	if len(vs) == 0 {
		return spread{math.NaN(), math.NaN(), math.NaN()}
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{med, s[0], s[len(s)-1]}
}

func over(ps []point, f func(point) float64) spread {
	vs := make([]float64, len(ps))
	for i, p := range ps {
		vs[i] = f(p)
	}
	return spreadOf(vs)
}

// format renders "med (min–max)" with verb for each number; a single
// value alone.
func (s spread) format(verb string) string {
	if math.IsNaN(s.med) {
		return "–"
	}
	m := fmt.Sprintf(verb, s.med)
	if s.min == s.max {
		return m
	}
	return fmt.Sprintf("%s (%s–%s)", m, fmt.Sprintf(verb, s.min), fmt.Sprintf(verb, s.max))
}

func mpps(p point) float64        { return p.rate(p.Offered) / 1e6 }
func droppedMpps(p point) float64 { return p.rate(p.Dropped) / 1e6 }
func admittedPPS(p point) float64 { return p.rate(p.Admitted) }
func pathNS(p point) float64      { return p.pathNS() }
func softirqPerM(p point) float64 { return p.softirqPerM() }

// lostFrac is the share of offered packets neither dropped by the receiver
// nor admitted to the UDP layer (the stack dropped them elsewhere, or
// counters were read a few µs apart).
func lostFrac(p point) float64 {
	if p.Offered == 0 {
		return 0
	}
	return (float64(p.Offered) - float64(p.Dropped) - float64(p.Admitted)) / float64(p.Offered)
}

func ringFrac(p point) float64 {
	if p.Offered+p.RingDrops == 0 {
		return 0
	}
	return float64(p.RingDrops) / float64(p.Offered+p.RingDrops)
}

type table struct {
	b    *strings.Builder
	cols int
}

func newTable(b *strings.Builder, head ...string) *table {
	fmt.Fprintf(b, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
	return &table{b, len(head)}
}

func (t *table) row(cells ...string) {
	fmt.Fprintf(t.b, "| %s |\n", strings.Join(cells, " | "))
}

func (r *results) markdown() string {
	var b strings.Builder
	c := r.c
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# xlimit benchmarks, %s, %s\n\n", r.start.Format("2006-01-02 15:04 MST"), r.host)
	if len(r.src.dirty) > 0 {
		w("> **DIRTY TREE: these numbers are not those of commit %s.** The run was made with -allow-dirty from a tree "+
			"that differs from it in %d paths:\n>\n", r.src.commit, len(r.src.dirty))
		for _, d := range r.src.dirty {
			w("> `%s`<br>\n", d)
		}
		w("\n")
	}
	w("- Commit: %s (%s)%s\n", r.src.commit, r.version, map[bool]string{true: ", **dirty tree**", false: ", clean tree"}[len(r.src.dirty) > 0])
	w("- Machine: %s, %d CPUs, Linux %s, %s; %s; %s\n", r.cpuModel, runtime.NumCPU(), r.kernel, r.goVersion, r.kcfg.hzText(), r.irqTimeText())
	w("- Load average at the start %s, at the end %s (other work on the machine shares the CPUs: see *Method*)\n", r.loadStart, r.loadEnd)
	if r.liveErr != nil {
		w("- No live lab: the floods did not run (section 2); run time %v\n\n", r.end.Sub(r.start).Round(time.Second))
	} else {
		w("- %s; %d repetitions of every live measurement, shown as median (min–max); run time %v\n\n",
			r.lab, c.reps, r.end.Sub(r.start).Round(time.Second))
	}

	r.mapsSection(&b)
	if r.liveErr != nil {
		w("## 2. Live flood\n\nNot run: %v. The floods need BPF_PROG_TEST_RUN's live-frames mode "+
			"(docs/design.md §7). Every queue live, XDP_DROP beside xlimit, is loader's BenchmarkQueues, which needs "+
			"no live frames: its targets are in the conclusions.\n\n", r.liveErr)
	} else {
		r.genSection(&b)
		r.cmpSection(&b)
		r.rndSection(&b)
		r.mqSection(&b)
	}
	r.accSection(&b)
	r.controlSection(&b)
	r.robustSection(&b)
	r.conclusions(&b)
	r.methodSection(&b)
	return b.String()
}

func (r *results) mapsSection(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 1. Per-packet cost (BPF_PROG_TEST_RUN)\n\n")
	if r.c.skipMaps {
		w("Skipped (-skip-maps-bench).\n\n")
		return
	}
	if r.mapsErr != nil {
		w("Failed: %v\n\n", r.mapsErr)
		return
	}
	w("`go test -run '^$' -bench . -benchtime 2000000x -count %d ./maps/` (maps/bench_test.go documents every case): "+
		"the real program on the real clock, ns per packet as the kernel times it, and the ratio to a bare XDP_DROP "+
		"program measured in the same sub-benchmark (x-bare). *_allcpu: one pinned thread per CPU at once, "+
		"against one rule, in 8 rounds of b.N packets per CPU alternating with the same case on each CPU alone (busy-cpus: how much they overlapped; below 1.25 the ratio is not judged); x-1cpu is the median of the rounds' ratios (x-1cpu-min and -max their extremes). *_single and per_source_miss: one packet per syscall "+
		"(every packet from another of 65536 sources against a 4096-entry table). BenchmarkRandomSources: "+
		"the random-source flood's per-packet cost without live frames (bench/gen's Spoofer gives one buffer a random source at each repeat), "+
		"against XDP_DROP behind the same Spoofer; of-bare-rate is the share of XDP_DROP's rate kept on one CPU.\n\n", r.c.mapsCount)
	var order []string
	by := map[string][]benchLine{}
	for _, l := range r.mapsLines {
		if _, ok := by[l.name]; !ok {
			order = append(order, l.name)
		}
		by[l.name] = append(by[l.name], l)
	}
	metric := func(ls []benchLine, unit string) spread {
		var vs []float64
		for _, l := range ls {
			if v, ok := l.metrics[unit]; ok {
				vs = append(vs, v)
			}
		}
		return spreadOf(vs)
	}
	t := newTable(b, "case", "ns/packet", "x-bare", "bare ns/packet", "more")
	for _, name := range order {
		ls := by[name]
		var more []string
		for _, u := range ls[0].units {
			switch u {
			case "ns/op", "x-bare", "bare-ns/op":
				continue
			}
			more = append(more, fmt.Sprintf("%s %s", u, metric(ls, u).format("%.3g")))
		}
		t.row(name, metric(ls, "ns/op").format("%.1f"), metric(ls, "x-bare").format("%.2f"),
			metric(ls, "bare-ns/op").format("%.1f"), strings.Join(more, "; "))
	}
	w("\n<details><summary>go test output</summary>\n\n```\n%s```\n</details>\n\n", r.mapsRaw)
}

func (r *results) genSection(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 2. Live flood\n\n### The generator\n\n")
	w("An XDP program (bench/gen/xlgen.c) run by BPF_PROG_TEST_RUN in live-frames mode, %d frames per call in batches of 64, "+
		"on one thread pinned to each CPU inside the client namespace; it redirects every frame out of the client veth "+
		"(60-byte UDP frames to the limited port). The veth hands a frame to the server end's receive queue of the sending CPU, "+
		"whose NAPI poll runs in that CPU's softirq right after each batch: generator and receiver share the CPUs, so the rate "+
		"reached is what the pair sustains, and the receiver's cost is the CPU time above the XDP_DROP reference.\n\n", 8192)
	t := newTable(b, "receiver", "offered Mpps", "CPU ns per packet (generator threads + ksoftirqd)", "softirq ms per Mpkt (/proc/stat)", "refused by the veth")
	for _, label := range r.genOrder {
		ps := r.gen[label]
		t.row(label, over(ps, mpps).format("%.2f"), over(ps, pathNS).format("%.0f"),
			over(ps, softirqPerM).format("%.0f"), over(ps, ringFrac).format("%.2g"))
	}
	if len(r.genOrder) > 0 {
		ps := r.gen[r.genOrder[0]]
		ns := over(ps, pathNS).med
		w("\n**Generator speed:** %s Mpps against XDP_DROP on %d CPUs shared with the receiver and with whatever else runs on the "+
			"machine; %.0f ns of CPU per frame for generating, transmitting and dropping it, i.e. %.1f Mpps per free CPU "+
			"(%.1f Mpps on %d). %s\n",
			over(ps, mpps).format("%.2f"), len(r.cpus), ns, 1e3/ns, 1e3/ns*float64(len(r.cpus)), len(r.cpus), r.generatorVerdict())
	}
	w("\n")
}

func (r *results) drop(level float64) float64 {
	return over(r.cmp[key{rcvDrop, level}], pathNS).med
}

func (r *results) cmpSection(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	c := r.c
	w("### Comparison flat out: a limit of %.0f packets/s on the port, one source\n\n", c.rate)
	w("Each receiver in turn gets the same generator flat out. Limits: burst %.0f packets everywhere (%.0f ms worth). "+
		"`admitted` counts what reached the UDP layer (/proc/net/snmp Udp InDatagrams + InErrors + NoPorts in the server namespace); "+
		"`dropped` is the receiver's own counter (xlimit's rule counter from its pins, the nft rule's counter, the iptables rule's counter). "+
		"`above XDP_DROP` is the receiver's own CPU cost per packet: the path CPU minus the XDP_DROP reference's (median).\n\n",
		max(5, c.rate/10), 1e3*max(5, c.rate/10)/c.rate)
	for kind, why := range r.skipped {
		w("- %s skipped: %s\n", kind, why)
	}
	t := newTable(b, "receiver", "offered Mpps (max sustained)", "dropped Mpps", "admitted pkt/s", "admitted ÷ configured",
		"softirq ms per Mpkt", "CPU ns/packet", "above XDP_DROP ns/packet", "neither dropped nor admitted")
	base := r.drop(0)
	for _, kind := range comparisonReceivers {
		ps := r.cmp[key{kind, 0}]
		if len(ps) == 0 {
			continue
		}
		acc, ratio := "–", "–"
		if kind != rcvDrop {
			acc = over(ps, admittedPPS).format("%.0f")
			if kind != rcvNone {
				ratio = over(ps, func(p point) float64 { return p.rate(p.Admitted) / c.rate }).format("%.4f")
			}
		}
		t.row(kind, over(ps, mpps).format("%.2f"), over(ps, droppedMpps).format("%.2f"), acc, ratio,
			over(ps, softirqPerM).format("%.0f"), over(ps, pathNS).format("%.0f"),
			fmt.Sprintf("%.0f", over(ps, pathNS).med-base), over(ps, lostFrac).format("%.2g"))
	}
	w("\n")

	w("### Same offered load\n\n")
	w("The generator paced to a fixed total rate (about 1 ms of frames per call and CPU). `reached` is the offered rate "+
		"achieved: below the target when generator and receiver together ran out of CPU, which is where the receiver stops "+
		"sustaining the load (%s). CPU ns per packet is the precise "+
		"measure; at low rates it includes a fixed cost per call and cold caches after each pause, the same for every "+
		"receiver, hence the XDP_DROP reference; for `no filter` it also includes waking the UDP sink's reader for nearly "+
		"every packet. softirq from /proc/stat: %s.\n\n", r.ringText(), r.softirqText())
	t = newTable(b, "receiver", "target Mpps", "reached Mpps", "dropped ÷ offered", "refused by the veth", "CPU ns/packet", "above XDP_DROP ns/packet", "softirq ms per Mpkt")
	for _, lvl := range c.levels {
		base := r.drop(lvl)
		for _, kind := range comparisonReceivers {
			ps := r.cmp[key{kind, lvl}]
			if len(ps) == 0 {
				continue
			}
			t.row(kind, fmt.Sprintf("%.2f", lvl/1e6), over(ps, mpps).format("%.2f"),
				over(ps, func(p point) float64 { return float64(p.Dropped) / math.Max(1, float64(p.Offered)) }).format("%.4f"),
				over(ps, ringFrac).format("%.2g"), over(ps, pathNS).format("%.0f"),
				fmt.Sprintf("%.0f", over(ps, pathNS).med-base), over(ps, softirqPerM).format("%.0f"))
		}
	}
	w("\n")
}

func (r *results) rndSection(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	c := r.c
	w("### Random sources: per-source limits\n\n")
	n := float64(uint64(1) << (32 - randomPrefix.Bits()))
	w("Every frame from a random address of %s (%.0f sources), flat out; a limit of %g packets/s per source "+
		"(xlimit: a `per_source` bucket under a rule of 1e8/s; nft: a meter keyed by `ip saddr`; iptables: hashlimit "+
		"`--hashlimit-mode srcip`), burst %g; tables sized 131072. Every source is offered far more than its rate, so the expected "+
		"admitted rate is %.0f/s. The reference is XDP_DROP with the same random sources.\n\n", randomPrefix, n, c.srcRate, srcBurst(c.srcRate), n*c.srcRate)
	t := newTable(b, "receiver", "offered Mpps", "dropped Mpps", "admitted pkt/s", "admitted ÷ expected", "softirq ms per Mpkt", "CPU ns/packet", "above XDP_DROP ns/packet")
	base := over(r.rnd[rcvDrop], pathNS).med
	for _, kind := range randomReceivers {
		ps := r.rnd[kind]
		if len(ps) == 0 {
			continue
		}
		acc, ratio := "–", "–"
		if kind != rcvDrop {
			acc = over(ps, admittedPPS).format("%.0f")
			ratio = over(ps, func(p point) float64 { return p.rate(p.Admitted) / (n * c.srcRate) }).format("%.3f")
		}
		t.row(kind, over(ps, mpps).format("%.2f"), over(ps, droppedMpps).format("%.2f"), acc, ratio,
			over(ps, softirqPerM).format("%.0f"), over(ps, pathNS).format("%.0f"), fmt.Sprintf("%.0f", over(ps, pathNS).med-base))
	}
	w("\n")
}

func (r *results) accSection(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 3. Rate accuracy\n\n### Fake clock\n\n")
	switch {
	case r.c.skipFake:
		w("Skipped (-skip-fake-clock).\n\n")
	case r.fakeErr != nil:
		w("Failed: %v\n\n", r.fakeErr)
	default:
		w("maps' TestAccuracy and TestAccuracyHighRates: the real program under BPF_PROG_TEST_RUN with a fake clock, saturating " +
			"traffic (1.2 × the rate), checked against the exact expectation (one packet for packet rates, 0.1 %% for byte " +
			"rates and at the highest rates). Deterministic, so run once; each line is the test's own.\n\n")
		t := newTable(b, "test", "configured", "result", "pass")
		for _, fc := range r.fake {
			pass := "FAIL"
			if fc.pass {
				pass = "ok"
			}
			t.row(fc.test, fc.name, fc.log, pass)
		}
		w("\n")
	}
	w("### Live traffic\n\n")
	if r.liveErr != nil {
		w("Not run: no live floods (section 2).\n\n")
		return
	}
	w("A flood flat out from one source for %v from a standing start, against a limit at the configured rate with a burst "+
		"of a tenth of a second's worth (at least 5). Admitted is counted, and dropped, by an nftables rule at netdev ingress "+
		"right behind the limiter (`udp dport %d counter drop`; for nft limit the next rule of the same chain), so that admitted "+
		"packets cost little and rates the UDP stack could not absorb (%s) can be "+
		"measured. Every counter is read at rest, before and after; a saturated limiter admits its burst plus rate × the "+
		"flood's duration (first BPF_PROG_TEST_RUN call to the end of the last), so the admitted rate is "+
		"(admitted − burst) ÷ duration.\n\n", r.c.accDuration, sinkPort, r.stackText())
	rates := slices.Clone(r.c.accRates)
	slices.Sort(rates)
	t := newTable(b, "configured pkt/s", "receiver", "admitted pkt/s beyond the burst", "÷ configured", "offered Mpps")
	for _, rate := range rates {
		for _, kind := range accuracyReceivers {
			ps := r.acc[key{kind, rate}]
			if len(ps) == 0 {
				continue
			}
			t.row(fmt.Sprintf("%.0f", rate), kind, over(ps, accRate).format("%.1f"),
				over(ps, func(p point) float64 { return accRate(p) / rate }).format("%.4f"), over(ps, mpps).format("%.2f"))
		}
	}
	w("\nThe flat-out comparison above gives the accuracy of every receiver at %.0f/s, counted at the UDP layer.\n\n", r.c.rate)

	w("### Burst and CPUs\n\n")
	w("The same flat-out measurement as the comparison (limit %.0f/s, admitted at the UDP layer), with the burst at nftables' "+
		"and iptables' default of 5 packets and at %.0f, and the generator on one CPU or on all.\n\n", r.c.rate, max(5, r.c.rate/10))
	t = newTable(b, "receiver, burst, generator CPUs", "offered Mpps", "admitted pkt/s", "÷ configured")
	for _, h := range hashlimitCases(r.cpus, max(5, r.c.rate/10)) {
		ps := r.hl[h.label()]
		if len(ps) == 0 {
			continue
		}
		t.row(h.label(), over(ps, mpps).format("%.2f"), over(ps, admittedPPS).format("%.0f"),
			over(ps, func(p point) float64 { return p.rate(p.Admitted) / r.c.rate }).format("%.3f"))
	}
	w("\n%s\n\n", r.hashlimitText())
}

func (r *results) robustSection(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Robustness\n\nFuzz targets (run by `go test -fuzz`; not part of this report's run):\n\n")
	w("- `maps` FuzzXDP: the packet parser of the real program under BPF_PROG_TEST_RUN, differential against the Go model\n")
	w("- `userspace/config` FuzzParse: the rules file decoder and validator\n")
	w("- `userspace/api` FuzzFeedback, FuzzPutRules: the API's request bodies\n\n")
}

func (r *results) methodSection(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Method\n\n")
	w("- **Offered** is what the server veth received (its rx_packets); frames the veth refused because its receive ring " +
		"was full are counted apart (server rx_dropped + client tx_dropped) and never reached a filter.\n")
	w("- **CPU ns per packet** is the CPU time of the generator's threads (CLOCK_THREAD_CPUTIME_ID, which includes the " +
		"softirq work the kernel does on them) plus that of the ksoftirqd threads, over the window, per offered packet: " +
		"generating, transmitting and receiving, and nothing else on the machine. The receiver's own cost is that minus the " +
		"XDP_DROP reference at the same load. It excludes user space (the UDP sink reading admitted packets, the xlimit daemon).\n")
	w("- **softirq ms per Mpkt** is the softirq column of /proc/stat summed over all CPUs. %s; it includes softirq work of "+
		"anything else running on the machine.\n", r.softirqText())
	w("- Receivers other than xlimit sit behind a one-instruction XDP_PASS program on the server veth: a veth accepts " +
		"redirected XDP frames only while its peer has NAPI on, which an XDP program (xlimit's own too) or GRO switches on. " +
		"The generator table shows the GRO-only variant for the stack.\n")
	w("- The generator itself is attached (never run) to the client veth: that keeps it in the kernel's XDP dispatcher; " +
		"otherwise every BPF_PROG_TEST_RUN call adds and removes it there and waits for two RCU grace periods (~25 ms).\n")
	w("- iptables is the nf_tables variant (iptables-nft: hashlimit through nft_compat), in the raw table's PREROUTING (before " +
		"routing and conntrack); nftables rules are at netdev ingress on the server veth.\n")
	w("- Other work on the machine (load average above) takes CPU time from the generator: it lowers the rates reached, " +
		"not the CPU per packet.\n")
}

// mqSection is the flood flat out on one queue up to every queue.
func (r *results) mqSection(b *strings.Builder) {
	if len(r.mq) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	c := r.c
	w("### Every queue\n\n")
	w("The flood flat out from one source against the comparison's limit (%g/s), with the generator on 1 to %d CPUs: "+
		"on a veth the receive queue of an XDP-transmitted frame is the sending CPU's, so q generator threads flood q of "+
		"the %d queues, and each queue's XDP program runs on its CPU. *Frames by queue* is each queue's share "+
		"(ethtool -S, rx_queue_N_xdp_packets, median over the repetitions); *scaling* is the rate over q × the 1-queue rate.\n\n",
		c.rate, len(r.cpus), len(r.cpus))
	t := newTable(b, "receiver", "queues", "offered Mpps", "frames by queue", "admitted ÷ configured", "scaling ÷ linear", "CPU ns/packet")
	for _, kind := range []string{rcvDrop, rcvXlimit} {
		one := over(r.mq[key{kind, 1}], mpps).med
		for q := 1; q <= len(r.cpus); q++ {
			k := key{kind, float64(q)}
			ps := r.mq[k]
			if len(ps) == 0 {
				continue
			}
			shares := make([]string, 0, q)
			if ss := r.mqShare[k]; len(ss) > 0 {
				for i := range ss[0] {
					var v []float64
					for _, s := range ss {
						if i < len(s) {
							v = append(v, s[i])
						}
					}
					shares = append(shares, fmt.Sprintf("%.2f", spreadOf(v).med))
				}
			}
			adm := "–"
			if kind == rcvXlimit {
				adm = over(ps, func(p point) float64 { return p.rate(p.Admitted) / c.rate }).format("%.4f")
			}
			scale := "–"
			if one > 0 {
				scale = fmt.Sprintf("%.2f", over(ps, mpps).med/(float64(q)*one))
			}
			t.row(kind, fmt.Sprint(q), over(ps, mpps).format("%.2f"), strings.Join(shares, " / "), adm, scale,
				over(ps, pathNS).format("%.0f"))
		}
	}
	w("\n")
}
