package daemon

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// sharedPrefixesDoc is a rules document of rules rules that all name one
// list of prefixes /24s through a YAML alias: issue 16's document that
// `xlimit check` compiled for minutes.
func sharedPrefixesDoc(rules, prefixes int) []byte {
	var b strings.Builder
	b.WriteString("interfaces: [eth0]\nrules:\n")
	for r := range rules {
		fmt.Fprintf(&b, "  - name: r%d\n    protocol: tcp\n    ports: [%d]\n    rate: 1000\n", r, 1000+r)
		if r > 0 {
			b.WriteString("    sources: *shared\n")
			continue
		}
		b.WriteString("    sources: &shared\n")
		for i := range prefixes {
			fmt.Fprintf(&b, "      - 10.%d.%d.0/24\n", i>>8&255, i&255)
		}
	}
	return []byte(b.String())
}

// compileDoc is what `xlimit check` and every reload do to a document
// before the kernel: parse and validate, translate, compile.
func compileDoc(tb testing.TB, doc []byte) *dataplane.Plan {
	cfg, err := config.Parse("shared.yaml", doc)
	if err != nil {
		tb.Fatal(err)
	}
	p, err := dataplane.Compile(Translate(cfg).Dataplane, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// BenchmarkCompileSharedPrefixes compiles 64 rules × 65 536 shared
// prefixes (the target: under a second, docs/robustness.md), and the same
// document with 1 rule, to show that the cost does not grow with the
// rules that share the list (make bench prints both and their ratio).
func BenchmarkCompileSharedPrefixes(b *testing.B) {
	for _, rules := range []int{1, 64} {
		doc := sharedPrefixesDoc(rules, 65536)
		b.Run(fmt.Sprintf("rules=%d/prefixes=65536", rules), func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				compileDoc(b, doc)
			}
		})
	}
}

// TestCompileSharedPrefixes checks the plan of rules that share a list:
// every rule matches every prefix of it, whatever the sharing.
func TestCompileSharedPrefixes(t *testing.T) {
	p := compileDoc(t, sharedPrefixesDoc(64, 300))
	if len(p.Prefix4) != 300 {
		t.Fatalf("%d prefixes in the plan, want 300", len(p.Prefix4))
	}
	all := ^uint64(0)
	for _, e := range p.Prefix4 {
		if e.Rules != all {
			t.Fatalf("%v: rules %b, want all 64", e.Prefix, e.Rules)
		}
	}
	if e := p.Lookup(netip.MustParseAddr("10.1.2.3")); e == nil || e.Rules != all {
		t.Fatalf("10.1.2.3: entry %+v", e)
	}
}
