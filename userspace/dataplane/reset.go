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

// resetDecide is the Go model of reset.h's xl_reset_decide: whether a SYN
// that a rule refused is answered, st, b and inc being the rule's bucket
// state, settings and the SYN's cost under them. Counts its class.
func (m *Model) resetDecide(frame []byte, pkt *Packet, slot int, st *bucketState, b *Bucket, inc, nowNS uint64) ResetOutcome {
	class := AnswerFlags
	if pkt.SYN {
		class = m.answerClass(frame, pkt)
	}
	out := resetOutcome(class)
	if out == ResetSent {
		UnitsClaim(&st.units, &st.tat, &st.resetTAT, b.Tol, nowNS<<TimeShift)
		if took, _ := b.Take(&st.resetTAT, nowNS, inc, inc); took == 0 {
			out, class = ResetRuleBudget, AnswerBudget
		}
	}
	if out == ResetSent {
		g := &m.Plan.Globals.Reset
		one := g.Inc(1)
		if took, _ := g.Take(&m.resetTAT, nowNS, one, one); took == 0 {
			out, class = ResetGlobalBudget, AnswerBudget
		}
	}
	m.AnswerCounters[slot].Reset[class]++
	return out
}
