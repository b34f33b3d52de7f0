package corpus

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Want returns the counter deltas that the case's frame (not its Pre
// frames) must cause, slot by slot: one packet of len(Frame) bytes in the
// global slot and in the slot of each rule of Rules. slot maps a rule name
// to its slot.
func (c *Case) Want(slot func(name string) int) [dataplane.CounterSlots]dataplane.Counters {
	var want [dataplane.CounterSlots]dataplane.Counters
	v := dataplane.VerdictDrop
	if c.Pass {
		v = dataplane.VerdictPass
	}
	want[dataplane.GlobalSlot] = One(v, c.Reason, len(c.Frame))
	for _, r := range c.Rules {
		want[slot(r.Name)] = One(r.Verdict, r.Reason, len(c.Frame))
	}
	return want
}

// One is the counters of one packet of n bytes with a verdict and reason.
func One(v dataplane.Verdict, r dataplane.Reason, n int) dataplane.Counters {
	var c dataplane.Counters
	c.Packets[v] = 1
	c.Bytes[v] = uint64(n)
	c.Reasons[r] = 1
	return c
}

// RulesFile renders a spec as a rules file (docs/config.md) that the daemon
// compiles back into the same spec, so the live tests run the corpus
// against the real daemon. Only what Specs uses is rendered; per-source
// limits are not.
func RulesFile(s *dataplane.Spec) string {
	var b strings.Builder
	if s.MalformedPass {
		b.WriteString("malformed: pass\n")
	}
	list := func(key string, items []string) {
		if len(items) == 0 {
			return
		}
		fmt.Fprintf(&b, "%s: [%s]\n", key, strings.Join(items, ", "))
	}
	quoted := func(xs []string) []string {
		out := make([]string, len(xs))
		for i, x := range xs {
			out[i] = fmt.Sprintf("%q", x)
		}
		return out
	}
	prefixes := func(ps []netip.Prefix) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.String())
		}
		return quoted(out)
	}
	list("allow", prefixes(s.Allow))
	list("deny", prefixes(s.Deny))
	b.WriteString("rules:\n")
	for _, r := range s.Rules {
		fmt.Fprintf(&b, "  - name: %s\n    protocol: %s\n", r.Name, r.Protocol)
		if len(r.Ports) > 0 {
			var ps []string
			for _, p := range r.Ports {
				if p.Lo == p.Hi {
					ps = append(ps, fmt.Sprint(p.Lo))
				} else {
					ps = append(ps, fmt.Sprintf("%d-%d", p.Lo, p.Hi))
				}
			}
			fmt.Fprintf(&b, "    ports: [%s]\n", strings.Join(quoted(ps), ", "))
		}
		if r.SynOnly {
			b.WriteString("    syn_only: true\n")
		}
		if len(r.Sources) > 0 {
			fmt.Fprintf(&b, "    sources: [%s]\n", strings.Join(prefixes(r.Sources), ", "))
		}
		if r.Bytes {
			b.WriteString("    unit: bytes\n")
		}
		fmt.Fprintf(&b, "    rate: %v\n    burst: %v\n", r.Rate, r.Burst)
		if r.Shadow {
			b.WriteString("    shadow: true\n")
		}
		if r.Fragments != "" {
			fmt.Fprintf(&b, "    fragments: %s\n", r.Fragments)
		}
	}
	return b.String()
}
