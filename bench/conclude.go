//go:build linux

package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// The report's statements about the machine and the run, each computed
// from what this run read or measured: nothing here is fixed in advance.

// irqTimeText says whether the kernel accounts IRQ time, from its config.
func (r *results) irqTimeText() string {
	switch {
	case r.kcfg.from == "":
		return "IRQ time accounting unknown (no kernel config readable)"
	case r.kcfg.irqTime == "y":
		return "IRQ time accounting on (CONFIG_IRQ_TIME_ACCOUNTING=y)"
	default:
		return "no IRQ time accounting (CONFIG_IRQ_TIME_ACCOUNTING not set)"
	}
}

// softirqText is how far the softirq column of /proc/stat can be trusted
// on this kernel.
func (r *results) softirqText() string {
	switch {
	case r.kcfg.from == "":
		return "whether the kernel accounts IRQ time exactly is unknown (no kernel config readable), so it may be sampled at the tick and unreliable at partial load"
	case r.kcfg.irqTime == "y":
		return fmt.Sprintf("the kernel accounts IRQ time exactly (CONFIG_IRQ_TIME_ACCOUNTING=y in %s), so it holds at any load", r.kcfg.from)
	default:
		return fmt.Sprintf("the kernel has no CONFIG_IRQ_TIME_ACCOUNTING (%s), so softirq time is sampled at the tick: good flat out "+
			"(the CPUs are busy with the flood), unreliable at partial load", r.kcfg.from)
	}
}

// allPoints is every live point of the run, with its table's name.
func (r *results) allPoints() map[string][]point {
	all := map[string][]point{}
	for label, ps := range r.gen {
		all["generator: "+label] = ps
	}
	for k, ps := range r.cmp {
		name := "comparison flat out: " + k.receiver
		if k.level > 0 {
			name = fmt.Sprintf("same offered load %.2f Mpps: %s", k.level/1e6, k.receiver)
		}
		all[name] = ps
	}
	for kind, ps := range r.rnd {
		all["random sources: "+kind] = ps
	}
	for k, ps := range r.acc {
		all[fmt.Sprintf("accuracy %.0f/s: %s", k.level, k.receiver)] = ps
	}
	for label, ps := range r.hl {
		all["burst and CPUs: "+label] = ps
	}
	return all
}

// ringText says whether any receiver made the veth refuse frames (its
// receive ring full), from the counters of every point.
func (r *results) ringText() string {
	var over []string
	var points int
	var refused uint64
	for name, ps := range r.allPoints() {
		var n uint64
		for _, p := range ps {
			n += p.RingDrops
		}
		points += len(ps)
		refused += n
		if n > 0 {
			over = append(over, fmt.Sprintf("%s (%d frames, at most %.2g of those offered)", name, n, over2(ps)))
		}
	}
	if refused == 0 {
		return fmt.Sprintf("no receiver overflowed the veth's ring in this run: 0 frames refused over %d measurements, "+
			"as the veth's and the client's drop counters show; the receiving softirq runs on the sending thread after each "+
			"batch, so an overloaded receiver slows the generator down instead", points)
	}
	slices.Sort(over)
	return fmt.Sprintf("the veth's ring overflowed in this run (%d frames refused in all, counted apart, never seen by a filter): %s",
		refused, strings.Join(over, "; "))
}

func over2(ps []point) float64 { return over(ps, ringFrac).max }

// generatorVerdict says, per receiver of the flat-out comparison, whether
// the rate reached measures the receiver or the generator: a receiver
// that reaches (nearly) the rate the generator reaches against XDP_DROP,
// the cheapest receiver there is, leaves the generator as the limit.
func (r *results) generatorVerdict() string {
	ref := r.cmp[key{rcvDrop, 0}]
	if len(ref) == 0 {
		return "(No XDP_DROP reference flat out in this run: whether the generator limits the comparison is not known.)"
	}
	refRate, base := over(ref, mpps).med, over(ref, pathNS).med
	var bound, free []string
	for _, kind := range comparisonReceivers {
		ps := r.cmp[key{kind, 0}]
		if kind == rcvDrop || len(ps) == 0 {
			continue
		}
		reached, path := over(ps, mpps).med, over(ps, pathNS).med
		d := fmt.Sprintf("%s %.2f Mpps (%.0f%% of XDP_DROP's), %.0f ns above the reference", kind, reached, 100*reached/refRate, path-base)
		if reached >= 0.9*refRate || path-base < base {
			bound = append(bound, d)
		} else {
			free = append(free, d)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Against the generator's %.0f ns per frame with XDP_DROP (%.2f Mpps): ", base, refRate)
	if len(free) > 0 {
		fmt.Fprintf(&b, "these receivers cost more per packet than generator and reference together and reach under 90%% of "+
			"the reference's rate, so their rates measure them, not the generator: %s. ", strings.Join(free, "; "))
	}
	if len(bound) > 0 {
		fmt.Fprintf(&b, "**The generator is a limit** for these (they reach at least 90%% of the reference's rate, or cost "+
			"less above it than the generator itself): %s; their reached rates are a lower bound of what they sustain, "+
			"and their CPU ns per packet is the measure.", strings.Join(bound, "; "))
	} else {
		b.WriteString("the generator is not the bottleneck of any receiver in this run.")
	}
	return b.String()
}

// stackText is the rate the UDP stack absorbed flat out in this run.
func (r *results) stackText() string {
	ps := r.cmp[key{rcvNone, 0}]
	if len(ps) == 0 {
		return "not measured in this run: no `no filter` point"
	}
	return fmt.Sprintf("%s admitted per second flat out in this run, the comparison's `no filter` row", over(ps, admittedPPS).format("%.0f"))
}

// hashlimitText explains the burst-and-CPUs table from the measured
// ratios and the kernel's HZ.
func (r *results) hashlimitText() string {
	var b strings.Builder
	cases := hashlimitCases(r.cpus, max(5, r.c.rate/10))
	ratio := func(h hlCase) float64 {
		ps := r.hl[h.label()]
		if len(ps) == 0 {
			return math.NaN()
		}
		return over(ps, func(p point) float64 { return p.rate(p.Admitted) / r.c.rate }).med
	}
	small1, big1, bigN := ratio(cases[0]), ratio(cases[2]), ratio(cases[3])
	if r.kcfg.hz > 0 {
		jcap := 5 * float64(r.kcfg.hz)
		fmt.Fprintf(&b, "hashlimit refills by jiffies (HZ=%d, read from %s at run time): it cannot admit more than its burst per "+
			"jiffy, so with the default burst of 5 it caps at 5 × %d = %.0f/s whatever the configured rate (%.0f/s here); "+
			"measured on one CPU: %.3f of the configured rate, i.e. %.0f/s", r.kcfg.hz, r.kcfg.from, r.kcfg.hz, jcap, r.c.rate,
			small1, small1*r.c.rate)
		if !math.IsNaN(small1) && jcap < r.c.rate {
			fmt.Fprintf(&b, " (%.2f of the cap)", small1*r.c.rate/jcap)
		}
		b.WriteString(". ")
	} else {
		fmt.Fprintf(&b, "hashlimit refills by jiffies; %s, so the cap of 5 × HZ per second with the default burst cannot be "+
			"stated; measured on one CPU with burst 5: %.3f of the configured rate. ", r.kcfg.hzText(), small1)
	}
	exact := func(x float64) bool { return math.Abs(x-1) <= 0.02 }
	switch {
	case math.IsNaN(big1) || math.IsNaN(bigN):
		b.WriteString("The large-burst cases were not measured.")
	case exact(big1) && bigN > 1.02:
		fmt.Fprintf(&b, "With a large burst it is exact on one CPU (%.3f) and over-admits on %d (%.3f). A likely cause, from "+
			"xt_hashlimit.c: hashlimit_mt_common reads `now = jiffies` before taking the entry's lock, and rateinfo_recalc "+
			"computes the unsigned `now - prev`; when the other CPU has already moved `prev` a jiffy ahead, the difference "+
			"wraps and the credit is refilled to the whole burst.", big1, len(r.cpus), bigN)
	default:
		fmt.Fprintf(&b, "With a large burst: %.3f of the configured rate on one CPU, %.3f on %d.", big1, bigN, len(r.cpus))
	}
	return b.String()
}

// conclusions sums up what this run's numbers say, each from the tables
// above.
func (r *results) conclusions(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## Conclusions of this run\n\nEach computed from the tables above by bench/conclude.go; none is fixed in advance.\n\n")
	w("- Kernel: %s; %s.\n", r.kcfg.hzText(), r.irqTimeText())
	if r.liveErr != nil {
		w("- Live floods: not run (%v).\n", r.liveErr)
	} else {
		w("- Generator: %s\n", r.generatorVerdict())
		w("- veth ring: %s.\n", r.ringText())
		w("- UDP stack: %s.\n", r.stackText())
	}
	if ps := r.cmp[key{rcvXlimit, 0}]; len(ps) > 0 {
		acc := over(ps, func(p point) float64 { return p.rate(p.Admitted) / r.c.rate })
		w("- xlimit flat out at %.0f/s admitted %s of the configured rate.\n", r.c.rate, acc.format("%.4f"))
	}
	if len(r.acc) > 0 {
		var worst float64
		var at string
		var short []string
		for k, ps := range r.acc {
			if k.receiver != rcvXlimit {
				continue
			}
			if off := over(ps, mpps).min * 1e6; off < 1.1*k.level {
				// Offered at or under the limit in some repetition: the
				// admitted rate measures the generator, not the limiter.
				short = append(short, fmt.Sprintf("%.0f/s (offered as little as %.2f Mpps)", k.level, off/1e6))
				continue
			}
			if d := math.Abs(over(ps, accRate).med/k.level - 1); d >= worst {
				worst, at = d, fmt.Sprintf("%.0f/s", k.level)
			}
		}
		if at != "" {
			w("- xlimit's live accuracy: the largest deviation from the configured rate is %.2f %% (at %s), over the rates "+
				"offered at least 1.1 × their limit in every repetition.\n", 100*worst, at)
		}
		if len(short) > 0 {
			slices.Sort(short)
			w("- Not judged for accuracy (the generator did not offer 1.1 × the limit in every repetition): %s.\n", strings.Join(short, "; "))
		}
	}
	w("- Load average %s at the start, %s at the end on %d CPUs", r.loadStart, r.loadEnd, len(r.cpus))
	if busy := loadOver(r.loadStart, len(r.cpus)) || loadOver(r.loadEnd, len(r.cpus)); busy {
		w(": **the machine was busy** (a 1-minute load above half its CPUs): rates reached are low; CPU ns per packet holds.\n")
	} else {
		w(": quiet.\n")
	}
	for _, gb := range r.tests {
		w("- %s: `%s`.\n", gb.name, gb.result)
	}
	for _, t := range r.floodTargets() {
		w("- %s\n", t)
	}
	for _, t := range r.queuesTargets() {
		w("- %s\n", t)
	}
	w("\n")
}

// queuesTargets states issue 28's targets for every queue from
// loader.BenchmarkQueues (a veth of a queue per CPU, threaded NAPI pinned
// beside each queue's sender; the receive CPU per frame of XDP_DROP and
// of xlimit on the same flood, rounds alternated: docs/design.md §7), or
// why they are not judged.
func (r *results) queuesTargets() []string {
	if r.queuesErr != nil {
		return []string{fmt.Sprintf("Every queue live (BenchmarkQueues): not judged: %v.", r.queuesErr)}
	}
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**MISSED**"
	}
	get := func(name, unit string) (float64, bool) {
		for _, l := range r.queues {
			if v, ok := l.metrics[unit]; ok && l.name == name {
				return v, true
			}
		}
		return 0, false
	}
	// The most queues measured: every CPU's.
	most := 0
	for _, l := range r.queues {
		var q int
		if _, err := fmt.Sscanf(l.name[strings.LastIndex(l.name, "/")+1:], "queues_%d", &q); err == nil {
			most = max(most, q)
		}
	}
	var out []string
	for _, c := range []struct {
		flood, what string
		target      float64
	}{
		{"one_source", "flat out, one source", 0.85},
		{"random_sources", "the random-source flood with per_source", 0.6},
		{"random_sources_sunk", "the random-source flood with per_source, what it admits dropped at the ingress hook", 0.6},
	} {
		for q := 1; q <= most; q++ {
			name := fmt.Sprintf("%s/queues_%d", c.flood, q)
			x, ok := get(name, "of-drop-rate")
			if !ok {
				continue
			}
			lo, _ := get(name, "of-drop-rate-min")
			hi, _ := get(name, "of-drop-rate-max")
			xl, _ := get(name, "ns/op")
			drop, _ := get(name, "drop-rx-ns/pkt")
			out = append(out, fmt.Sprintf("Target (issue 28), every queue live: %s on %d queue(s) at ≥ %.0f %% of XDP_DROP's rate: %.0f %% (rounds %.0f–%.0f %%; receive CPU %.0f ns a frame against %.0f), %s.",
				c.what, q, 100*c.target, 100*x, 100*lo, 100*hi, xl, drop, met(x >= c.target)))
		}
		name := fmt.Sprintf("%s/queues_%d", c.flood, most)
		if s, ok := get(name, "scaling"); ok && most > 1 {
			ds, _ := get(name, "drop-scaling")
			out = append(out, fmt.Sprintf("Target (issue 28), every queue live: %s, rate on %d queues ≥ 0.8 × %d × one queue's: %.2f×, %s (XDP_DROP's: %.2f×).",
				c.what, most, most, s, met(s >= 0.8), ds))
		}
		if a, ok := get(name, "accuracy"); ok {
			lo, _ := get(name, "accuracy-min")
			hi, _ := get(name, "accuracy-max")
			out = append(out, fmt.Sprintf("Target (issue 28), every queue live: %s, admitted within ±1 %% of the rate with all %d queues flooded: %.4f (rounds %.4f–%.4f), %s.",
				c.what, most, a, lo, hi, met(lo >= 0.99 && hi <= 1.01)))
		}
	}
	return out
}

// minBusyCPUs is the least busy-cpus (BenchmarkXDP's *_allcpu) at which
// the all-CPU ratio is judged: the CPUs ran at once at least a quarter of
// the time on two CPUs.
const minBusyCPUs = 1.25

// floodTargets states issue 18's targets for the flood path, each met or
// MISSED by this run's figures (medians), or why it is not judged.
func (r *results) floodTargets() []string {
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**MISSED**"
	}
	var out []string
	if r.liveErr != nil {
		out = append(out, "Targets on the live flood (issue 18: flat out at ≥ 80 % of XDP_DROP's rate, CPU per packet above it ≤ 0.12 × nftables `limit`'s; "+
			"issue 28: the random-source flood at ≥ 60 % of XDP_DROP's rate): not judged, no live floods in this run. "+
			"The every-queue targets below are BenchmarkQueues', which needs no live frames.")
	}
	if ref := r.cmp[key{rcvDrop, 0}]; len(ref) > 0 {
		refRate, base := over(ref, mpps).med, over(ref, pathNS).med
		if xl := r.cmp[key{rcvXlimit, 0}]; len(xl) > 0 {
			reached, above := over(xl, mpps).med, over(xl, pathNS).med-base
			out = append(out, fmt.Sprintf("Target (issue 18): xlimit flat out at ≥ 80 %% of a bare XDP_DROP's rate: %.0f %% (%.2f of %.2f Mpps), %s.",
				100*reached/refRate, reached, refRate, met(reached >= 0.8*refRate)))
			if nft := r.cmp[key{rcvNftLimit, 0}]; len(nft) > 0 {
				nftAbove := over(nft, pathNS).med - base
				out = append(out, fmt.Sprintf("Target (issue 18): CPU per packet above XDP_DROP ≤ 0.12 × nftables `limit`'s: %.0f ns against %.0f ns, %.2f×, %s.",
					above, nftAbove, above/nftAbove, met(above <= 0.12*nftAbove)))
			}
		}
	}
	med := func(name, unit string) (float64, bool) {
		var vs []float64
		for _, l := range r.mapsLines {
			if v, ok := l.metrics[unit]; ok && l.name == name {
				vs = append(vs, v)
			}
		}
		if len(vs) == 0 {
			return 0, false
		}
		return spreadOf(vs).med, true
	}
	pass, ok1 := med("rule_pass", "ns/op")
	drop, ok2 := med("rule_drop", "ns/op")
	if ok1 && ok2 {
		out = append(out, fmt.Sprintf("Target (issue 18): BenchmarkXDP rule_drop ≤ 1.3 × rule_pass: %.0f against %.0f ns, %.2f×, %s.",
			drop, pass, drop/pass, met(drop <= 1.3*pass)))
	}
	out = append(out, r.issue28Targets(med)...)
	for _, c := range []string{"rule_pass_allcpu", "rule_drop_allcpu", "per_source_hit_allcpu"} {
		x, ok := med(c, "x-1cpu")
		if !ok {
			continue
		}
		// Judged only when the CPUs really ran at once: with busy-cpus
		// near 1 they took turns and the ratio says nothing of contention.
		if busy, ok := med(c, "busy-cpus"); ok && busy < minBusyCPUs {
			out = append(out, fmt.Sprintf("Target (issue 18): %s on all CPUs ≤ 1.1 × one CPU per packet: %.2f×, not judged: busy-cpus %.2f < %.2f, the CPUs mostly took turns.",
				c, x, busy, minBusyCPUs))
			continue
		}
		out = append(out, fmt.Sprintf("Target (issue 18): %s on all CPUs ≤ 1.1 × one CPU per packet: %.2f×, %s.", c, x, met(x <= 1.1)))
	}
	return out
}

// loadOver is whether a /proc/loadavg triple's 1-minute figure is above
// half the CPUs.
func loadOver(triple string, cpus int) bool {
	var one float64
	if _, err := fmt.Sscanf(triple, "%g", &one); err != nil {
		return false
	}
	return one > float64(cpus)/2
}

// controlSection is tests/' benchmarks: their own tables as they printed
// them, with their result lines.
func (r *results) controlSection(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("## 4. Control: adaptive scenario and paced queue\n\n")
	switch {
	case r.c.skipTests:
		w("Skipped (-skip-tests-bench).\n\n")
		return
	case r.testsErr != nil:
		w("Failed: %v\n\n```\n%s```\n\n", r.testsErr, r.testsRaw)
		return
	}
	w("`go test -v -run '^$' -bench '%s' -benchtime 1x ./tests/` with the daemon of this run (tests/scenario_test.go and "+
		"tests/queue_test.go document them); each benchmark's tables as it printed them.\n\n", r.c.testsBench)
	for _, gb := range r.tests {
		w("### %s\n\n%s\n\n`%s`\n\n", strings.TrimPrefix(gb.name, "Benchmark"), strings.TrimSpace(gb.output), gb.result)
		if strings.TrimSpace(gb.logs) != "" {
			w("<details><summary>its log</summary>\n\n```\n%s```\n</details>\n\n", gb.logs)
		}
	}
}

// issue28Targets are issue 28's targets, from the tables above; med reads
// a BenchmarkXDP (or BenchmarkCookie/...) case's median metric.
func (r *results) issue28Targets(med func(name, unit string) (float64, bool)) []string {
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**MISSED**"
	}
	var out []string
	if ref := r.rnd[rcvDrop]; len(ref) > 0 {
		if xl := r.rnd[rcvXlimit]; len(xl) > 0 {
			a, b := over(xl, mpps).med, over(ref, mpps).med
			out = append(out, fmt.Sprintf("Target (issue 28): the random-source flood with per_source at ≥ 60 %% of XDP_DROP's rate on the same traffic: %.0f %% (%.2f of %.2f Mpps), %s.",
				100*a/b, a, b, met(a >= 0.6*b)))
		}
	}
	if v, ok := med("per_source_miss", "ns/op"); ok {
		out = append(out, fmt.Sprintf("Target (issue 28): BenchmarkXDP per_source_miss ≤ 250 ns: %.0f ns, %s.", v, met(v <= 250)))
	}
	for _, c := range []struct{ name, what string }{
		{"sources_64k", "65536 sources, each tracked and over its limit"},
		{"sources_1m", "2^20 sources, 8 times the table"},
	} {
		name := "BenchmarkRandomSources/" + c.name
		if x, ok := med(name, "of-bare-rate"); ok {
			ns, _ := med(name, "over-bare-ns/op")
			out = append(out, fmt.Sprintf("Random sources without live frames (%s: %s; one CPU, no interface): xlimit keeps %.0f %% of XDP_DROP's rate, %.0f ns a packet above it (not the target's measure: the live flood's 60 %% has the interface's cost on both sides).",
				name, c.what, 100*x, ns))
		}
	}
	if ref := r.cmp[key{rcvDrop, 0}]; len(ref) > 0 {
		if xl := r.cmp[key{rcvXlimit, 0}]; len(xl) > 0 {
			a, b := over(xl, mpps).med, over(ref, mpps).med
			out = append(out, fmt.Sprintf("Target (issue 28): xlimit flat out, one source, at ≥ 85 %% of XDP_DROP's rate: %.0f %% (%.2f of %.2f Mpps), %s.",
				100*a/b, a, b, met(a >= 0.85*b)))
		}
	}
	if n := len(r.cpus); n > 0 {
		if xl := r.mq[key{rcvXlimit, float64(n)}]; len(xl) > 0 {
			x := over(xl, func(p point) float64 { return p.rate(p.Admitted) / r.c.rate }).med
			out = append(out, fmt.Sprintf("Target (issue 28): admitted within ±1 %% of the rate with all %d queues flooded: %.4f, %s.",
				n, x, met(x >= 0.99 && x <= 1.01)))
			if one := over(r.mq[key{rcvXlimit, 1}], mpps).med; one > 0 && n > 1 {
				s := over(xl, mpps).med / (float64(n) * one)
				out = append(out, fmt.Sprintf("Target (issue 28): xlimit's rate on %d queues ≥ 0.8 × %d × its rate on one: %.2f×, %s (XDP_DROP's: %.2f×).",
					n, n, s, met(s >= 0.8), over(r.mq[key{rcvDrop, float64(n)}], mpps).med/(float64(n)*over(r.mq[key{rcvDrop, 1}], mpps).med)))
			}
		}
	}
	gen, ok1 := med("BenchmarkCookie/gen_ipv4", "over-bare-ns/op")
	ans, ok2 := med("BenchmarkCookie/answer_ipv4", "over-bare-ns/op")
	rule, ok3 := med("BenchmarkCookie/rule_alone", "over-bare-ns/op")
	if ok1 && ok2 && ok3 && ans > 0 {
		out = append(out, fmt.Sprintf("SYN cookies (BPF_PROG_TEST_RUN, one SYN per syscall): an answer costs %.0f ns above a bare XDP_DROP, "+
			"of which the kernel's cookie (bpf_tcp_raw_gen_syncookie_ipv4 alone) %.0f ns and the rest %.0f ns; the rule alone drops it for %.0f ns; "+
			"one core answers at most %.2f M SYNs/s in the program (no transmit; the live CPU per SYN is section 4's BenchmarkSynCookies).",
			ans, gen, ans-gen, rule, 1e3/ans))
		if bare, ok := med("BenchmarkCookie/answer_ipv4_noopts", "over-bare-ns/op"); ok && bare > 0 {
			out = append(out, fmt.Sprintf("SYN cookies, a SYN without options (a flood's usual shape, answered with the MSS alone): %.0f ns above a bare XDP_DROP, %.2f M answers/s per core in the program.",
				bare, 1e3/bare))
		}
		gen6, ok1 := med("BenchmarkCookie/gen_ipv6", "over-bare-ns/op")
		ans6, ok2 := med("BenchmarkCookie/answer_ipv6", "over-bare-ns/op")
		if ok1 && ok2 && ans6 > 0 {
			out = append(out, fmt.Sprintf("SYN cookies over IPv6: an answer costs %.0f ns above a bare XDP_DROP, of which the kernel's cookie "+
				"(bpf_tcp_raw_gen_syncookie_ipv6 alone) %.0f ns and the rest %.0f ns; one core answers at most %.2f M SYNs/s in the program.",
				ans6, gen6, ans6-gen6, 1e3/ans6))
		}
	}
	for _, c := range []struct{ name, what string }{
		{"ipv4", "IPv4, Linux's options"},
		{"ipv4_noopts", "IPv4 without options"},
		{"ipv6", "IPv6, Linux's options"},
	} {
		name := "BenchmarkCookieRepeat/" + c.name
		if rate, ok := med(name, "answers/s-per-core"); ok {
			over, _ := med(name, "over-drop-ns/op")
			out = append(out, fmt.Sprintf("SYN cookies without a syscall per SYN (%s: %s; the SYN put back before each repeat): one core answers %.2f M SYNs/s in the program, %.0f ns a SYN above XDP_DROP behind the same restore.",
				name, c.what, rate/1e6, over))
		}
	}
	v6, ok1 := med("ipv6_ext_nofrag", "ns/op")
	v4, ok2 := med("rule_pass", "ns/op")
	v6p, ok3 := med("ipv6_plain", "ns/op")
	if ok1 && ok2 && ok3 {
		out = append(out, fmt.Sprintf("IPv6 (BenchmarkXDP): three extension headers %.0f ns, none %.0f ns, IPv4 %.0f ns: the headers cost %.0f ns, IPv6 itself %.0f ns over IPv4.",
			v6, v6p, v4, v6-v6p, v6p-v4))
	}
	f6, ok1 := med("ipv6_ext", "ns/op")
	f4, ok2 := med("ipv4_first_frag", "ns/op")
	if ok1 && ok2 {
		out = append(out, fmt.Sprintf("First fragments (BenchmarkXDP): IPv6 with four extension headers %.0f ns, IPv4 %.0f ns (both recorded in xl_frags).", f6, f4))
	}
	return out
}
