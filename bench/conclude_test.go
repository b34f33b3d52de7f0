//go:build linux

package main

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// TestQueuesTargets reads BenchmarkQueues' output as make bench stores it
// (testdata: a run at a36ac8d) and states each target with its verdict.
func TestQueuesTargets(t *testing.T) {
	out, err := os.ReadFile("testdata/queues-a36ac8d.txt")
	if err != nil {
		t.Fatal(err)
	}
	r := &results{queues: parseBench(out, "BenchmarkQueues/")}
	got := r.queuesTargets()
	want := []struct{ has, verdict string }{
		{"flat out, one source on 1 queue(s) at ≥ 85 % of XDP_DROP's rate: 87 % (rounds 57–115 %", "met"},
		{"flat out, one source on 2 queue(s) at ≥ 85 % of XDP_DROP's rate: 87 %", "met"},
		{"flat out, one source, rate on 2 queues ≥ 0.8 × 2 × one queue's: 0.91×", "met"},
		{"flat out, one source, admitted within ±1 % of the rate with all 2 queues flooded: 1.0000 (rounds 0.9999–1.0000)", "met"},
		{"per_source on 1 queue(s) at ≥ 60 % of XDP_DROP's rate: 52 %", "**MISSED**"},
		{"per_source on 2 queue(s) at ≥ 60 % of XDP_DROP's rate: 62 %", "met"},
		{"per_source, rate on 2 queues ≥ 0.8 × 2 × one queue's: 1.04×", "met"},
	}
	if len(got) != len(want) {
		t.Errorf("%d targets, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i, w := range want {
		if i >= len(got) {
			break
		}
		if !strings.Contains(got[i], w.has) || !strings.HasSuffix(got[i], ", "+w.verdict+".") &&
			!strings.Contains(got[i], ", "+w.verdict+" (") {
			t.Errorf("target %d:\n%s\nwant it to hold %q and say %s", i, got[i], w.has, w.verdict)
		}
	}

	r = &results{queuesErr: errors.New("read BenchmarkQueues' output: no such file")}
	if got := r.queuesTargets(); len(got) != 1 || !strings.Contains(got[0], "not judged: read BenchmarkQueues' output") {
		t.Errorf("without the output: %q", got)
	}
}

// TestReportWithoutLiveFrames: on a kernel that refuses live frames the
// report still has every other section, says why the floods did not run,
// and judges none of their targets (it used to stop before measuring
// anything).
func TestReportWithoutLiveFrames(t *testing.T) {
	out, err := os.ReadFile("testdata/queues-a36ac8d.txt")
	if err != nil {
		t.Fatal(err)
	}
	r := newResults(config{reps: 3, rate: 10000, skipMaps: true, skipFake: true, skipTests: true})
	r.queues = parseBench(out, "BenchmarkQueues/")
	r.liveErr = errors.New("the floods' generator cannot run on this kernel: operation not permitted")
	r.cpus = []int{0, 1}
	r.finish()
	md := r.markdown()
	for _, want := range []string{
		"## 2. Live flood\n\nNot run: the floods' generator cannot run on this kernel: operation not permitted.",
		"### Live traffic\n\nNot run: no live floods",
		"- Live floods: not run (the floods' generator",
		"random-source flood at ≥ 60 % of XDP_DROP's rate): not judged, no live floods in this run.",
		"per_source on 2 queue(s) at ≥ 60 % of XDP_DROP's rate: 62 %",
		"## Conclusions of this run",
		"## Method",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	for _, not := range []string{"### The generator", "### Comparison flat out", "### Random sources", "Target (issue 18): xlimit flat out"} {
		if strings.Contains(md, not) {
			t.Errorf("the report has %q without live floods", not)
		}
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("the report:\n%s", md)
	}
}
