//go:build linux

package maps

import (
	"net/netip"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The crafted frames of TestFrames (and the seed corpus of FuzzXDP).

var (
	srcA4 = netip.MustParseAddr("192.0.2.10") // in no list
	srcA6 = netip.MustParseAddr("2001:db8:1::10")

	allow4    = netip.MustParseAddr("10.0.0.5")
	allow6    = netip.MustParseAddr("2001:db8:a::5")
	deny4     = netip.MustParseAddr("10.66.1.1")
	deny6     = netip.MustParseAddr("2001:db8:bad::1")
	srcRule4  = netip.MustParseAddr("10.9.3.4") // in ssh-src's sources
	srcRule6  = netip.MustParseAddr("2001:db8:9::4")
	srcOther4 = netip.MustParseAddr("10.8.3.4")
	srcOther6 = netip.MustParseAddr("2001:db8:8::4")
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func ports(lo, hi uint16) []dataplane.PortRange { return []dataplane.PortRange{{Lo: lo, Hi: hi}} }

// baseSpec is the plan most frame cases run against. Slots follow the
// order of the rules.
func baseSpec() *dataplane.Spec {
	return &dataplane.Spec{
		Allow: []netip.Prefix{
			pfx("10.0.0.0/24"), pfx("2001:db8:a::/48"),
			pfx("10.77.0.0/16"), // also denied: allow wins
			pfx("10.88.0.0/16"), // encloses a denied /24
			pfx("10.99.1.0/24"), // inside a denied /16
		},
		Deny: []netip.Prefix{
			pfx("10.66.0.0/16"), pfx("2001:db8:bad::/48"),
			pfx("10.77.0.0/16"),
			pfx("10.88.1.0/24"),
			pfx("10.99.0.0/16"),
			pfx("2001:db8:a:1::/64"), // inside an allowed /48
		},
		Rules: []dataplane.RuleSpec{
			{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 1000, Burst: 100},
			{Name: "web-syn", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1000, Burst: 100},
			{Name: "icmp", Protocol: "icmp", Rate: 1, Burst: 1},
			{Name: "tight", Protocol: "udp", Ports: ports(9000, 9000), Rate: 1, Burst: 1},
			{Name: "ssh-src", Protocol: "tcp", Ports: ports(22, 22), Rate: 1000, Burst: 100,
				Sources: []netip.Prefix{pfx("10.9.0.0/16"), pfx("2001:db8:9::/48")}},
			{Name: "shadow", Protocol: "udp", Ports: ports(9100, 9100), Shadow: true, Rate: 1, Burst: 1},
			{Name: "pair-a", Protocol: "udp", Ports: ports(7000, 7000), Rate: 1000, Burst: 100},
			{Name: "pair-b", Protocol: "udp", Ports: ports(7000, 7001), Rate: 1, Burst: 1},
			{Name: "pair-c", Protocol: "udp", Ports: ports(7000, 7000), Rate: 1000, Burst: 100},
			{Name: "bytes", Protocol: "udp", Ports: ports(9200, 9200), Bytes: true, Rate: 1000, Burst: 1000},
		},
	}
}

// fragSpec has a portless UDP rule and a UDP port rule with the given
// fragment policy.
func fragSpec(policy string) *dataplane.Spec {
	return &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "udp-all", Protocol: "udp", Rate: 1000, Burst: 100},
		{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Fragments: policy, Rate: 1000, Burst: 100},
		{Name: "web", Protocol: "tcp", Ports: ports(80, 80), Rate: 1000, Burst: 100},
	}}
}

func frameSpecsByName() map[string]*dataplane.Spec {
	mp := baseSpec()
	mp.MalformedPass = true
	return map[string]*dataplane.Spec{
		"base":           baseSpec(),
		"malformed-pass": mp,
		"frag-ignore":    fragSpec("ignore"),
		"frag-limit":     fragSpec("limit"),
		"frag-drop":      fragSpec("drop"),
	}
}

type ruleWant struct {
	name    string
	verdict dataplane.Verdict
	reason  dataplane.Reason
}

type frameCase struct {
	name   string
	spec   string   // key of frameSpecsByName
	pre    [][]byte // run first, at the same instant
	frame  []byte
	pass   bool
	reason dataplane.Reason // of the global slot
	rules  []ruleWant       // the rules whose counters change
}

func admit(name string) ruleWant {
	return ruleWant{name, dataplane.VerdictPass, dataplane.ReasonAdmit}
}

func udpTo(src netip.Addr, port uint16) dataplane.FrameSpec {
	return dataplane.FrameSpec{Src: src, Proto: dataplane.ProtoNumUDP, SrcPort: 40000, DstPort: port, PayloadLen: 32}
}

func tcpTo(src netip.Addr, port uint16, flags uint8) dataplane.FrameSpec {
	return dataplane.FrameSpec{Src: src, Proto: dataplane.ProtoNumTCP, SrcPort: 40000, DstPort: port, TCPFlags: flags}
}

func icmpOf(src netip.Addr, typ uint8) dataplane.FrameSpec {
	p := uint8(dataplane.ProtoNumICMP)
	if src.Is6() {
		p = dataplane.ProtoNumICMPv6
	}
	return dataplane.FrameSpec{Src: src, Proto: p, ICMPType: typ, PayloadLen: 24}
}

func build(s dataplane.FrameSpec) []byte { return dataplane.BuildFrame(s) }

// edit returns a copy of f changed by fn.
func edit(f []byte, fn func(b []byte)) []byte {
	b := append([]byte(nil), f...)
	fn(b)
	return b
}

// cut returns the first n bytes of f, copied.
func cut(f []byte, n int) []byte { return append([]byte(nil), f[:n]...) }

const (
	synFlags    = 0x02
	synAckFlags = 0x12
	ackFlags    = 0x10
)

// frameCases returns every crafted frame with its exact expected outcome.
func frameCases() []frameCase {
	var cs []frameCase
	add := func(c frameCase) {
		if c.spec == "" {
			c.spec = "base"
		}
		cs = append(cs, c)
	}
	pass := func(name string, f []byte, reason dataplane.Reason, rules ...ruleWant) {
		add(frameCase{name: name, frame: f, pass: true, reason: reason, rules: rules})
	}
	noRule := dataplane.ReasonNoRule
	adm := dataplane.ReasonAdmit

	// Plain frames, VLANs.
	for _, src := range []netip.Addr{srcA4, srcA6} {
		fam := "v4 "
		if src.Is6() {
			fam = "v6 "
		}
		pass(fam+"udp to limited port", build(udpTo(src, 53)), adm, admit("dns"))
		pass(fam+"udp to unlimited port", build(udpTo(src, 54)), noRule)
		s := udpTo(src, 53)
		s.VLANs = []uint16{dataplane.EtherType8021Q}
		pass(fam+"vlan", build(s), adm, admit("dns"))
		s.VLANs = []uint16{dataplane.EtherType8021AD, dataplane.EtherType8021Q}
		pass(fam+"qinq", build(s), adm, admit("dns"))
		s.VLANs = []uint16{dataplane.EtherType8021Q, dataplane.EtherType8021Q}
		pass(fam+"two 802.1q tags", build(s), adm, admit("dns"))
		s.VLANs = []uint16{dataplane.EtherType8021AD, dataplane.EtherType8021Q, dataplane.EtherType8021Q}
		pass(fam+"three tags: not ip", build(s), dataplane.ReasonNotIP)
		add(frameCase{name: fam + "three tags: not ip, even with malformed pass", spec: "malformed-pass",
			frame: build(s), pass: true, reason: dataplane.ReasonNotIP})

		// TCP flags against a syn_only rule.
		pass(fam+"tcp syn", build(tcpTo(src, 80, synFlags)), adm, admit("web-syn"))
		pass(fam+"tcp syn|ack", build(tcpTo(src, 80, synAckFlags)), noRule)
		pass(fam+"tcp ack", build(tcpTo(src, 80, ackFlags)), noRule)
		pass(fam+"tcp syn|fin", build(tcpTo(src, 80, synFlags|0x01)), adm, admit("web-syn"))

		// A drained rule drops; a packet matching two rules where the
		// second drops: the first counts an admit, the third is not reached.
		add(frameCase{name: fam + "drained rule", pre: [][]byte{build(udpTo(src, 9000))},
			frame: build(udpTo(src, 9000)), reason: dataplane.ReasonRule,
			rules: []ruleWant{{"tight", dataplane.VerdictDrop, dataplane.ReasonRule}}})
		pass(fam+"three rules admit", build(udpTo(src, 7000)), adm, admit("pair-a"), admit("pair-b"), admit("pair-c"))
		add(frameCase{name: fam + "second of three rules drops", pre: [][]byte{build(udpTo(src, 7001))},
			frame: build(udpTo(src, 7000)), reason: dataplane.ReasonRule,
			rules: []ruleWant{admit("pair-a"), {"pair-b", dataplane.VerdictDrop, dataplane.ReasonRule}}})

		// Shadow: counts would_drop, passes.
		add(frameCase{name: fam + "shadow rule would drop", pre: [][]byte{build(udpTo(src, 9100))},
			frame: build(udpTo(src, 9100)), pass: true, reason: adm,
			rules: []ruleWant{{"shadow", dataplane.VerdictWouldDrop, dataplane.ReasonRule}}})

		// Bytes: 1000 B/s with a burst of 1000 B takes one 600-byte frame.
		big := udpTo(src, 9200)
		big.PayloadLen = 600 - 42
		if src.Is6() {
			big.PayloadLen = 600 - 62
		}
		pass(fam+"bytes rule admits", build(big), adm, admit("bytes"))
		add(frameCase{name: fam + "bytes rule drops the second 600-byte frame", pre: [][]byte{build(big)},
			frame: build(big), reason: dataplane.ReasonRule,
			rules: []ruleWant{{"bytes", dataplane.VerdictDrop, dataplane.ReasonRule}}})
		small := udpTo(src, 9200)
		small.PayloadLen = 0
		add(frameCase{name: fam + "bytes rule admits a small frame after a big one", pre: [][]byte{build(big)},
			frame: build(small), pass: true, reason: adm, rules: []ruleWant{admit("bytes")}})
	}

	// ICMP: echo is limited; ICMPv6 neighbour discovery is exempt.
	add(frameCase{name: "icmp echo limited", pre: [][]byte{build(icmpOf(srcA4, 8))},
		frame: build(icmpOf(srcA4, 8)), reason: dataplane.ReasonRule,
		rules: []ruleWant{{"icmp", dataplane.VerdictDrop, dataplane.ReasonRule}}})
	pass("icmpv6 echo request admitted", build(icmpOf(srcA6, 128)), adm, admit("icmp"))
	add(frameCase{name: "icmpv6 echo request limited", pre: [][]byte{build(icmpOf(srcA6, 128))},
		frame: build(icmpOf(srcA6, 128)), reason: dataplane.ReasonRule,
		rules: []ruleWant{{"icmp", dataplane.VerdictDrop, dataplane.ReasonRule}}})
	for _, typ := range []uint8{133, 134, 135, 136, 137} {
		add(frameCase{name: "icmpv6 neighbour discovery exempt " + itoa(int(typ)),
			pre:   [][]byte{build(icmpOf(srcA6, 128))},
			frame: build(icmpOf(srcA6, typ)), pass: true, reason: noRule})
	}
	// ICMP type 135 over IPv4 is not neighbour discovery.
	add(frameCase{name: "icmpv4 type 135 limited", pre: [][]byte{build(icmpOf(srcA4, 8))},
		frame: build(icmpOf(srcA4, 135)), reason: dataplane.ReasonRule,
		rules: []ruleWant{{"icmp", dataplane.VerdictDrop, dataplane.ReasonRule}}})

	// IPv4 options: IHL 5..15.
	for w := 0; w <= 10; w++ {
		s := udpTo(srcA4, 53)
		s.IPv4OptionWords = w
		pass("ipv4 ihl "+itoa(5+w), build(s), adm, admit("dns"))
	}
	// IHL below 5: malformed L3, dropped by default, passed when asked.
	for ihl := range 5 {
		f := edit(build(udpTo(srcA4, 53)), func(b []byte) { b[14] = 0x40 | byte(ihl) })
		add(frameCase{name: "ipv4 ihl " + itoa(ihl), frame: f, reason: dataplane.ReasonMalformedL3})
		add(frameCase{name: "ipv4 ihl " + itoa(ihl) + " malformed pass", spec: "malformed-pass", frame: f,
			pass: true, reason: dataplane.ReasonMalformedL3})
	}
	// The source of an unparseable IPv4 header is not trusted: an
	// allowlisted address does not help.
	add(frameCase{name: "allowlisted source with ihl 4 is malformed",
		frame: edit(build(udpTo(allow4, 53)), func(b []byte) { b[14] = 0x44 }), reason: dataplane.ReasonMalformedL3})

	// IPv4 fragments.
	first := udpTo(srcA4, 53)
	first.MoreFragments = true
	pass("ipv4 first fragment has ports", build(first), adm, admit("dns"))
	later := udpTo(srcA4, 53)
	later.FragOffset, later.MoreFragments = 185, true
	pass("ipv4 non-first fragment, no portless rule", build(later), noRule)
	last := later
	last.MoreFragments = false
	icmpFrag := icmpOf(srcA4, 8)
	icmpFrag.FragOffset = 3
	add(frameCase{name: "ipv4 non-first icmp fragment matches the portless icmp rule",
		pre: [][]byte{build(icmpOf(srcA4, 8))}, frame: build(icmpFrag), reason: dataplane.ReasonRule,
		rules: []ruleWant{{"icmp", dataplane.VerdictDrop, dataplane.ReasonRule}}})
	v6first := udpTo(srcA6, 53)
	v6first.IPv6Ext, v6first.MoreFragments = []uint8{dataplane.ExtFragment}, true
	v6later := v6first
	v6later.FragOffset = 185
	for _, f := range []struct {
		name  string
		frame []byte
	}{
		{"ipv4 non-first fragment", build(later)},
		{"ipv4 last fragment", build(last)},
		{"ipv6 non-first fragment", build(v6later)},
	} {
		add(frameCase{name: f.name + ", fragments ignore", spec: "frag-ignore", frame: f.frame, pass: true,
			reason: adm, rules: []ruleWant{admit("udp-all")}})
		add(frameCase{name: f.name + ", fragments limit", spec: "frag-limit", frame: f.frame, pass: true,
			reason: adm, rules: []ruleWant{admit("udp-all"), admit("dns")}})
		add(frameCase{name: f.name + ", fragments drop", spec: "frag-drop", frame: f.frame,
			reason: dataplane.ReasonFragment, rules: []ruleWant{admit("udp-all"),
				{"dns", dataplane.VerdictDrop, dataplane.ReasonFragment}}})
	}
	for _, policy := range []string{"ignore", "limit", "drop"} {
		for _, f := range []struct {
			name  string
			frame []byte
		}{{"ipv4 first fragment", build(first)}, {"ipv6 first fragment", build(v6first)}} {
			add(frameCase{name: f.name + ", fragments " + policy, spec: "frag-" + policy, frame: f.frame,
				pass: true, reason: adm, rules: []ruleWant{admit("udp-all"), admit("dns")}})
		}
		// A TCP non-first fragment: the TCP rule has ports and ignores them.
		tf := tcpTo(srcA4, 80, synFlags)
		tf.FragOffset = 10
		add(frameCase{name: "tcp non-first fragment, fragments " + policy, spec: "frag-" + policy,
			frame: build(tf), pass: true, reason: noRule})
	}

	// IPv6 extension headers.
	for _, e := range []struct {
		name string
		ext  []uint8
	}{
		{"hop-by-hop", []uint8{dataplane.ExtHopByHop}},
		{"routing", []uint8{dataplane.ExtRouting}},
		{"destination options", []uint8{dataplane.ExtDstOpts}},
		{"ah", []uint8{dataplane.ExtAH}},
		{"first fragment", []uint8{dataplane.ExtFragment}},
		{"chain of 6", []uint8{0, 43, 60, 51, 44, 60}},
		{"chain of 6 ending in a first fragment", []uint8{60, 60, 60, 60, 60, 44}},
	} {
		s := udpTo(srcA6, 53)
		s.IPv6Ext, s.MoreFragments = e.ext, true
		pass("ipv6 "+e.name, build(s), adm, admit("dns"))
		t := tcpTo(srcA6, 80, synFlags)
		t.IPv6Ext = e.ext
		pass("ipv6 "+e.name+" tcp syn", build(t), adm, admit("web-syn"))
	}
	nf := udpTo(srcA6, 53)
	nf.IPv6Ext, nf.FragOffset = []uint8{dataplane.ExtFragment}, 100
	pass("ipv6 non-first fragment, no portless rule", build(nf), noRule)
	nf.IPv6Ext = []uint8{60, 60, 60, 60, 60, 44, 60}
	pass("ipv6 chain of 7 cut short by a non-first fragment", build(nf), noRule)
	nf7 := nf
	nf7.IPv6Ext = []uint8{60, 60, 60, 60, 60, 60, 44}
	add(frameCase{name: "ipv6 chain of 7 ending in a non-first fragment, fragments limit", spec: "frag-limit",
		frame: build(nf7), reason: dataplane.ReasonExtLimit})
	chain7 := udpTo(srcA6, 53)
	chain7.IPv6Ext = []uint8{0, 43, 60, 51, 44, 60, 60}
	add(frameCase{name: "ipv6 chain of 7", frame: build(chain7), reason: dataplane.ReasonExtLimit})
	add(frameCase{name: "ipv6 chain of 7 malformed pass", spec: "malformed-pass", frame: build(chain7), pass: true,
		reason: dataplane.ReasonExtLimit})

	// Truncated and invalid headers at every layer.
	v4 := build(udpTo(srcA4, 53))
	v6 := build(udpTo(srcA6, 53))
	vlan := udpTo(srcA4, 53)
	vlan.VLANs = []uint16{dataplane.EtherType8021AD, dataplane.EtherType8021Q}
	opts := udpTo(srcA4, 53)
	opts.IPv4OptionWords = 4
	ext := func(e uint8) []byte {
		s := udpTo(srcA6, 53)
		s.IPv6Ext = []uint8{e}
		return build(s)
	}
	t4 := build(tcpTo(srcA4, 80, synFlags))
	t6 := build(tcpTo(srcA6, 80, synFlags))
	i4 := build(icmpOf(srcA4, 8))
	i6 := build(icmpOf(srcA6, 128))
	const l4v4, l4v6 = 14 + 20, 14 + 40
	bad := []struct {
		name   string
		frame  []byte
		reason dataplane.Reason
	}{
		{"first vlan tag cut", cut(build(vlan), 16), dataplane.ReasonMalformedL2},
		{"second vlan tag cut", cut(build(vlan), 21), dataplane.ReasonMalformedL2},
		{"ethernet only, ipv4 ethertype", cut(v4, 14), dataplane.ReasonMalformedL3},
		{"ipv4 header cut", cut(v4, 14+19), dataplane.ReasonMalformedL3},
		{"ipv4 options cut", cut(build(opts), 14+20+15), dataplane.ReasonMalformedL3},
		{"ipv4 version 6", edit(v4, func(b []byte) { b[14] = 0x65 }), dataplane.ReasonMalformedL3},
		{"ipv6 header cut", cut(v6, 14+39), dataplane.ReasonMalformedL3},
		{"ipv6 version 4", edit(v6, func(b []byte) { b[14] = 0x40 }), dataplane.ReasonMalformedL3},
		{"ipv6 ext header start cut", cut(ext(dataplane.ExtHopByHop), l4v6+1), dataplane.ReasonMalformedL3},
		{"ipv6 hop-by-hop cut", cut(ext(dataplane.ExtHopByHop), l4v6+7), dataplane.ReasonMalformedL3},
		{"ipv6 routing cut", cut(ext(dataplane.ExtRouting), l4v6+4), dataplane.ReasonMalformedL3},
		{"ipv6 destination options cut", cut(ext(dataplane.ExtDstOpts), l4v6+2), dataplane.ReasonMalformedL3},
		{"ipv6 ah cut", cut(ext(dataplane.ExtAH), l4v6+23), dataplane.ReasonMalformedL3},
		{"ipv6 fragment header cut", cut(ext(dataplane.ExtFragment), l4v6+7), dataplane.ReasonMalformedL3},
		{"ipv6 hop-by-hop longer than the frame",
			edit(ext(dataplane.ExtHopByHop), func(b []byte) { b[l4v6+1] = 200 }), dataplane.ReasonMalformedL3},
		{"ipv4 tcp cut", cut(t4, l4v4+19), dataplane.ReasonMalformedL4},
		{"ipv6 tcp cut", cut(t6, l4v6+12), dataplane.ReasonMalformedL4},
		{"ipv4 tcp doff 4", edit(t4, func(b []byte) { b[l4v4+12] = 0x40 }), dataplane.ReasonMalformedL4},
		{"ipv6 tcp doff 0", edit(t6, func(b []byte) { b[l4v6+12] = 0x00 }), dataplane.ReasonMalformedL4},
		{"ipv4 udp cut", cut(v4, l4v4+7), dataplane.ReasonMalformedL4},
		{"ipv6 udp cut", cut(v6, l4v6), dataplane.ReasonMalformedL4},
		{"ipv4 icmp cut", cut(i4, l4v4+3), dataplane.ReasonMalformedL4},
		{"ipv6 icmpv6 cut", cut(i6, l4v6+1), dataplane.ReasonMalformedL4},
	}
	for _, b := range bad {
		add(frameCase{name: b.name, frame: b.frame, reason: b.reason})
		add(frameCase{name: b.name + " malformed pass", spec: "malformed-pass", frame: b.frame, pass: true, reason: b.reason})
	}
	// TCP with doff 5..15 and a full header is fine.
	pass("ipv4 tcp doff 15", edit(t4, func(b []byte) { b[l4v4+12] = 0xf0 }), adm, admit("web-syn"))

	// Not IP.
	pass("arp", build(dataplane.FrameSpec{EtherType: dataplane.EtherTypeARP, PayloadLen: 28}), dataplane.ReasonNotIP)
	pass("arp in a vlan", build(dataplane.FrameSpec{VLANs: []uint16{dataplane.EtherType8021Q},
		EtherType: dataplane.EtherTypeARP, PayloadLen: 28}), dataplane.ReasonNotIP)
	pass("ethernet header only", build(dataplane.FrameSpec{EtherType: 0x88cc}), dataplane.ReasonNotIP)

	// Allow and deny lists.
	for _, src := range []netip.Addr{allow4, allow6} {
		add(frameCase{name: "allowlisted " + src.String() + " passes an empty bucket",
			pre: [][]byte{build(udpTo(srcA4, 9000)), build(udpTo(srcA6, 9000))}, frame: build(udpTo(src, 9000)),
			pass: true, reason: dataplane.ReasonAllow})
	}
	pass("allowlisted v4 with tcp cut", cut(build(tcpTo(allow4, 80, synFlags)), l4v4+10), dataplane.ReasonAllow)
	pass("allowlisted v6 with udp cut", cut(build(udpTo(allow6, 53)), l4v6+3), dataplane.ReasonAllow)
	pass("allowlisted v6 with ext header cut",
		cut(build(func() dataplane.FrameSpec { s := udpTo(allow6, 53); s.IPv6Ext = []uint8{0}; return s }()), l4v6+4),
		dataplane.ReasonAllow)
	pass("allowlisted v6 with ext chain of 7",
		build(func() dataplane.FrameSpec {
			s := udpTo(allow6, 53)
			s.IPv6Ext = []uint8{0, 60, 60, 60, 60, 60, 60}
			return s
		}()),
		dataplane.ReasonAllow)
	for _, src := range []netip.Addr{deny4, deny6, netip.MustParseAddr("10.99.2.5")} {
		add(frameCase{name: "denylisted " + src.String(), frame: build(udpTo(src, 54)), reason: dataplane.ReasonDeny})
		add(frameCase{name: "denylisted " + src.String() + " to a rule", frame: build(udpTo(src, 53)),
			reason: dataplane.ReasonDeny})
	}
	add(frameCase{name: "denylisted with tcp cut", frame: cut(build(tcpTo(deny4, 80, synFlags)), l4v4+5),
		reason: dataplane.ReasonDeny})
	add(frameCase{name: "denylisted with tcp cut, malformed pass", spec: "malformed-pass",
		frame: cut(build(tcpTo(deny6, 80, synFlags)), l4v6+5), reason: dataplane.ReasonDeny})
	for _, s := range []string{"10.77.1.1", "10.88.1.5", "10.99.1.5", "2001:db8:a:1::5"} {
		pass("allow beats deny "+s, build(udpTo(netip.MustParseAddr(s), 9000)), dataplane.ReasonAllow)
	}

	// Per-rule sources.
	pass("sources v4 in", build(tcpTo(srcRule4, 22, synFlags)), adm, admit("ssh-src"))
	pass("sources v4 out", build(tcpTo(srcOther4, 22, synFlags)), noRule)
	pass("sources v6 in", build(tcpTo(srcRule6, 22, ackFlags)), adm, admit("ssh-src"))
	pass("sources v6 out", build(tcpTo(srcOther6, 22, ackFlags)), noRule)
	pass("sources, unlisted source", build(tcpTo(srcA4, 22, synFlags)), noRule)

	// Other IP protocols match no rule here.
	pass("gre", build(dataplane.FrameSpec{Src: srcA4, Proto: 47, PayloadLen: 20}), noRule)
	return cs
}

func itoa(i int) string {
	if i < 0 {
		return "-" + itoa(-i)
	}
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}
