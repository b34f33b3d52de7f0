package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/xlimit/xlimit/userspace/dataplane"
	"go.yaml.in/yaml/v3"
)

// port decodes one item of a ports list: an integer (80) or a string
// holding a port ("443") or an inclusive range ("8000-8100").
func (p *parser) port(raw *yaml.Node, path string) (dataplane.PortRange, bool) {
	at := loc{raw, path}
	n := p.deref(raw)
	if n.Kind == yaml.ScalarNode && n.ShortTag() == tagInt {
		var v int64
		if err := n.Decode(&v); err != nil || v < 1 || v > 65535 {
			p.errorf(at, "port %s is out of range 1-65535", n.Value)
			return dataplane.PortRange{}, false
		}
		return dataplane.PortRange{Lo: uint16(v), Hi: uint16(v)}, true
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != tagStr {
		p.errorf(at, "expected a port (80) or a range (\"8000-8100\"), got %s", describe(n))
		return dataplane.PortRange{}, false
	}
	pr, problem := parsePortRange(n.Value)
	if problem != "" {
		p.errorf(at, "%s", problem)
		return dataplane.PortRange{}, false
	}
	return pr, true
}

// parsePortRange parses "443" or "8000-8100" and returns a problem text
// when s is not valid.
func parsePortRange(s string) (dataplane.PortRange, string) {
	text := strings.TrimSpace(s)
	if text == "" {
		return dataplane.PortRange{}, "empty port: expected a port (80) or a range (\"8000-8100\")"
	}
	loText, hiText, isRange := strings.Cut(text, "-")
	loText, hiText = strings.TrimSpace(loText), strings.TrimSpace(hiText)
	if isRange && (loText == "" || hiText == "") {
		return dataplane.PortRange{}, fmt.Sprintf("empty range %s: a range needs both ends, as in \"8000-8100\"", quote(s))
	}
	lo, problem := parsePort(loText)
	if problem != "" {
		return dataplane.PortRange{}, problem
	}
	if !isRange {
		return dataplane.PortRange{Lo: lo, Hi: lo}, ""
	}
	hi, problem := parsePort(hiText)
	if problem != "" {
		return dataplane.PortRange{}, problem
	}
	if lo > hi {
		return dataplane.PortRange{}, fmt.Sprintf("reversed range \"%d-%d\" (did you mean \"%d-%d\"?)", lo, hi, hi, lo)
	}
	return dataplane.PortRange{Lo: lo, Hi: hi}, ""
}

func parsePort(s string) (uint16, string) {
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, fmt.Sprintf("%s is not a port number", quote(s))
		}
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil || v < 1 || v > 65535 {
		return 0, fmt.Sprintf("port %s is out of range 1-65535", s)
	}
	return uint16(v), ""
}

// prefixes decodes a list of addresses and prefixes at key and returns
// the valid ones and the number of items. ok is false when the key is
// absent or not a list.
func (p *parser) prefixes(m *mapping, key string) (_ []netip.Prefix, _ loc, items int, ok bool) {
	// A list shared through an alias is decoded once, and every user gets
	// the same slice: the cost of a document is its distinct lists, not
	// the rules that name them (and its problems are reported once).
	var seq *yaml.Node
	if f, found := m.fields[key]; found {
		if n := p.deref(f.val); n.Kind == yaml.SequenceNode {
			seq = n
			if c, done := p.prefixLists[n]; done {
				return c, m.at(key), len(n.Content), true
			}
		}
	}
	list, at, ok := p.list(m, key)
	if !ok {
		return nil, at, 0, false
	}
	var out []netip.Prefix
	for i, raw := range list {
		if p.stopped {
			break
		}
		item := loc{raw, index(at.path, i)}
		n := p.deref(raw)
		if n.Kind != yaml.ScalarNode || n.ShortTag() != tagStr {
			p.errorf(item, "expected an address or prefix such as \"192.0.2.0/24\", got %s", describe(n))
			continue
		}
		pfx, problem := parsePrefix(n.Value)
		if problem != "" {
			p.errorf(item, "%s", problem)
			continue
		}
		out = append(out, pfx)
	}
	out = slices.Clip(out)
	if seq != nil && !p.stopped {
		if p.prefixLists == nil {
			p.prefixLists = map[*yaml.Node][]netip.Prefix{}
		}
		p.prefixLists[seq] = out
	}
	return out, at, len(list), true
}

// parsePrefix parses an IPv4 or IPv6 address or prefix. A bare address is
// a /32 or /128. Host bits must be clear, zones and IPv4-mapped IPv6
// addresses are refused.
func parsePrefix(s string) (netip.Prefix, string) {
	text := strings.TrimSpace(s)
	addrText, bitsText, hasBits := strings.Cut(text, "/")
	addr, err := netip.ParseAddr(addrText)
	if err != nil {
		return netip.Prefix{}, fmt.Sprintf("%s is not an IP address or prefix", quote(s))
	}
	if addr.Zone() != "" {
		return netip.Prefix{}, fmt.Sprintf("%s: zones are not allowed in addresses and prefixes", quote(s))
	}
	if addr.Is4In6() {
		return netip.Prefix{}, fmt.Sprintf("%s is an IPv4-mapped IPv6 address; write IPv4 addresses in IPv4 form", quote(s))
	}
	family, maxBits := "IPv4", 32
	if addr.Is6() {
		family, maxBits = "IPv6", 128
	}
	bits := maxBits
	if hasBits {
		v, problem := parseBits(bitsText)
		if problem != "" || v > maxBits {
			return netip.Prefix{}, fmt.Sprintf("%s: prefix length must be 0-%d for %s", quote(s), maxBits, family)
		}
		bits = v
	}
	pfx := netip.PrefixFrom(addr, bits)
	if masked := pfx.Masked(); masked != pfx {
		return netip.Prefix{}, fmt.Sprintf("%s has host bits set (did you mean %s?)", text, masked)
	}
	return pfx, ""
}

func parseBits(s string) (int, string) {
	if s == "" || len(s) > 3 {
		return 0, "bad"
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, "bad"
		}
	}
	v, _ := strconv.Atoi(s)
	return v, ""
}

// checkInterfaceName returns a problem text, or "" when name is a valid
// Linux interface name (the rules of the kernel's dev_valid_name).
func checkInterfaceName(name string) string {
	switch {
	case name == "":
		return "empty interface name"
	case len(name) > MaxInterfaceNameLen:
		return fmt.Sprintf("interface name %s is longer than %d bytes", quote(name), MaxInterfaceNameLen)
	case name == "." || name == "..":
		return fmt.Sprintf("%s is not a valid interface name", quote(name))
	case strings.ContainsAny(name, "/:"):
		return fmt.Sprintf("interface name %s contains '/' or ':'", quote(name))
	case strings.ContainsFunc(name, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }):
		return fmt.Sprintf("interface name %s contains whitespace or control characters", quote(name))
	}
	return ""
}

// checkRuleName returns a problem text, or "" when name is a valid rule
// name: 1 to 31 characters from [a-z0-9_-].
func checkRuleName(name string) string {
	if name == "" {
		return "must not be empty"
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Sprintf("%s may only contain a-z, 0-9, '_' and '-'", quote(name))
		}
	}
	if len(name) > MaxRuleNameLen {
		return fmt.Sprintf("%s is longer than %d characters", quote(name), MaxRuleNameLen)
	}
	return ""
}

// checkProbeAddress returns a problem text, or "" when addr is host:port
// with an IP literal or localhost as host.
func checkProbeAddress(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Sprintf("%s is not host:port (IPv6 as \"[::1]:8080\")", quote(addr))
	}
	if host != "localhost" {
		if _, err := netip.ParseAddr(host); err != nil {
			return fmt.Sprintf("host %s must be an IP address or localhost (names are not resolved)", quote(host))
		}
	}
	if _, problem := parsePort(port); problem != "" {
		return problem
	}
	return ""
}
