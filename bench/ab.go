//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
)

// abFlat is the -ab mode: XDP_DROP and each of several xlimit binaries
// flat out against one limited port, in one lab, the receivers rotated
// every repetition, so that two builds of the drop path are compared in
// the same run (make bench's full report compares one build with the
// other receivers). It prints a table to w and writes no report.
//
// With -ab-random, the traffic is the random-source flood (65536
// sources) against a per-source limit, as in the report's random-source
// table, XDP_DROP seeing the same random sources.
func abFlat(ctx context.Context, e *env, c config, bins []string, w io.Writer) error {
	limit := limitSpec{rate: c.rate, burst: max(5, c.rate/10)}
	if c.abRandom {
		limit = limitSpec{rate: c.srcRate, burst: srcBurst(c.srcRate), perSource: true}
	}
	labels := append([]string{rcvDrop}, bins...)
	pts := map[string][]point{}
	for rep := range c.reps {
		for _, label := range rotate(labels, rep) {
			kind := rcvXlimit
			if label == rcvDrop {
				kind = rcvDrop
			} else {
				e.xlimitBin = label
			}
			p, err := e.flatOnce(ctx, kind, limit, e.cpus, c.abRandom, c.warm, c.window)
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			pts[label] = append(pts[label], p)
			progress("ab %d/%d %s: offered %.2f Mpps, path %.0f ns/pkt, dropped %.2f Mpps, admitted %.0f/s",
				rep+1, c.reps, label, p.rate(p.Offered)/1e6, p.pathNS(), p.rate(p.Dropped)/1e6, p.rate(p.Admitted))
		}
	}
	ref := pts[rcvDrop]
	refRate := median(ref, func(p point) float64 { return p.rate(p.Offered) })
	refPath := median(ref, point.pathNS)
	// The best of the repetitions too: on a shared machine the noise only
	// ever adds time, so the fastest run is the one least disturbed.
	refBest := values(ref, func(p point) float64 { return p.rate(p.Offered) })
	refMin := values(ref, point.pathNS)[0]
	fmt.Fprintf(w, "| receiver | offered Mpps, median (min–max) | ÷ XDP_DROP's | CPU ns/packet | above XDP_DROP | best: ÷ XDP_DROP's best | best: above XDP_DROP's best |\n|---|---|---|---|---|---|---|\n")
	for _, label := range labels {
		ps := pts[label]
		rates := values(ps, func(p point) float64 { return p.rate(p.Offered) / 1e6 })
		paths := values(ps, point.pathNS)
		path := median(ps, point.pathNS)
		fmt.Fprintf(w, "| %s | %.2f (%.2f–%.2f) | %.0f %% | %.0f | %.0f | %.0f %% | %.0f |\n", label,
			rates[len(rates)/2], rates[0], rates[len(rates)-1], 100*rates[len(rates)/2]*1e6/refRate, path, path-refPath,
			100*rates[len(rates)-1]*1e6/refBest[len(refBest)-1], paths[0]-refMin)
	}
	return nil
}

// values returns f of every point, sorted.
func values(ps []point, f func(point) float64) []float64 {
	vs := make([]float64, len(ps))
	for i, p := range ps {
		vs[i] = f(p)
	}
	sort.Float64s(vs)
	return vs
}

func median(ps []point, f func(point) float64) float64 {
	vs := values(ps, f)
	if len(vs) == 0 {
		return 0
	}
	return vs[len(vs)/2]
}

// splitBins parses -ab's comma-separated list.
func splitBins(s string) []string {
	return slices.DeleteFunc(strings.Split(s, ","), func(b string) bool { return b == "" })
}
