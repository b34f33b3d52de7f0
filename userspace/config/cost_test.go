package config

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// allocated is how many bytes f allocates on the heap.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestParseCost: a document is bounded by what it costs to parse, not by
// its bytes alone (issue 41, M2). Flow-style YAML costs about 100 bytes
// of heap per byte; a few MiB of it, under the 16 MiB byte limit, took
// more than a daemon's whole memory. Such a document is refused before
// the YAML parser builds its tree, in little more memory than its bytes;
// the largest valid documents (both prefix tables full) still parse.
func TestParseCost(t *testing.T) {
	flow := func(n int) []byte { // rules: [a, a, a, …]: two bytes a node
		var b bytes.Buffer
		b.WriteString("rules: [")
		b.WriteString(strings.Repeat("a,", n))
		b.WriteString("a]\n")
		return b.Bytes()
	}
	for _, c := range []struct {
		name string
		doc  []byte
	}{
		{"flow list of 3 MiB", flow(3 << 19)},
		{"nested lists", []byte("rules: " + strings.Repeat("[", 1<<20) + strings.Repeat("]", 1<<20) + "\n")},
		{"block list of nulls", []byte("rules:\n" + strings.Repeat("-\n", 1<<20))},
		{"explicit null keys", []byte("rules:\n  " + strings.Repeat("?\n  ", 1<<20))},
		{"empty flow values", []byte("rules: {" + strings.Repeat("a: ,", 1<<19) + "}\n")},
	} {
		t.Run(c.name, func(t *testing.T) {
			var err error
			got := allocated(func() { _, err = Parse("big.yaml", c.doc) })
			if err == nil || !strings.Contains(err.Error(), "YAML nodes") {
				t.Errorf("Parse of %d bytes: want the node limit's error, got %.200v", len(c.doc), err)
			}
			if limit := uint64(len(c.doc)) + 1<<20; got > limit {
				t.Errorf("Parse of %d bytes allocated %d MiB: more than %d MiB", len(c.doc), got>>20, limit>>20)
			}
		})
	}

	// The largest valid document: both prefix tables full, block and flow.
	var b strings.Builder
	b.WriteString("allow:\n")
	for i := range MaxPrefixes {
		fmt.Fprintf(&b, "  - 10.%d.%d.%d  # host %d\n", i>>16&255, i>>8&255, i&255, i)
	}
	b.WriteString("deny: [")
	for i := range MaxPrefixes {
		fmt.Fprintf(&b, "\"2001:db8::%x:%x/128\", ", i>>8, i&255)
	}
	b.WriteString("]\nrules:\n")
	for i := range MaxRules {
		fmt.Fprintf(&b, "  - {name: r%d, protocol: tcp, ports: [80, 443, 8000-8100], rate: 100, burst: 200}\n", i)
	}
	if _, err := Parse("largest.yaml", []byte(b.String())); err != nil {
		t.Fatalf("the largest valid document: %.300v", err)
	}
}

// BenchmarkParseAtNodeLimit: what the costliest documents just under
// MaxDocumentNodes take to parse (B/op bounds the peak heap: issue 41,
// M2; the DaemonSet's memory limit is 256 MiB).
func BenchmarkParseAtNodeLimit(b *testing.B) {
	const n = MaxDocumentNodes / 2
	for _, c := range []struct {
		name string
		doc  string
	}{
		{"flow list", "rules: [" + strings.Repeat("a,", n-10) + "a]\n"},
		{"block nulls", "rules:\n" + strings.Repeat("-\n", 2*n-10)},
		{"explicit keys", "rules:\n  " + strings.Repeat("?\n  ", n-10)},
		{"empty values", "rules: {" + strings.Repeat("a: ,", n*2/3-10) + "}\n"},
		{"nested one-item lists", "rules:\n" + strings.Repeat("- [a]\n", n*2/3-10)},
	} {
		if got := countNodes([]byte(c.doc), MaxDocumentNodes); got.over(MaxDocumentNodes) {
			b.Fatalf("%s: over the limit", c.name)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.doc)))
			for b.Loop() {
				Parse("big.yaml", []byte(c.doc)) //nolint:errcheck // the cost is measured, not the verdict
			}
		})
	}
}
