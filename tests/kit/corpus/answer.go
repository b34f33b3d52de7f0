package corpus

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The answering corpus (bpf/answer.h, docs/robustness.md "What the host
// answers"): crafted SYNs for each class of the answering policy, on both
// paths that answer from XDP, the SYN cookies and the resets of refused
// SYNs, each with the program's exact outcome. maps.TestAnswerClasses runs
// them through the kernel and the model; tests.TestSpoofedSYNsUnanswered
// sends the cookie path's live; TestAnswerTable generates the table of
// docs/robustness.md from them.

// Answering paths (AnswerCase.Path).
const (
	PathCookie = "cookie" // rule "cookies": syn_cookies: always on port CookiePort
	PathReset  = "reset"  // rule "resets" on port ResetPort, every SYN refused by its breaker gate
)

// Ports of the answering rules.
const (
	CookiePort = 80
	ResetPort  = 81
)

// XDP return codes of an AnswerCase.
const (
	XDPDrop = 1
	XDPPass = 2
	XDPTx   = 3
)

// AnswerHost is the host the answering frames are addressed to, and the
// peers they come from.
type AnswerHost struct {
	MAC, PeerMAC net.HardwareAddr
	IP4, IP6     netip.Addr // the host's, the frames' destination
	Own4, Own6   netip.Addr // another address of the host's (may equal IP4, IP6)
	Peer4, Peer6 netip.Addr // a unicast peer's
	// PortBase, when set, gives each frame of the list its own source
	// port, PortBase + its index (the live test tells the answers apart
	// by it); 0: every frame from port 40000.
	PortBase uint16
}

// DefaultAnswerHost is the kernel tier's host (maps' defaultHost): the
// frame package's MACs and 192.0.2.1 / 2001:db8::1, which also holds
// 10.9.0.1 and 2001:db8::80.
func DefaultAnswerHost() AnswerHost {
	return AnswerHost{
		MAC:     net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02},
		PeerMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01},
		IP4:     netip.MustParseAddr("192.0.2.1"), IP6: netip.MustParseAddr("2001:db8::1"),
		Own4: netip.MustParseAddr("10.9.0.1"), Own6: netip.MustParseAddr("2001:db8::80"),
		Peer4: netip.MustParseAddr("198.51.100.7"), Peer6: netip.MustParseAddr("2001:db8:1::7"),
	}
}

// AnswerSpecs are the rule sets of the answering cases: "answer" for most,
// and two with a budget of one answer, which a case's Pre frame spends.
func AnswerSpecs() map[string]*dataplane.Spec {
	rules := func() []dataplane.RuleSpec {
		return []dataplane.RuleSpec{
			{Name: "cookies", Protocol: "tcp", Ports: Ports(CookiePort, CookiePort), SynOnly: true, Rate: 1000, Burst: 1000, SynCookies: "always"},
			{Name: "resets", Protocol: "tcp", Ports: Ports(ResetPort, ResetPort), SynOnly: true, Rate: 1e6, Burst: 1e6},
		}
	}
	return map[string]*dataplane.Spec{
		"answer":        {Rules: rules()},
		"cookie-budget": {CookieRate: 1, Rules: rules()},
		"reset-budget":  {ResetRate: 1, ResetBurst: 1, Rules: rules()},
	}
}

// AnswerRule is the rule of a path.
func AnswerRule(path string) string {
	if path == PathCookie {
		return "cookies"
	}
	return "resets"
}

// AnswerCase is one SYN on an answering path and its exact outcome.
type AnswerCase struct {
	Name   string
	Spec   string   // key of AnswerSpecs
	Path   string   // PathCookie or PathReset
	Pre    [][]byte // run first, at the same instant (they spend a budget)
	Frame  []byte
	Ret    uint32           // XDP return code
	Reason dataplane.Reason // the rule's, and the global slot's
	Class  dataplane.Answer // counted in xl_answer_stats on the path
	// SrcPort is the frame's TCP source port (AnswerHost.PortBase).
	SrcPort uint16
	// Reset is the reset path's outcome counted in xl_counters.resets
	// (the rule's `resets` counters).
	Reset dataplane.ResetOutcome
}

// Legacy names the counter that the path counted before xl_answer_stats:
// the cookie path's outcome of xl_cookie_counters (sent, over_budget,
// not_local, unanswerable; to_socket), the reset path's xl_counters.resets.
func (c *AnswerCase) Legacy() string {
	if c.Path == PathReset {
		return "resets " + c.Reset.String()
	}
	switch c.Class {
	case dataplane.AnswerOK:
		return "syn_cookies sent"
	case dataplane.AnswerBudget:
		return "syn_cookies over_budget"
	case dataplane.AnswerSocket:
		return "syn_cookies to_socket"
	case dataplane.AnswerDstMAC, dataplane.AnswerDstIP:
		return "syn_cookies not_local"
	}
	return "syn_cookies unanswerable"
}

// answerFrame is one frame of the answering corpus, on no path yet.
type answerFrame struct {
	name  string
	class dataplane.Answer
	frame func(port uint16) []byte
}

// discardName is the answering case whose TCP header runs past the frame:
// of class shape, but dropped as malformed_l4 by the cookie path, since
// Linux would discard it.
const discardName = "TCP data offset 15 past the frame"

// AnswerCases returns every answering case for host h, on both paths.
func AnswerCases(h AnswerHost) []AnswerCase {
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	ip := netip.MustParseAddr
	sport := uint16(40000)
	syn := func(src netip.Addr, edit func(*frame.Spec)) func(uint16) []byte {
		return func(port uint16) []byte {
			s := frame.Spec{SrcMAC: h.PeerMAC, DstMAC: h.MAC, Src: src, Dst: h.IP4, Proto: frame.ProtoTCP,
				SrcPort: sport, DstPort: port, TCPFlags: frame.TCPSyn, TCPSeq: 777000}
			if src.Is6() {
				s.Dst = h.IP6
			}
			if edit != nil {
				edit(&s)
			}
			return withSYNOptions(s)
		}
	}
	v4, v6 := h.Peer4, h.Peer6
	flags := func(f uint8) func(*frame.Spec) { return func(s *frame.Spec) { s.TCPFlags = f } }
	srcMAC := func(m string) func(*frame.Spec) { return func(s *frame.Spec) { s.SrcMAC = mac(m) } }
	dstMAC := func(m string) func(*frame.Spec) { return func(s *frame.Spec) { s.DstMAC = mac(m) } }
	dst := func(a string) func(*frame.Spec) { return func(s *frame.Spec) { s.Dst = ip(a) } }
	ok, shape, fl := dataplane.AnswerOK, dataplane.AnswerShape, dataplane.AnswerFlags
	sm, si, dm, di, so := dataplane.AnswerSrcMAC, dataplane.AnswerSrcIP, dataplane.AnswerDstMAC, dataplane.AnswerDstIP, dataplane.AnswerSrcOwn
	frames := []answerFrame{
		{"unicast IPv4 source (the control)", ok, syn(v4, nil)},
		{"unicast IPv6 source", ok, syn(v6, nil)},
		{"IPv4 link-local source 169.254.7.7", ok, syn(ip("169.254.7.7"), nil)},
		{"IPv6 link-local source fe80::7", ok, syn(ip("fe80::7"), nil)},
		{"SYN|PSH", ok, syn(v4, flags(frame.TCPSyn|frame.TCPPsh))},
		{"SYN|URG", ok, syn(v4, flags(frame.TCPSyn|frame.TCPUrg))},
		{"SYN|ECE|CWR (ECN setup)", ok, syn(v4, flags(frame.TCPSyn|0x40|0x80))},
		{"in two VLAN tags", ok, syn(v4, func(s *frame.Spec) { s.VLANs = frame.Tags(frame.EtherType8021AD, frame.EtherType8021Q) })},
		{"IPv4 options", shape, syn(v4, func(s *frame.Spec) { s.IPv4OptionWords = 1 })},
		{"IPv6 hop-by-hop header", shape, syn(v6, func(s *frame.Spec) { s.IPv6Ext = []uint8{0} })},
		{discardName, shape, func(port uint16) []byte {
			b := syn(v4, nil)(port)
			b[14+20+12] = 0xf0 // 60 bytes, of which 40 are there
			return b
		}},
		{"SYN|RST", fl, syn(v4, flags(frame.TCPSyn|frame.TCPRst))},
		{"SYN|FIN", fl, syn(v4, flags(frame.TCPSyn|frame.TCPFin))},
		{"SYN|FIN|PSH|URG", fl, syn(v4, flags(frame.TCPSyn|frame.TCPFin|frame.TCPPsh|frame.TCPUrg))},
		{"IPv6 SYN|RST", fl, syn(v6, flags(frame.TCPSyn|frame.TCPRst))},
		{"source MAC ff:ff:ff:ff:ff:ff", sm, syn(v4, srcMAC("ff:ff:ff:ff:ff:ff"))},
		{"source MAC 01:00:5e:00:00:01 (IPv4 multicast)", sm, syn(v4, srcMAC("01:00:5e:00:00:01"))},
		{"IPv6, source MAC 33:33:00:00:00:01", sm, syn(v6, srcMAC("33:33:00:00:00:01"))},
		{"source 255.255.255.255", si, syn(ip("255.255.255.255"), nil)},
		{"source 224.0.0.1", si, syn(ip("224.0.0.1"), nil)},
		{"source 240.0.0.1 (reserved)", si, syn(ip("240.0.0.1"), nil)},
		{"source 0.0.0.0", si, syn(ip("0.0.0.0"), nil)},
		{"source 0.1.2.3 (this network)", si, syn(ip("0.1.2.3"), nil)},
		{"source 127.0.0.1", si, syn(ip("127.0.0.1"), nil)},
		{"source ff02::1", si, syn(ip("ff02::1"), nil)},
		{"source ::", si, syn(ip("::"), nil)},
		{"source ::1", si, syn(ip("::1"), nil)},
		{"source ::ffff:198.51.100.7 (IPv4-mapped)", si, syn(ip("::ffff:198.51.100.7"), nil)},
		{"source ::198.51.100.7 (IPv4-compatible)", si, syn(ip("::198.51.100.7"), nil)},
		{"to another host's MAC", dm, syn(v4, dstMAC("02:00:00:00:00:99"))},
		{"to MAC ff:ff:ff:ff:ff:ff", dm, syn(v4, dstMAC("ff:ff:ff:ff:ff:ff"))},
		{"to MAC 01:00:5e:00:00:01", dm, syn(v4, dstMAC("01:00:5e:00:00:01"))},
		{"to 203.0.113.1 (not the host's)", di, syn(v4, dst("203.0.113.1"))},
		{"to 255.255.255.255", di, syn(v4, dst("255.255.255.255"))},
		{"to 224.0.0.1", di, syn(v4, dst("224.0.0.1"))},
		{"to ff02::1", di, syn(v6, dst("ff02::1"))},
		{"from the host's other address", so, syn(h.Own4, nil)},
		{"from the destination itself (LAND)", so, syn(h.IP4, nil)},
		{"IPv6 from the host's other address", so, syn(h.Own6, nil)},
	}
	var cs []AnswerCase
	for _, path := range []string{PathCookie, PathReset} {
		port := uint16(CookiePort)
		if path == PathReset {
			port = ResetPort
		}
		for i, f := range frames {
			if h.PortBase != 0 {
				sport = h.PortBase + uint16(i)
			}
			c := AnswerCase{Name: f.name, Spec: "answer", Path: path, Frame: f.frame(port), Class: f.class, SrcPort: sport}
			c.Ret, c.Reason, c.Reset = answerOutcome(path, f.class)
			if f.name == discardName && path == PathCookie {
				// Linux would discard it: dropped as malformed, never
				// given to the rule's bucket (syncookie.h,
				// XL_ANSWER_DISCARD).
				c.Ret, c.Reason = XDPDrop, dataplane.ReasonMalformedL4
			}
			cs = append(cs, c)
		}
		// The budget of answers, spent by one answer at the same instant.
		if h.PortBase != 0 {
			sport = h.PortBase + uint16(len(frames))
		}
		ctl := syn(v4, nil)
		pre := syn(ip("198.51.100.8"), nil)(port)
		c := AnswerCase{Name: "after the budget's one answer", Spec: path + "-budget", Path: path,
			Pre: [][]byte{pre}, Frame: ctl(port), Class: dataplane.AnswerBudget, SrcPort: sport}
		c.Ret, c.Reason, c.Reset = answerOutcome(path, dataplane.AnswerBudget)
		if path == PathReset {
			c.Reset = dataplane.ResetGlobalBudget
		}
		cs = append(cs, c)
	}
	return cs
}

// answerOutcome is what each path does with a SYN of class: the cookie
// path answers, drops what no host should answer, and gives the rule's
// bucket (here with room: XDP_PASS) what XDP cannot answer; the reset path
// (a SYN its breaker refused) answers or drops, and counts the outcome in
// the rule's resets: unsupported (shape, flags), not_unicast (a source
// never answered), not_local (not to the host), the budgets.
func answerOutcome(path string, class dataplane.Answer) (uint32, dataplane.Reason, dataplane.ResetOutcome) {
	if path == PathReset {
		out := dataplane.ResetUnsupported
		switch class {
		case dataplane.AnswerOK:
			return XDPTx, dataplane.ReasonBreaker, dataplane.ResetSent
		case dataplane.AnswerSrcMAC, dataplane.AnswerSrcIP, dataplane.AnswerSrcOwn:
			out = dataplane.ResetNotUnicast
		case dataplane.AnswerDstMAC, dataplane.AnswerDstIP:
			out = dataplane.ResetNotLocal
		case dataplane.AnswerBudget:
			out = dataplane.ResetRuleBudget
		}
		return XDPDrop, dataplane.ReasonBreaker, out
	}
	switch class {
	case dataplane.AnswerOK:
		return XDPTx, dataplane.ReasonCookie, 0
	case dataplane.AnswerShape, dataplane.AnswerSocket, dataplane.AnswerBudget:
		return XDPPass, dataplane.ReasonAdmit, 0
	}
	return XDPDrop, dataplane.ReasonCookie, 0
}

// AnswerClassDoc says what each class of the answering policy checks
// (docs/robustness.md's table).
var AnswerClassDoc = map[dataplane.Answer]string{
	dataplane.AnswerOK:     "passes every check below",
	dataplane.AnswerShape:  "not a plain IP header (IPv4 options, IPv6 extension headers, three tags), or the TCP header cut short",
	dataplane.AnswerFlags:  "SYN with RST, FIN or ACK (URG, PSH, ECE, CWR are allowed)",
	dataplane.AnswerSrcMAC: "multicast or broadcast Ethernet source",
	dataplane.AnswerSrcIP:  "martian source: 0/8, 127/8, 224/4, 240/4; ::/96, ::ffff:0:0/96, ff00::/8 (link-local sources are answered)",
	dataplane.AnswerDstMAC: "not to the interface's MAC (broadcast and multicast included)",
	dataplane.AnswerDstIP:  "not to one of the host's addresses (broadcast and multicast included)",
	dataplane.AnswerSrcOwn: "from one of the host's own addresses",
	dataplane.AnswerSocket: "the host has a socket other than a listener for the 4-tuple (TIME_WAIT, open; one in the SYN queue drops the SYN unanswered, docs/dataplane.md), or its listener is MPTCP (which `bpf_sk_assign_tcp_reqsk` refuses; its SYNs take the share of the SYNs XDP cannot answer, not this one: a flood spoofs them)",
	dataplane.AnswerBudget: "the budget of answers is spent (cookies: `syn_cookies.answer_rate`; resets: the rule's and the host's)",
}

// AnswerVerdict describes what path does with a SYN of class, as
// answerOutcome decides it.
func AnswerVerdict(path string, class dataplane.Answer) string {
	ret, reason, _ := answerOutcome(path, class)
	switch {
	case ret == XDPTx && path == PathCookie:
		return "answered: SYN-ACK with a cookie (XDP_TX)"
	case ret == XDPTx:
		return "answered: RST (XDP_TX)"
	case ret == XDPPass:
		share := "the rule's share for such SYNs"
		if class == dataplane.AnswerSocket {
			share = "the rule's share for SYNs to the host's sockets"
		}
		v := "not answered: " + share + " (a quarter of its rate and burst), then its gates and bucket decide, as without cookies (here admitted: XDP_PASS, `admit`)"
		if class == dataplane.AnswerShape {
			v += "; a TCP header past the frame or its IP packet is dropped (`malformed_l4`): Linux would discard it"
		}
		return v
	case path == PathReset:
		return "dropped unanswered (the refusal's reason)"
	}
	return "dropped unanswered (`" + reason.String() + "`)"
}

// synOptions are the TCP options of a Linux SYN: MSS 1460, SACK permitted,
// timestamps, NOP, window scale 7 (20 bytes). A SYN that carries them is
// answered in place, without growing the frame (which a veth's frames
// often have no tailroom for).
var synOptions = []byte{2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 1, 0x86, 0x9f, 0, 0, 0, 0, 1, 3, 3, 7}

// withSYNOptions builds the SYN s describes with synOptions after its TCP
// header, lengths and checksums fixed.
func withSYNOptions(s frame.Spec) []byte {
	b, lay, err := frame.BuildLayout(s)
	if err != nil {
		panic(err)
	}
	l4 := lay.L4
	out := append(append(append([]byte{}, b[:l4+20]...), synOptions...), b[l4+20:]...)
	if out[lay.L3]>>4 == 4 {
		binary.BigEndian.PutUint16(out[lay.L3+2:], binary.BigEndian.Uint16(out[lay.L3+2:])+uint16(len(synOptions)))
		out[lay.L3+10], out[lay.L3+11] = 0, 0
		binary.BigEndian.PutUint16(out[lay.L3+10:], ^uint16(frame.OnesSum(0, out[lay.L3:l4])))
	} else {
		binary.BigEndian.PutUint16(out[lay.L3+4:], binary.BigEndian.Uint16(out[lay.L3+4:])+uint16(len(synOptions)))
	}
	out[l4+12] = byte((20+len(synOptions))/4) << 4
	out[l4+16], out[l4+17] = 0, 0
	var pseudo uint32
	tcpLen := uint32(len(out) - l4)
	if out[lay.L3]>>4 == 4 {
		pseudo = frame.OnesSum(0, out[lay.L3+12:lay.L3+20]) + 6 + tcpLen
	} else {
		pseudo = frame.OnesSum(0, out[lay.L3+8:lay.L3+40]) + 6 + tcpLen
	}
	binary.BigEndian.PutUint16(out[l4+16:], ^uint16(frame.OnesSum(pseudo, out[l4:])))
	return out
}
