// Package corpus is the crafted-frame corpus of xlimit's data plane: every
// frame with the rules it runs against and its exact expected outcome
// (verdict, reason, the counters of each rule it touches). The kernel tests
// run it through BPF_PROG_TEST_RUN with a fake clock (maps.TestFrames), seed
// the fuzzer with it (maps.FuzzXDP), and the end-to-end tests send it on a
// live veth to the real daemon (tests.TestMalformedLive). It serves tests:
// it is part of the test kit (tests/kit), which the release binary does not
// import.
package corpus

import (
	"net/netip"
	"strconv"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Sources of the corpus frames, by the lists of BaseSpec they are in.
var (
	SrcA4 = netip.MustParseAddr("192.0.2.10") // in no list
	SrcA6 = netip.MustParseAddr("2001:db8:1::10")

	Allow4    = netip.MustParseAddr("10.0.0.5")
	Allow6    = netip.MustParseAddr("2001:db8:a::5")
	Deny4     = netip.MustParseAddr("10.66.1.1")
	Deny6     = netip.MustParseAddr("2001:db8:bad::1")
	SrcRule4  = netip.MustParseAddr("10.9.3.4") // in ssh-src's sources
	SrcRule6  = netip.MustParseAddr("2001:db8:9::4")
	SrcOther4 = netip.MustParseAddr("10.8.3.4")
	SrcOther6 = netip.MustParseAddr("2001:db8:8::4")
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// Ports is one inclusive port range.
func Ports(lo, hi uint16) []dataplane.PortRange { return []dataplane.PortRange{{Lo: lo, Hi: hi}} }

// BaseSpec is the plan most frame cases run against. Slots follow the
// order of the rules.
func BaseSpec() *dataplane.Spec {
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
			{Name: "dns", Protocol: "udp", Ports: Ports(53, 53), Rate: 1000, Burst: 100},
			{Name: "web-syn", Protocol: "tcp", Ports: Ports(80, 80), SynOnly: true, Rate: 1000, Burst: 100},
			{Name: "icmp", Protocol: "icmp", Rate: 1, Burst: 1},
			{Name: "tight", Protocol: "udp", Ports: Ports(9000, 9000), Rate: 1, Burst: 1},
			{Name: "ssh-src", Protocol: "tcp", Ports: Ports(22, 22), Rate: 1000, Burst: 100,
				Sources: []netip.Prefix{pfx("10.9.0.0/16"), pfx("2001:db8:9::/48")}},
			{Name: "shadow", Protocol: "udp", Ports: Ports(9100, 9100), Shadow: true, Rate: 1, Burst: 1},
			{Name: "pair-a", Protocol: "udp", Ports: Ports(7000, 7000), Rate: 1000, Burst: 100},
			{Name: "pair-b", Protocol: "udp", Ports: Ports(7000, 7001), Rate: 1, Burst: 1},
			{Name: "pair-c", Protocol: "udp", Ports: Ports(7000, 7000), Rate: 1000, Burst: 100},
			{Name: "bytes", Protocol: "udp", Ports: Ports(9200, 9200), Bytes: true, Rate: 1514, Burst: 1514},
		},
	}
}

// FragSpec has a portless UDP rule and a UDP port rule with the given
// fragment policy.
func FragSpec(policy string) *dataplane.Spec {
	return &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "udp-all", Protocol: "udp", Rate: 1000, Burst: 100},
		{Name: "dns", Protocol: "udp", Ports: Ports(53, 53), Fragments: policy, Rate: 1000, Burst: 100},
		{Name: "web", Protocol: "tcp", Ports: Ports(80, 80), Rate: 1000, Burst: 100},
	}}
}

// Specs returns the rule sets the cases run against, by Case.Spec.
func Specs() map[string]*dataplane.Spec {
	mp := BaseSpec()
	mp.MalformedPass = true
	return map[string]*dataplane.Spec{
		"base":           BaseSpec(),
		"malformed-pass": mp,
		"frag-ignore":    FragSpec("ignore"),
		"frag-limit":     FragSpec("limit"),
		"frag-drop":      FragSpec("drop"),
	}
}

// RuleWant is the decision one rule counts for a case's frame.
type RuleWant struct {
	Name    string
	Verdict dataplane.Verdict
	Reason  dataplane.Reason
}

// Case is one crafted frame and its exact expected outcome.
type Case struct {
	Name   string
	Spec   string   // key of Specs
	Pre    [][]byte // run first, at the same instant
	Frame  []byte
	Pass   bool
	Reason dataplane.Reason // of the global slot
	Rules  []RuleWant       // the rules whose counters change
}

func admit(name string) RuleWant {
	return RuleWant{name, dataplane.VerdictPass, dataplane.ReasonAdmit}
}

// UDPTo is a UDP datagram with 32 bytes of payload from src to port.
func UDPTo(src netip.Addr, port uint16) frame.Spec {
	return frame.Spec{Src: src, Proto: frame.ProtoUDP, SrcPort: 40000, DstPort: port, PayloadLen: 32}
}

// TCPTo is a TCP segment with the given flags from src to port.
func TCPTo(src netip.Addr, port uint16, flags uint8) frame.Spec {
	return frame.Spec{Src: src, Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: port, TCPFlags: flags}
}

// ICMPOf is an ICMP (IPv4 source) or ICMPv6 (IPv6 source) message of a type.
func ICMPOf(src netip.Addr, typ uint8) frame.Spec {
	p := frame.ProtoICMP
	if src.Is6() {
		p = frame.ProtoICMPv6
	}
	return frame.Spec{Src: src, Proto: p, ICMPType: typ, PayloadLen: 24}
}

func build(s frame.Spec) []byte { return frame.MustBuild(s) }

// edit returns a copy of f changed by fn.
func edit(f []byte, fn func(b []byte)) []byte {
	b := append([]byte(nil), f...)
	fn(b)
	return b
}

// cut returns the first n bytes of f, copied.
func cut(f []byte, n int) []byte { return append([]byte(nil), f[:n]...) }

// TCP flags of the corpus frames.
const (
	SynFlags    = 0x02
	SynAckFlags = 0x12
	AckFlags    = 0x10
)

// Cases returns every crafted frame with its exact expected outcome.
func Cases() []Case {
	var cs []Case
	add := func(c Case) {
		if c.Spec == "" {
			c.Spec = "base"
		}
		cs = append(cs, c)
	}
	pass := func(name string, f []byte, reason dataplane.Reason, rules ...RuleWant) {
		add(Case{Name: name, Frame: f, Pass: true, Reason: reason, Rules: rules})
	}
	noRule := dataplane.ReasonNoRule
	adm := dataplane.ReasonAdmit

	// Plain frames, VLANs.
	for _, src := range []netip.Addr{SrcA4, SrcA6} {
		fam := "v4 "
		if src.Is6() {
			fam = "v6 "
		}
		pass(fam+"udp to limited port", build(UDPTo(src, 53)), adm, admit("dns"))
		pass(fam+"udp to unlimited port", build(UDPTo(src, 54)), noRule)
		s := UDPTo(src, 53)
		s.VLANs = frame.Tags(frame.EtherType8021Q)
		pass(fam+"vlan", build(s), adm, admit("dns"))
		s.VLANs = frame.Tags(frame.EtherType8021AD, frame.EtherType8021Q)
		pass(fam+"qinq", build(s), adm, admit("dns"))
		s.VLANs = frame.Tags(frame.EtherType8021Q, frame.EtherType8021Q)
		pass(fam+"two 802.1q tags", build(s), adm, admit("dns"))
		// More tags than the parser walks: malformed (before, not_ip
		// and unlimited).
		s.VLANs = frame.Tags(frame.EtherType8021AD, frame.EtherType8021Q, frame.EtherType8021Q)
		add(Case{Name: fam + "three tags", Frame: build(s), Reason: dataplane.ReasonVLANDepth})
		add(Case{Name: fam + "three tags malformed pass", Spec: "malformed-pass",
			Frame: build(s), Pass: true, Reason: dataplane.ReasonVLANDepth})

		// TCP flags against a syn_only rule.
		pass(fam+"tcp syn", build(TCPTo(src, 80, SynFlags)), adm, admit("web-syn"))
		pass(fam+"tcp syn|ack", build(TCPTo(src, 80, SynAckFlags)), noRule)
		pass(fam+"tcp ack", build(TCPTo(src, 80, AckFlags)), noRule)
		pass(fam+"tcp syn|fin", build(TCPTo(src, 80, SynFlags|0x01)), adm, admit("web-syn"))

		// A drained rule drops; a packet matching two rules where the
		// second drops: the first counts an admit, the third is not reached.
		add(Case{Name: fam + "drained rule", Pre: [][]byte{build(UDPTo(src, 9000))},
			Frame: build(UDPTo(src, 9000)), Reason: dataplane.ReasonRule,
			Rules: []RuleWant{{"tight", dataplane.VerdictDrop, dataplane.ReasonRule}}})
		pass(fam+"three rules admit", build(UDPTo(src, 7000)), adm, admit("pair-a"), admit("pair-b"), admit("pair-c"))
		add(Case{Name: fam + "second of three rules drops", Pre: [][]byte{build(UDPTo(src, 7001))},
			Frame: build(UDPTo(src, 7000)), Reason: dataplane.ReasonRule,
			Rules: []RuleWant{admit("pair-a"), {"pair-b", dataplane.VerdictDrop, dataplane.ReasonRule}}})

		// Shadow: counts would_drop, passes.
		add(Case{Name: fam + "shadow rule would drop", Pre: [][]byte{build(UDPTo(src, 9100))},
			Frame: build(UDPTo(src, 9100)), Pass: true, Reason: adm,
			Rules: []RuleWant{{"shadow", dataplane.VerdictWouldDrop, dataplane.ReasonRule}}})

		// Bytes: 1514 B/s with a burst of 1514 B (the least a rules file
		// allows) takes one 1000-byte frame.
		big := UDPTo(src, 9200)
		big.PayloadLen = 1000 - 42
		if src.Is6() {
			big.PayloadLen = 1000 - 62
		}
		pass(fam+"bytes rule admits", build(big), adm, admit("bytes"))
		add(Case{Name: fam + "bytes rule drops the second 1000-byte frame", Pre: [][]byte{build(big)},
			Frame: build(big), Reason: dataplane.ReasonRule,
			Rules: []RuleWant{{"bytes", dataplane.VerdictDrop, dataplane.ReasonRule}}})
		small := UDPTo(src, 9200)
		small.PayloadLen = 0
		add(Case{Name: fam + "bytes rule admits a small frame after a big one", Pre: [][]byte{build(big)},
			Frame: build(small), Pass: true, Reason: adm, Rules: []RuleWant{admit("bytes")}})
	}

	// ICMP: echo is limited; ICMPv6 neighbour discovery is exempt.
	add(Case{Name: "icmp echo limited", Pre: [][]byte{build(ICMPOf(SrcA4, 8))},
		Frame: build(ICMPOf(SrcA4, 8)), Reason: dataplane.ReasonRule,
		Rules: []RuleWant{{"icmp", dataplane.VerdictDrop, dataplane.ReasonRule}}})
	pass("icmpv6 echo request admitted", build(ICMPOf(SrcA6, 128)), adm, admit("icmp"))
	add(Case{Name: "icmpv6 echo request limited", Pre: [][]byte{build(ICMPOf(SrcA6, 128))},
		Frame: build(ICMPOf(SrcA6, 128)), Reason: dataplane.ReasonRule,
		Rules: []RuleWant{{"icmp", dataplane.VerdictDrop, dataplane.ReasonRule}}})
	// Only neighbour discovery that RFC 4861 lets a host accept (hop
	// limit 255, code 0, its fixed part present, a link-local source for
	// RA and redirect) is exempt; the rest is nd_invalid, as malformed.
	nd := func(src netip.Addr, typ, hop uint8) []byte {
		s := ICMPOf(src, typ)
		s.TTL, s.PayloadLen, s.Dst = hop, 32, netip.MustParseAddr("ff02::1")
		return build(s)
	}
	linkLocal := netip.MustParseAddr("fe80::10")
	for _, typ := range []uint8{133, 134, 135, 136, 137} {
		add(Case{Name: "icmpv6 neighbour discovery exempt " + strconv.Itoa(int(typ)),
			Pre:   [][]byte{build(ICMPOf(SrcA6, 128))},
			Frame: nd(linkLocal, typ, 255), Pass: true, Reason: noRule})
	}
	for _, b := range []struct {
		name  string
		frame []byte
	}{
		{"neighbour solicitation with hop limit 64", nd(SrcA6, 135, 64)},
		{"neighbour advertisement with hop limit 254", nd(linkLocal, 136, 254)},
		{"router advertisement from a global address", nd(SrcA6, 134, 255)},
		{"redirect from a global address", nd(SrcA6, 137, 255)},
		{"neighbour solicitation with code 1", edit(nd(linkLocal, 135, 255), func(b []byte) { b[14+40+1] = 1 })},
		{"neighbour solicitation cut to 16 bytes", cut(nd(linkLocal, 135, 255), 14+40+16)},
	} {
		add(Case{Name: "icmpv6 " + b.name, Frame: b.frame, Reason: dataplane.ReasonNDInvalid})
		add(Case{Name: "icmpv6 " + b.name + " malformed pass", Spec: "malformed-pass", Frame: b.frame, Pass: true,
			Reason: dataplane.ReasonNDInvalid})
	}
	// ICMP type 135 over IPv4 is not neighbour discovery.
	add(Case{Name: "icmpv4 type 135 limited", Pre: [][]byte{build(ICMPOf(SrcA4, 8))},
		Frame: build(ICMPOf(SrcA4, 135)), Reason: dataplane.ReasonRule,
		Rules: []RuleWant{{"icmp", dataplane.VerdictDrop, dataplane.ReasonRule}}})

	// IPv4 options: IHL 5..15.
	for w := 0; w <= 10; w++ {
		s := UDPTo(SrcA4, 53)
		s.IPv4OptionWords = w
		pass("ipv4 ihl "+strconv.Itoa(5+w), build(s), adm, admit("dns"))
	}
	// IHL below 5: malformed L3, dropped by default, passed when asked.
	for ihl := range 5 {
		f := edit(build(UDPTo(SrcA4, 53)), func(b []byte) { b[14] = 0x40 | byte(ihl) })
		add(Case{Name: "ipv4 ihl " + strconv.Itoa(ihl), Frame: f, Reason: dataplane.ReasonMalformedL3})
		add(Case{Name: "ipv4 ihl " + strconv.Itoa(ihl) + " malformed pass", Spec: "malformed-pass", Frame: f,
			Pass: true, Reason: dataplane.ReasonMalformedL3})
	}
	// The source of an unparseable IPv4 header is not trusted: an
	// allowlisted address does not help.
	add(Case{Name: "allowlisted source with ihl 4 is malformed",
		Frame: edit(build(UDPTo(Allow4, 53)), func(b []byte) { b[14] = 0x44 }), Reason: dataplane.ReasonMalformedL3})

	// IPv4 fragments. A later fragment takes the port rules of its
	// datagram's first fragment (same source, destination, protocol and
	// IP ID); one whose first fragment was not seen is an orphan, dropped
	// when a port rule of its protocol takes fragments (the default).
	first := UDPTo(SrcA4, 53)
	first.MoreFragments = true
	pass("ipv4 first fragment has ports", build(first), adm, admit("dns"))
	later := UDPTo(SrcA4, 53)
	later.FragOffset, later.MoreFragments = 185, true
	add(Case{Name: "ipv4 non-first fragment takes its first fragment's rule", Pre: [][]byte{build(first)},
		Frame: build(later), Pass: true, Reason: adm, Rules: []RuleWant{admit("dns")}})
	orphan := later
	orphan.IPv4ID = 0x0bad
	add(Case{Name: "ipv4 non-first fragment, first not seen", Frame: build(orphan), Reason: dataplane.ReasonFragOrphan})
	last := later
	last.MoreFragments = false
	icmpFrag := ICMPOf(SrcA4, 8)
	icmpFrag.FragOffset = 3
	add(Case{Name: "ipv4 non-first icmp fragment matches the portless icmp rule",
		Pre: [][]byte{build(ICMPOf(SrcA4, 8))}, Frame: build(icmpFrag), Reason: dataplane.ReasonRule,
		Rules: []RuleWant{{"icmp", dataplane.VerdictDrop, dataplane.ReasonRule}}})
	v6first := UDPTo(SrcA6, 53)
	v6first.IPv6Ext, v6first.MoreFragments = []uint8{frame.ExtFragment}, true
	v6later := v6first
	v6later.FragOffset = 185
	v6orphan := v6later
	v6orphan.Src = netip.MustParseAddr("2001:db8:1::11") // another datagram
	for _, f := range []struct {
		name         string
		first, frame []byte
		orphan       []byte
	}{
		{"ipv4 non-first fragment", build(first), build(later), build(orphan)},
		{"ipv4 last fragment", build(first), build(last), nil},
		{"ipv6 non-first fragment", build(v6first), build(v6later), build(v6orphan)},
	} {
		add(Case{Name: f.name + ", fragments ignore", Spec: "frag-ignore", Pre: [][]byte{f.first}, Frame: f.frame,
			Pass: true, Reason: adm, Rules: []RuleWant{admit("udp-all")}})
		add(Case{Name: f.name + ", fragments limit", Spec: "frag-limit", Pre: [][]byte{f.first}, Frame: f.frame,
			Pass: true, Reason: adm, Rules: []RuleWant{admit("udp-all"), admit("dns")}})
		// The first fragment was dropped: so is the rest, before any rule.
		add(Case{Name: f.name + ", fragments drop", Spec: "frag-drop", Pre: [][]byte{f.first}, Frame: f.frame,
			Reason: dataplane.ReasonFragment, Rules: []RuleWant{{"dns", dataplane.VerdictDrop, dataplane.ReasonFragment}}})
		// An orphan is an orphan under every policy of the port rule: the
		// UDP rule without ports follows fragments too (issue 41), and an
		// IPv6 later fragment's Next Header is not its datagram's
		// protocol (issue 41, H2).
		if f.orphan != nil {
			for _, policy := range []string{"ignore", "limit", "drop"} {
				add(Case{Name: f.name + " without its first, fragments " + policy, Spec: "frag-" + policy,
					Frame: f.orphan, Reason: dataplane.ReasonFragOrphan})
			}
		}
	}
	for _, policy := range []string{"ignore", "limit", "drop"} {
		for _, f := range []struct {
			name  string
			frame []byte
		}{{"ipv4 first fragment", build(first)}, {"ipv6 first fragment", build(v6first)}} {
			want := []RuleWant{admit("udp-all"), admit("dns")}
			c := Case{Name: f.name + ", fragments " + policy, Spec: "frag-" + policy, Frame: f.frame, Pass: true, Reason: adm}
			if policy == "drop" {
				want = []RuleWant{admit("udp-all"), {"dns", dataplane.VerdictDrop, dataplane.ReasonFragment}}
				c.Pass, c.Reason = false, dataplane.ReasonFragment
			}
			c.Rules = want
			add(c)
		}
		// A TCP non-first fragment whose first was not seen: the TCP port
		// rule takes fragments (its default), so it is an orphan.
		tf := TCPTo(SrcA4, 80, SynFlags)
		tf.FragOffset = 10
		add(Case{Name: "tcp non-first fragment, first not seen, fragments " + policy, Spec: "frag-" + policy,
			Frame: build(tf), Reason: dataplane.ReasonFragOrphan})
	}

	// IPv6 extension headers.
	for _, e := range []struct {
		name string
		ext  []uint8
	}{
		{"hop-by-hop", []uint8{frame.ExtHopByHop}},
		{"routing", []uint8{frame.ExtRouting}},
		{"destination options", []uint8{frame.ExtDstOpts}},
		{"ah", []uint8{frame.ExtAH}},
		{"first fragment", []uint8{frame.ExtFragment}},
		{"chain of 6", []uint8{0, 43, 60, 51, 44, 60}},
		{"chain of 6 ending in a first fragment", []uint8{60, 60, 60, 60, 60, 44}},
	} {
		s := UDPTo(SrcA6, 53)
		s.IPv6Ext, s.MoreFragments = e.ext, true
		pass("ipv6 "+e.name, build(s), adm, admit("dns"))
		t := TCPTo(SrcA6, 80, SynFlags)
		t.IPv6Ext = e.ext
		pass("ipv6 "+e.name+" tcp syn", build(t), adm, admit("web-syn"))
	}
	nf := UDPTo(SrcA6, 53)
	nf.Src = netip.MustParseAddr("2001:db8:1::12") // no first fragment from it
	nf.IPv6Ext, nf.FragOffset = []uint8{frame.ExtFragment}, 100
	add(Case{Name: "ipv6 non-first fragment, first not seen", Frame: build(nf), Reason: dataplane.ReasonFragOrphan})
	// The fragment header names destination options next: what a later
	// fragment names is not its datagram's protocol (issue 41, H2), so
	// without its first fragment it is an orphan all the same.
	nf.IPv6Ext = []uint8{60, 60, 60, 60, 60, 44, 60}
	add(Case{Name: "ipv6 chain of 7 cut short by a non-first fragment", Frame: build(nf), Reason: dataplane.ReasonFragOrphan})
	nf7 := nf
	nf7.IPv6Ext = []uint8{60, 60, 60, 60, 60, 60, 44}
	add(Case{Name: "ipv6 chain of 7 ending in a non-first fragment, fragments limit", Spec: "frag-limit",
		Frame: build(nf7), Reason: dataplane.ReasonExtLimit})
	chain7 := UDPTo(SrcA6, 53)
	chain7.IPv6Ext = []uint8{0, 43, 60, 51, 44, 60, 60}
	add(Case{Name: "ipv6 chain of 7", Frame: build(chain7), Reason: dataplane.ReasonExtLimit})
	add(Case{Name: "ipv6 chain of 7 malformed pass", Spec: "malformed-pass", Frame: build(chain7), Pass: true,
		Reason: dataplane.ReasonExtLimit})

	// Truncated and invalid headers at every layer.
	v4 := build(UDPTo(SrcA4, 53))
	v6 := build(UDPTo(SrcA6, 53))
	vlan := UDPTo(SrcA4, 53)
	vlan.VLANs = frame.Tags(frame.EtherType8021AD, frame.EtherType8021Q)
	opts := UDPTo(SrcA4, 53)
	opts.IPv4OptionWords = 4
	ext := func(e uint8) []byte {
		s := UDPTo(SrcA6, 53)
		s.IPv6Ext = []uint8{e}
		return build(s)
	}
	t4 := build(TCPTo(SrcA4, 80, SynFlags))
	t6 := build(TCPTo(SrcA6, 80, SynFlags))
	i4 := build(ICMPOf(SrcA4, 8))
	i6 := build(ICMPOf(SrcA6, 128))
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
		{"ipv6 ext header start cut", cut(ext(frame.ExtHopByHop), l4v6+1), dataplane.ReasonMalformedL3},
		{"ipv6 hop-by-hop cut", cut(ext(frame.ExtHopByHop), l4v6+7), dataplane.ReasonMalformedL3},
		{"ipv6 routing cut", cut(ext(frame.ExtRouting), l4v6+4), dataplane.ReasonMalformedL3},
		{"ipv6 destination options cut", cut(ext(frame.ExtDstOpts), l4v6+2), dataplane.ReasonMalformedL3},
		{"ipv6 ah cut", cut(ext(frame.ExtAH), l4v6+23), dataplane.ReasonMalformedL3},
		{"ipv6 fragment header cut", cut(ext(frame.ExtFragment), l4v6+7), dataplane.ReasonMalformedL3},
		{"ipv6 hop-by-hop longer than the frame",
			edit(ext(frame.ExtHopByHop), func(b []byte) { b[l4v6+1] = 200 }), dataplane.ReasonMalformedL3},
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
		add(Case{Name: b.name, Frame: b.frame, Reason: b.reason})
		add(Case{Name: b.name + " malformed pass", Spec: "malformed-pass", Frame: b.frame, Pass: true, Reason: b.reason})
	}
	// TCP with doff 5..15 and a full header is fine, even when the options
	// the data offset claims are not in the frame (the program reads only
	// the fixed header).
	pass("ipv4 tcp doff 15", edit(t4, func(b []byte) { b[l4v4+12] = 0xf0 }), adm, admit("web-syn"))

	// Length fields the program does not use: it classifies a packet by the
	// headers present in the frame and never trusts the IPv4 total length,
	// the IPv6 payload length or the UDP length (the kernel's stack drops
	// such packets after XDP_PASS). Byte rules charge the frame's length.
	setLen := func(f []byte, at int, v uint16) []byte {
		return edit(f, func(b []byte) { b[at], b[at+1] = byte(v>>8), byte(v) })
	}
	for _, l := range []struct {
		name  string
		frame []byte
	}{
		{"ipv4 total length longer than the frame", setLen(v4, 14+2, 0xffff)},
		{"ipv4 total length shorter than the header", setLen(v4, 14+2, 8)},
		{"ipv4 total length zero", setLen(v4, 14+2, 0)},
		{"ipv6 payload length longer than the frame", setLen(v6, 14+4, 0xffff)},
		{"ipv6 payload length zero", setLen(v6, 14+4, 0)},
		{"ipv4 udp length zero", setLen(v4, l4v4+4, 0)},
		{"ipv6 udp length zero", setLen(v6, l4v6+4, 0)},
		{"ipv4 udp length longer than the datagram", setLen(v4, l4v4+4, 0xffff)},
		{"ipv4 udp length shorter than its header", setLen(v4, l4v4+4, 4)},
		{"ipv6 udp length longer than the datagram", setLen(v6, l4v6+4, 1000)},
		{"ipv4 udp without payload", build(func() frame.Spec { s := UDPTo(SrcA4, 53); s.PayloadLen = 0; return s }())},
		{"ipv6 udp without payload", build(func() frame.Spec { s := UDPTo(SrcA6, 53); s.PayloadLen = 0; return s }())},
	} {
		pass(l.name, l.frame, adm, admit("dns"))
	}
	// Runts and headers that claim more than the frame holds.
	noPayload := UDPTo(SrcA4, 53)
	noPayload.PayloadLen = 0
	for _, r := range []struct {
		name   string
		frame  []byte
		reason dataplane.Reason
	}{
		{"runt: ethernet only, 802.1q ethertype", cut(build(vlan), 14), dataplane.ReasonMalformedL2},
		{"runt: ethernet only, ipv6 ethertype", cut(v6, 14), dataplane.ReasonMalformedL3},
		{"runt: one byte of ipv4", cut(v4, 15), dataplane.ReasonMalformedL3},
		{"ipv4 ihl 15 past the end of the frame", edit(build(noPayload), func(b []byte) { b[14] = 0x4f }), dataplane.ReasonMalformedL3},
	} {
		add(Case{Name: r.name, Frame: r.frame, Reason: r.reason})
		add(Case{Name: r.name + " malformed pass", Spec: "malformed-pass", Frame: r.frame, Pass: true, Reason: r.reason})
	}
	// An IPv6 extension chain of 8 (past the bound of 6) behind QinQ.
	q8 := UDPTo(SrcA6, 53)
	q8.VLANs = frame.Tags(frame.EtherType8021AD, frame.EtherType8021Q)
	q8.IPv6Ext = []uint8{0, 60, 60, 60, 60, 60, 60, 60}
	add(Case{Name: "qinq ipv6 chain of 8", Frame: build(q8), Reason: dataplane.ReasonExtLimit})

	// Not IP.
	pass("arp", build(frame.Spec{EtherType: frame.EtherTypeARP, PayloadLen: 28}), dataplane.ReasonNotIP)
	pass("arp in a vlan", build(frame.Spec{VLANs: frame.Tags(frame.EtherType8021Q),
		EtherType: frame.EtherTypeARP, PayloadLen: 28}), dataplane.ReasonNotIP)
	pass("ethernet header only", build(frame.Spec{EtherType: 0x88cc}), dataplane.ReasonNotIP)

	// Allow and deny lists.
	for _, src := range []netip.Addr{Allow4, Allow6} {
		add(Case{Name: "allowlisted " + src.String() + " passes an empty bucket",
			Pre: [][]byte{build(UDPTo(SrcA4, 9000)), build(UDPTo(SrcA6, 9000))}, Frame: build(UDPTo(src, 9000)),
			Pass: true, Reason: dataplane.ReasonAllow})
	}
	pass("allowlisted v4 with tcp cut", cut(build(TCPTo(Allow4, 80, SynFlags)), l4v4+10), dataplane.ReasonAllow)
	pass("allowlisted v6 with udp cut", cut(build(UDPTo(Allow6, 53)), l4v6+3), dataplane.ReasonAllow)
	pass("allowlisted v6 with ext header cut",
		cut(build(func() frame.Spec { s := UDPTo(Allow6, 53); s.IPv6Ext = []uint8{0}; return s }()), l4v6+4),
		dataplane.ReasonAllow)
	pass("allowlisted v6 with ext chain of 7",
		build(func() frame.Spec {
			s := UDPTo(Allow6, 53)
			s.IPv6Ext = []uint8{0, 60, 60, 60, 60, 60, 60}
			return s
		}()),
		dataplane.ReasonAllow)
	for _, src := range []netip.Addr{Deny4, Deny6, netip.MustParseAddr("10.99.2.5")} {
		add(Case{Name: "denylisted " + src.String(), Frame: build(UDPTo(src, 54)), Reason: dataplane.ReasonDeny})
		add(Case{Name: "denylisted " + src.String() + " to a rule", Frame: build(UDPTo(src, 53)),
			Reason: dataplane.ReasonDeny})
	}
	add(Case{Name: "denylisted with tcp cut", Frame: cut(build(TCPTo(Deny4, 80, SynFlags)), l4v4+5),
		Reason: dataplane.ReasonDeny})
	add(Case{Name: "denylisted with tcp cut, malformed pass", Spec: "malformed-pass",
		Frame: cut(build(TCPTo(Deny6, 80, SynFlags)), l4v6+5), Reason: dataplane.ReasonDeny})
	for _, s := range []string{"10.77.1.1", "10.88.1.5", "10.99.1.5", "2001:db8:a:1::5"} {
		pass("allow beats deny "+s, build(UDPTo(netip.MustParseAddr(s), 9000)), dataplane.ReasonAllow)
	}

	// Per-rule sources.
	pass("sources v4 in", build(TCPTo(SrcRule4, 22, SynFlags)), adm, admit("ssh-src"))
	pass("sources v4 out", build(TCPTo(SrcOther4, 22, SynFlags)), noRule)
	pass("sources v6 in", build(TCPTo(SrcRule6, 22, AckFlags)), adm, admit("ssh-src"))
	pass("sources v6 out", build(TCPTo(SrcOther6, 22, AckFlags)), noRule)
	pass("sources, unlisted source", build(TCPTo(SrcA4, 22, SynFlags)), noRule)

	// Other IP protocols match no rule here.
	pass("gre", build(frame.Spec{Src: SrcA4, Proto: 47, PayloadLen: 20}), noRule)
	return cs
}
