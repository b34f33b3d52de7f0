package config

import (
	"fmt"
	"strings"
	"testing"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// TestLimits: a file that would not fit the kernel's maps is rejected at
// check time with the position of the value that crosses the limit.
func TestLimits(t *testing.T) {
	// n distinct IPv4 /32s as YAML list items, one a line.
	hosts := func(n, from int) string {
		var b strings.Builder
		for i := range n {
			a := from + i
			fmt.Fprintf(&b, "  - 10.%d.%d.%d\n", a>>16&255, a>>8&255, a&255)
		}
		return b.String()
	}
	rule := "rules:\n  - name: r\n    protocol: udp\n    rate: 10\n"
	cases := []struct {
		name string
		doc  string
		line int
		want string // substring of the one error; "" for a valid file
	}{
		{"a full IPv4 table", "allow:\n" + hosts(MaxPrefixes, 0) + rule, 0, ""},
		{"one prefix too many", "allow:\n" + hosts(MaxPrefixes+1, 0) + rule, MaxPrefixes + 2,
			"allow[65536]: more than 65536 distinct IPv4 prefixes in allow, deny and sources together"},
		{"duplicates count once", "allow:\n" + hosts(MaxPrefixes, 0) + "deny:\n" + hosts(10, 0) + rule, 0, ""},
		{"allow and deny together", "allow:\n" + hosts(MaxPrefixes-1, 0) + "deny:\n" + hosts(2, MaxPrefixes) + rule,
			MaxPrefixes + 3, "deny[1]: more than 65536 distinct IPv4 prefixes"},
		{"sources count too", "allow:\n" + hosts(MaxPrefixes, 0) + rule + "    sources: [\"192.0.2.0/24\"]\n",
			MaxPrefixes + 6, "rules[0].sources[0]: more than 65536 distinct IPv4 prefixes"},
		{"sources shared through a merge key count once", "allow:\n" + hosts(MaxPrefixes-1, 0) +
			"rules:\n  - &base {name: a, protocol: udp, rate: 10, sources: [\"192.0.2.0/24\"]}\n  - <<: *base\n    name: b\n", 0, ""},
		{"and one more is too many", "allow:\n" + hosts(MaxPrefixes-1, 0) +
			"rules:\n  - &base {name: a, protocol: udp, rate: 10, sources: [\"192.0.2.0/24\"]}\n  - <<: *base\n    name: b\n    sources: [\"192.0.3.0/24\"]\n",
			MaxPrefixes + 5, "rules[1].sources[0]: more than 65536 distinct IPv4 prefixes"},
		{"IPv6 is a table of its own", "allow:\n" + hosts(MaxPrefixes, 0) + "deny: [\"2001:db8::/32\"]\n" + rule, 0, ""},
		{"largest table that fits", "source_table_size: 16000000\n" + rule, 0, ""},
		{"table over the memory ceiling", "source_table_size: 33554432\n" + rule, 1,
			"source_table_size: the per-source table of 33554432 entries and the prefix tables need an estimated 2048 MiB of kernel memory per interface, more than the ceiling of 1024 MiB: at most 16777216 entries fit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("rules.yaml", []byte(c.doc))
			errs := Errors(err)
			if c.want == "" {
				if err != nil {
					t.Fatalf("want a valid file, got %v", err)
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("want one error, got %v", err)
			}
			want := fmt.Sprintf("rules.yaml:%d: %s", c.line, c.want)
			if got := errs[0].Error(); !strings.HasPrefix(got, want) {
				t.Errorf("got  %s\nwant %s…", got, want)
			}
		})
	}
}

func TestLimitsMatchDataplane(t *testing.T) {
	if MaxRules != dataplane.MaxRules || MaxSourceTableSize != dataplane.MaxSourceTableSize ||
		DefaultSourceTableSize != dataplane.DefaultSourceTableSize || MaxPrefixes != dataplane.MaxPrefixes {
		t.Error("config's limits are not dataplane's")
	}
}
