package dataplane

import (
	"net"
	"net/netip"
)

// HostKey is one address the host owns (struct xl_host_key): an IP of any
// interface of its namespace, or the MAC of the interface the program is
// attached to.
type HostKey struct {
	Kind uint32 // HostMAC, HostIPv4 or HostIPv6
	Addr [16]byte
}

// MACKey is the key of an interface's MAC.
func MACKey(mac net.HardwareAddr) HostKey {
	k := HostKey{Kind: HostMAC}
	copy(k.Addr[:], mac)
	return k
}

// IPKey is the key of an IP address (an IPv4-mapped IPv6 address is IPv4).
func IPKey(a netip.Addr) HostKey {
	a = a.Unmap()
	if a.Is4() {
		k := HostKey{Kind: HostIPv4}
		a4 := a.As4()
		copy(k.Addr[:], a4[:])
		return k
	}
	return HostKey{Kind: HostIPv6, Addr: a.As16()}
}

// HostAddrs is the content of xl_host_addrs: each address the host owns,
// with the index of the interface that holds it.
type HostAddrs map[HostKey]uint32

// Has reports whether k is one of the host's addresses.
func (h HostAddrs) Has(k HostKey) bool {
	_, ok := h[k]
	return ok
}

// Reset budget of all rules (xl_globals.reset) when the Spec gives none:
// resets per second and burst. A reset is 54 to 74 bytes: at this rate a
// spoofed SYN flood reflects at most about 74 kB/s from the host, whatever
// the number of rules.
const (
	DefaultResetRate  = 1000
	DefaultResetBurst = 1000
)

func notUnicast4(a [4]byte) bool { return a[0] >= 224 || a == [4]byte{} }

func notUnicast6(a [16]byte) bool { return a[0] == 0xff || a == [16]byte{} }

// resetDecide is the Go model of reset.h's xl_reset_decide: whether a SYN
// that a rule refused is answered, st, b and inc being the rule's bucket
// state, settings and the SYN's cost under them.
func (m *Model) resetDecide(frame []byte, pkt *Packet, st *bucketState, b *Bucket, inc, nowNS uint64) ResetOutcome {
	l3 := pkt.L3Off
	if l3 > 22 || !pkt.SYN {
		return ResetUnsupported
	}
	if frame[0]&1 != 0 || frame[6]&1 != 0 {
		return ResetNotUnicast // the group bit: multicast, broadcast included
	}
	var dst HostKey
	switch {
	case pkt.Family == 4 && pkt.L4Off == l3+20:
		src, d := [4]byte(frame[l3+12:l3+16]), [4]byte(frame[l3+16:l3+20])
		if notUnicast4(src) || notUnicast4(d) {
			return ResetNotUnicast
		}
		dst = IPKey(netip.AddrFrom4(d))
	case pkt.Family == 6 && pkt.L4Off == l3+40:
		src, d := [16]byte(frame[l3+8:l3+24]), [16]byte(frame[l3+24:l3+40])
		if notUnicast6(src) || notUnicast6(d) {
			return ResetNotUnicast
		}
		dst = HostKey{Kind: HostIPv6, Addr: d}
	default:
		return ResetUnsupported
	}
	if took, _ := b.Take(&st.resetTAT, nowNS, inc, inc); took == 0 {
		return ResetRuleBudget
	}
	if !m.Host.Has(MACKey(net.HardwareAddr(frame[0:6]))) || !m.Host.Has(dst) {
		return ResetNotLocal
	}
	g := &m.Plan.Globals.Reset
	one := g.Inc(1)
	if took, _ := g.Take(&m.resetTAT, nowNS, one, one); took == 0 {
		return ResetGlobalBudget
	}
	return ResetSent
}
