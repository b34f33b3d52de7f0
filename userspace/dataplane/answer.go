package dataplane

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// What the host answers (bpf/answer.h, docs/robustness.md "What the host
// answers"): the one policy for the SYN cookies' SYN-ACKs and the resets
// of refused SYNs.

// Answer is the class of a SYN on an answering path (enum xl_answer): why
// it is, or is not, answered. answer.h checks in this order and the first
// that fails is the class.
type Answer uint8

const (
	AnswerOK     Answer = iota // answered (cookie: within the budget; reset: sent)
	AnswerShape                // not a plain IP header, or the TCP header cut short
	AnswerFlags                // SYN with RST, FIN or ACK
	AnswerSrcMAC               // multicast or broadcast Ethernet source
	AnswerSrcIP                // martian IP source
	AnswerDstMAC               // not to the interface's MAC
	AnswerDstIP                // not to one of the host's addresses
	AnswerSrcOwn               // from one of the host's own addresses
	AnswerSocket               // cookie: the host has a socket for the 4-tuple
	AnswerBudget               // the budget of answers is spent
	AnswerMax
)

var answerNames = [...]string{"ok", "shape", "flags", "src_mac", "src_ip", "dst_mac", "dst_ip", "src_own", "socket", "budget"}

func (a Answer) String() string {
	if int(a) < len(answerNames) {
		return answerNames[a]
	}
	return "invalid"
}

// AnswerCounters mirrors struct xl_answer_counters summed over CPUs: a
// rule's SYNs on each answering path by class, and the ACKs whose cookie
// the kernel made (left to it at TC).
type AnswerCounters struct {
	Cookie, Reset [AnswerMax]uint64
	KernelCookie  uint64
}

// Sub returns c - o.
func (c AnswerCounters) Sub(o AnswerCounters) AnswerCounters {
	for i := range c.Cookie {
		c.Cookie[i] -= o.Cookie[i]
		c.Reset[i] -= o.Reset[i]
	}
	c.KernelCookie -= o.KernelCookie
	return c
}

// Martian reports whether a is a source no answer goes to (answer.h's
// xl_answer_martian4/6): IPv4 0/8, 127/8, 224/4, 240/4; IPv6 ::/96,
// ::ffff:0:0/96, ff00::/8. An IPv4 address in an IPv6 frame is its
// IPv4-mapped form, martian as such.
func Martian(a netip.Addr) bool {
	if a.Is4() {
		b := a.As4()
		return b[0] == 0 || b[0] == 127 || b[0] >= 224
	}
	b := a.As16()
	if b[0] == 0xff {
		return true
	}
	return binary.BigEndian.Uint64(b[:8]) == 0 && (binary.BigEndian.Uint32(b[8:12]) == 0 || binary.BigEndian.Uint32(b[8:12]) == 0xffff)
}

// answerClass is the Go model of answer.h's xl_answer_class at nowNS.
func (m *Model) answerClass(frame []byte, pkt *Packet, nowNS uint64) Answer {
	l3 := pkt.L3Off
	iplen := 40
	if pkt.Family == 4 {
		iplen = 20
	}
	if l3 > 22 || (pkt.Family != 4 && pkt.Family != 6) || pkt.L4Off != l3+iplen {
		return AnswerShape
	}
	l4 := l3 + iplen
	if len(frame) < l4+20 {
		return AnswerShape
	}
	if hl := int(frame[l4+12]>>4) * 4; hl < 20 || len(frame) < l4+hl {
		return AnswerShape
	}
	const syn, rst, fin, ack = 0x02, 0x04, 0x01, 0x10
	if fl := frame[l4+13]; fl&syn == 0 || fl&(rst|fin|ack) != 0 {
		return AnswerFlags
	}
	if frame[6]&1 != 0 {
		return AnswerSrcMAC
	}
	var src, dst netip.Addr
	if pkt.Family == 4 {
		src, dst = netip.AddrFrom4([4]byte(frame[l3+12:l3+16])), netip.AddrFrom4([4]byte(frame[l3+16:l3+20]))
	} else {
		src, dst = netip.AddrFrom16([16]byte(frame[l3+8:l3+24])), netip.AddrFrom16([16]byte(frame[l3+24:l3+40]))
	}
	if Martian(src) {
		return AnswerSrcIP
	}
	// A map no daemon maintains says nothing of the destination.
	if !m.Host.Maintained(nowNS) {
		return AnswerDstIP
	}
	if !m.Host.Has(MACKey(net.HardwareAddr(frame[0:6]))) {
		return AnswerDstMAC
	}
	// The kernel's key is the frame's family: an IPv6 frame's address is
	// an IPv6 key (no IPv4-mapped one is ever answered: Martian).
	if !m.Host.Has(familyKey(dst, pkt.Family)) {
		return AnswerDstIP
	}
	if m.Host.Has(familyKey(src, pkt.Family)) {
		return AnswerSrcOwn
	}
	return AnswerOK
}

// familyKey is the host key of a as the kernel builds it from a frame of
// family: the IPv6 kind for every address of an IPv6 header.
func familyKey(a netip.Addr, family uint8) HostKey {
	if family == 6 {
		return HostKey{Kind: HostIPv6, Addr: a.As16()}
	}
	return IPKey(a)
}

// resetOutcome is reset.h's xl_reset_outcome: the reset outcome of a SYN
// of class (before the budgets).
func resetOutcome(a Answer) ResetOutcome {
	switch a {
	case AnswerOK:
		return ResetSent
	case AnswerDstMAC, AnswerDstIP:
		return ResetNotLocal
	case AnswerSrcMAC, AnswerSrcIP, AnswerSrcOwn:
		return ResetNotUnicast
	}
	return ResetUnsupported
}

// XDPTxRules names the rules of s that answer SYNs from XDP with XDP_TX
// (syn_cookies, refuse: reset), whose answers a veth delivers only to a
// peer with an XDP program (loader.CheckXDPTxPeer).
func XDPTxRules(s *Spec) []string {
	var names []string
	if s == nil {
		return nil
	}
	for _, r := range s.Rules {
		if (r.SynCookies != "" && r.SynCookies != CookiesOff) || r.Refuse == "reset" {
			names = append(names, r.Name)
		}
	}
	return names
}
