package main

import (
	"strings"
	"testing"
)

// TestDaemonNoCycle keeps the daemon made of parts (docs/design.md §3): no
// two of its files use each other, directly or through others. A method
// of one part that reaches into another part's fields, or a part that
// calls back into daemon.go, puts files on a cycle and fails here, naming
// what each arrow on it uses.
func TestDaemonNoCycle(t *testing.T) {
	r, err := analyze("../../daemon")
	if err != nil {
		t.Fatal(err)
	}
	if r.files < 10 || len(r.edges) < 20 {
		t.Fatalf("read %d files and %d arrows of daemon/: not the package", r.files, len(r.edges))
	}
	if n := r.onCycles(); n > 0 {
		var cyc []string
		for _, l := range r.lines(true) {
			if strings.Contains(l, "(cycle)") {
				cyc = append(cyc, l)
			}
		}
		t.Errorf("daemon/: %d arrows on cycles among its files (largest %d files); give the part what it needs where daemon.go wires it instead:\n%s",
			n, r.largest, strings.Join(cyc, "\n"))
	}
}

// TestAnalyze: the count on packages whose arrows are known, one with a
// cycle (a.go and b.go use each other; c.go hangs off b.go), one layered.
func TestAnalyze(t *testing.T) {
	for _, tc := range []struct {
		dir                     string
		files, arrows, onCycles int
		largest                 int
	}{
		{"testdata/cycle", 3, 3, 2, 2},
		{"testdata/layered", 3, 3, 0, 1},
	} {
		r, err := analyze(tc.dir)
		if err != nil {
			t.Fatal(err)
		}
		if r.files != tc.files || len(r.edges) != tc.arrows || r.onCycles() != tc.onCycles || r.largest != tc.largest {
			t.Errorf("%s: %d files, %d arrows, %d on cycles, largest %d; want %d, %d, %d, %d\n%s", tc.dir,
				r.files, len(r.edges), r.onCycles(), r.largest, tc.files, tc.arrows, tc.onCycles, tc.largest, strings.Join(r.lines(true), "\n"))
		}
	}
}
