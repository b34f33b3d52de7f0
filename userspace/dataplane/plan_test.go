package dataplane

import (
	"net/netip"
	"testing"
)

func mustCompile(t *testing.T, s *Spec, prev *Plan) *Plan {
	t.Helper()
	p, err := Compile(s, prev)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func rule(name, proto string, ports ...PortRange) RuleSpec {
	return RuleSpec{Name: name, Protocol: proto, Ports: ports, Rate: 100, Burst: 10}
}

func TestCompileKeepsSlots(t *testing.T) {
	p1 := mustCompile(t, &Spec{Rules: []RuleSpec{rule("a", "udp"), rule("b", "udp"), rule("c", "udp")}}, nil)
	if p1.Slot("a") != 0 || p1.Slot("b") != 1 || p1.Slot("c") != 2 {
		t.Fatalf("slots %d %d %d", p1.Slot("a"), p1.Slot("b"), p1.Slot("c"))
	}
	// Reordered, b removed, d added: a and c keep theirs; d does not
	// inherit b's slot (and its counters) while a never-used slot is free.
	p2 := mustCompile(t, &Spec{Rules: []RuleSpec{rule("c", "udp"), rule("d", "udp"), rule("a", "udp")}}, p1)
	if p2.Slot("a") != 0 || p2.Slot("c") != 2 || p2.Slot("b") != -1 || p2.Slot("d") != 3 {
		t.Errorf("after reload: a=%d c=%d b=%d d=%d", p2.Slot("a"), p2.Slot("c"), p2.Slot("b"), p2.Slot("d"))
	}
	if p2.Rules[0].Epoch != p1.Rules[0].Epoch || p2.Rules[3].Epoch == p1.Rules[1].Epoch {
		t.Error("epochs must follow names")
	}
	// With every slot taken once, a freed slot is reused.
	var full []RuleSpec
	for i := range MaxRules {
		full = append(full, rule(string(rune('A'+i%26))+string(rune('a'+i/26)), "udp"))
	}
	pf := mustCompile(t, &Spec{Rules: full}, nil)
	next := append([]RuleSpec{}, full[1:]...)
	next = append(next, rule("new", "udp"))
	pn := mustCompile(t, &Spec{Rules: next}, pf)
	if pn.Slot("new") != 0 {
		t.Errorf("new rule took slot %d, want the freed 0", pn.Slot("new"))
	}
	if _, err := Compile(&Spec{Rules: append(full, rule("one-too-many", "udp"))}, nil); err == nil {
		t.Error("65 rules compiled")
	}
}

func TestCompileMatchMasks(t *testing.T) {
	p := mustCompile(t, &Spec{Rules: []RuleSpec{
		rule("web", "tcp", PortRange{80, 80}, PortRange{8000, 8002}),
		rule("dns", "any", PortRange{53, 53}),
		rule("icmp", "icmp"),
		rule("all", "any"),
		{Name: "syn", Protocol: "tcp", Ports: []PortRange{{443, 443}}, SynOnly: true, Rate: 1, Burst: 1, Fragments: "drop"},
		{Name: "frag", Protocol: "udp", Ports: []PortRange{{53, 53}}, Rate: 1e6, Burst: 1e5, Fragments: "limit", Shadow: true, Bytes: true},
	}}, nil)
	bit := func(name string) uint64 { return 1 << p.Slot(name) }
	for _, c := range []struct {
		proto Proto
		port  uint16
		want  uint64
	}{
		{ProtoTCP, 80, bit("web")}, {ProtoTCP, 8001, bit("web")}, {ProtoTCP, 8003, 0},
		{ProtoTCP, 53, bit("dns")}, {ProtoUDP, 53, bit("dns") | bit("frag")}, {ProtoUDP, 80, 0},
		{ProtoTCP, 443, bit("syn")},
	} {
		if got := p.Ports[PortKey(c.proto, c.port)]; got != c.want {
			t.Errorf("%v/%d: mask %b, want %b", c.proto, c.port, got, c.want)
		}
	}
	g := p.Globals
	if g.Portless[ProtoICMP] != bit("icmp")|bit("all") || g.Portless[ProtoOther] != bit("all") || g.Portless[ProtoTCP] != bit("all") {
		t.Errorf("portless masks %b", g.Portless)
	}
	// Port rules take fragments unless they say ignore (limit is the
	// default); TCP and UDP rules without ports always follow them.
	if g.SynOnly != bit("syn") || g.FragMatch[ProtoTCP] != bit("syn")|bit("web")|bit("dns")|bit("all") || g.FragMatch[ProtoUDP] != bit("frag")|bit("dns")|bit("all") {
		t.Errorf("syn %b frag %b", g.SynOnly, g.FragMatch)
	}
	// `fragments: ignore` on a rule without ports: each fragment charged
	// as it comes, not followed.
	pi := mustCompile(t, &Spec{Rules: []RuleSpec{{Name: "udp-all", Protocol: "udp", Rate: 1, Burst: 1, Fragments: "ignore"}}}, nil)
	if pi.Globals.FragMatch[ProtoUDP] != 0 || pi.Globals.Portless[ProtoUDP] == 0 {
		t.Errorf("portless ignore: portless %b frag %b", pi.Globals.Portless, pi.Globals.FragMatch)
	}
	if f := p.Rules[p.Slot("syn")].Flags; f&RuleFragDrop == 0 {
		t.Errorf("syn rule flags %b", f)
	}
	if f := p.Rules[p.Slot("frag")].Flags; f&(RuleShadow|RuleBytes) != RuleShadow|RuleBytes || f&RuleFragDrop != 0 {
		t.Errorf("frag rule flags %b", f)
	}
	if _, err := Compile(&Spec{Rules: []RuleSpec{rule("x", "icmp", PortRange{1, 1})}}, nil); err == nil {
		t.Error("icmp with ports compiled")
	}
}

// One longest-prefix lookup answers allow, deny and every rule's sources.
func TestCompileFoldsPrefixes(t *testing.T) {
	pfx := netip.MustParsePrefix
	p := mustCompile(t, &Spec{
		Allow: []netip.Prefix{pfx("10.0.0.0/8"), pfx("2001:db8::/32")},
		Deny:  []netip.Prefix{pfx("10.1.0.0/16"), pfx("192.0.2.0/24")},
		Rules: []RuleSpec{
			{Name: "inner", Protocol: "udp", Rate: 1, Burst: 1, Sources: []netip.Prefix{pfx("10.1.2.0/24"), pfx("2001:db8:1::/48")}},
			{Name: "world", Protocol: "udp", Rate: 1, Burst: 1, Sources: []netip.Prefix{pfx("0.0.0.0/0")}},
		},
	}, nil)
	inner, world := uint64(1)<<p.Slot("inner"), uint64(1)<<p.Slot("world")
	for _, c := range []struct {
		addr  string
		flags uint32
		rules uint64
		none  bool
	}{
		{addr: "10.1.2.3", flags: PrefixAllow | PrefixDeny, rules: inner | world},
		{addr: "10.1.9.9", flags: PrefixAllow | PrefixDeny, rules: world},
		{addr: "10.200.0.1", flags: PrefixAllow, rules: world},
		{addr: "192.0.2.7", flags: PrefixDeny, rules: world},
		{addr: "198.51.100.1", rules: world},
		{addr: "2001:db8:1::5", flags: PrefixAllow, rules: inner},
		{addr: "2001:db8:2::5", flags: PrefixAllow},
		{addr: "2001:dead::1", none: true},
	} {
		e := p.Lookup(netip.MustParseAddr(c.addr))
		if c.none {
			if e != nil {
				t.Errorf("%s: matched %v", c.addr, e.Prefix)
			}
			continue
		}
		if e == nil || e.Flags != c.flags || e.Rules != c.rules {
			t.Errorf("%s: got %+v, want flags %b rules %b", c.addr, e, c.flags, c.rules)
		}
	}
	if p.Globals.Flags&(GlobalPrefixesV4|GlobalPrefixesV6) != GlobalPrefixesV4|GlobalPrefixesV6 {
		t.Errorf("global flags %b", p.Globals.Flags)
	}
	if p.Globals.SrcFiltered != inner|world {
		t.Errorf("src filtered %b", p.Globals.SrcFiltered)
	}
}
