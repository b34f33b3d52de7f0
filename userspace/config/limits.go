package config

import (
	"fmt"
	"net/netip"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Capacities of the kernel's maps that a rules file fills or sizes. The
// numbers live in userspace/dataplane, next to the other constants of the
// data plane's contract, and the maps package checks them against the
// compiled program; MaxRules and the source_table_size bounds in config.go
// are the same constants.
const (
	// MaxPrefixes is how many distinct prefixes of one family allow, deny
	// and every rule's sources may hold together.
	MaxPrefixes = dataplane.MaxPrefixes
	// MaxMapMemory is the ceiling on the estimated kernel memory of the
	// maps a rules file sizes (the per-source table and the prefix tries),
	// per interface.
	MaxMapMemory = dataplane.MaxMapMemory
)

// checkLimits rejects a file that decodes but would not fit the kernel's
// maps: more distinct prefixes of a family than the prefix trie holds, or
// maps that would need more memory than MaxMapMemory. (More than MaxRules
// rules and a source_table_size out of range are reported where they are
// decoded.)
func (p *parser) checkLimits(m *mapping, c *Config) {
	if p.stopped {
		return
	}
	counts := map[bool]int{} // is IPv4 → distinct prefixes
	seen := map[netip.Prefix]bool{}
	reported := map[bool]bool{}
	count := func(pfx netip.Prefix, at loc) {
		pfx = pfx.Masked()
		if seen[pfx] {
			return
		}
		seen[pfx] = true
		v4 := pfx.Addr().Is4()
		counts[v4]++
		if counts[v4] > MaxPrefixes && !reported[v4] {
			reported[v4] = true
			family := "IPv6"
			if v4 {
				family = "IPv4"
			}
			p.errorf(at, "more than %d distinct %s prefixes in allow, deny and sources together: the kernel's prefix table holds %d per family",
				MaxPrefixes, family, MaxPrefixes)
		}
	}
	for _, key := range []string{"allow", "deny"} {
		for _, it := range prefixItems(p, m.fields[key].val, sub(m.path, key)) {
			count(it.pfx, it.at)
		}
	}
	if g := c.Management; g != nil {
		for _, pfx := range g.Sources {
			count(pfx, m.at("management"))
		}
	}
	// Rules' sources as decoded (merge keys included), located at their
	// list items when the rule's own mapping holds them.
	var ruleNodes []*yaml.Node
	if f, ok := m.fields["rules"]; ok {
		if rules := p.deref(f.val); rules.Kind == yaml.SequenceNode {
			ruleNodes = rules.Content
		}
	}
	counted := map[*netip.Prefix]bool{} // the decoded lists counted, by their first item
	for _, r := range c.Rules {
		if len(r.Sources) > 0 {
			// Rules that share a list through an alias share its
			// slice (prefixes): it is counted once.
			if counted[&r.Sources[0]] {
				continue
			}
			counted[&r.Sources[0]] = true
		}
		i := slices.IndexFunc(ruleNodes, func(n *yaml.Node) bool { return n.Line == r.Line })
		at := loc{nil, sub(m.path, "rules")}
		var direct []prefixItem
		if i >= 0 {
			at = loc{ruleNodes[i], sub(index(at.path, i), "sources")}
			if rule := p.deref(ruleNodes[i]); rule.Kind == yaml.MappingNode {
				for j := 0; j+1 < len(rule.Content); j += 2 {
					if rule.Content[j].Value == "sources" {
						direct = prefixItems(p, rule.Content[j+1], at.path)
					}
				}
			}
		}
		if len(direct) > 0 && len(direct) == len(r.Sources) {
			for _, it := range direct {
				count(it.pfx, it.at)
			}
			continue
		}
		for _, pfx := range r.Sources {
			count(pfx, at)
		}
	}

	need := dataplane.ConfigMapBytes(c.SourceTableSize, min(counts[true], MaxPrefixes), min(counts[false], MaxPrefixes))
	if need > MaxMapMemory {
		fit := 0
		for lo, hi := 1, dataplane.MaxSourceTableSize; lo <= hi; {
			mid := (lo + hi) / 2
			if dataplane.ConfigMapBytes(mid, min(counts[true], MaxPrefixes), min(counts[false], MaxPrefixes)) <= MaxMapMemory {
				fit, lo = mid, mid+1
			} else {
				hi = mid - 1
			}
		}
		p.errorf(m.at("source_table_size"), "the per-source table of %d entries and the prefix tables need an estimated %d MiB of kernel memory per interface, more than the ceiling of %d MiB: at most %d entries fit",
			c.SourceTableSize, need>>20, MaxMapMemory>>20, fit)
	}
}

type prefixItem struct {
	pfx netip.Prefix
	at  loc
}

// prefixItems returns the valid prefixes of a list node with their
// locations (invalid items were reported when the list was decoded).
func prefixItems(p *parser, raw *yaml.Node, path string) []prefixItem {
	if raw == nil {
		return nil
	}
	n := p.deref(raw)
	if n.Kind != yaml.SequenceNode {
		return nil
	}
	var out []prefixItem
	for i, item := range n.Content {
		v := p.deref(item)
		if v.Kind != yaml.ScalarNode {
			continue
		}
		if pfx, problem := parsePrefix(v.Value); problem == "" {
			out = append(out, prefixItem{pfx, loc{item, fmt.Sprintf("%s[%d]", path, i)}})
		}
	}
	return out
}
