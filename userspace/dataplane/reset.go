package dataplane

import (
	"bytes"
	"cmp"
	"maps"
	"net"
	"net/netip"
	"slices"
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
		class = m.answerClass(frame, pkt, nowNS)
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

// IncompleteKey is the key of the mark that xl_host_addrs lists only part
// of the host's addresses (HostIncomplete): an address not in the map may
// still be the host's. The SYN-cookie path then leaves a SYN to an
// unlisted destination to the rule's bucket and the kernel, as it does
// without cookies, rather than dropping it (syncookie.h).
var IncompleteKey = HostKey{Kind: HostIncomplete}

// Incomplete reports whether h carries the mark IncompleteKey.
func (h HostAddrs) Incomplete() bool { return h.Has(IncompleteKey) }

// LeaseKey is the key of the daemon's lease on xl_host_addrs (HostLease):
// its value is the end of the lease, in whole seconds of the program's
// clock. Only the daemon follows the host's addresses; once its lease has
// ended (a daemon stopped, crashed, crash-looping), the map may miss
// addresses the host took since and list some it gave up, so the
// answering policy trusts it no more (answer.h, xl_answer_maintained).
var LeaseKey = HostKey{Kind: HostLease}

// Maintained is answer.h's xl_answer_maintained: whether h carries a
// lease that has not ended at nowNS.
func (h HostAddrs) Maintained(nowNS uint64) bool {
	end, ok := h[LeaseKey]
	return ok && nowNS/1e9 < uint64(end)
}

// LeaseEnd is the end of a lease taken at nowNS (seconds, as the lease
// entry holds it): HostLeaseSeconds after the second nowNS is in.
func LeaseEnd(nowNS uint64) uint32 { return uint32(nowNS/1e9) + HostLeaseSeconds }

// SelectHostAddrs is what xl_host_addrs holds of the host's addresses all
// (loader.HostAddrs: the attached interface's MAC and every IP of the
// namespace, with the interface that holds it) when it has room for
// capacity entries, and how many it leaves out. When all fit, all.
// Otherwise one entry is the mark IncompleteKey and the others go, in this
// order: the MAC; the IPs of the interfaces of first, in its order (the
// daemon gives the interface attached, then the other interfaces it is
// attached to: the addresses that frames on them are for); then the rest
// by interface index. Within an interface IPv4 before IPv6, each by
// address. The choice depends only on the addresses, not on the order
// they were read in or on what the map held before.
func SelectHostAddrs(all HostAddrs, capacity int, first ...uint32) (listed HostAddrs, unlisted int) {
	all = maps.Clone(all)
	delete(all, IncompleteKey)
	delete(all, LeaseKey)
	if len(all) <= capacity {
		return all, 0
	}
	rank := func(k HostKey, ifindex uint32) int {
		if k.Kind == HostMAC {
			return 0
		}
		if i := slices.Index(first, ifindex); i >= 0 {
			return 1 + i
		}
		return 1 + len(first)
	}
	keys := slices.Collect(maps.Keys(all))
	slices.SortFunc(keys, func(a, b HostKey) int {
		ia, ib := all[a], all[b]
		return cmp.Or(cmp.Compare(rank(a, ia), rank(b, ib)), cmp.Compare(ia, ib),
			cmp.Compare(a.Kind, b.Kind), bytes.Compare(a.Addr[:], b.Addr[:]))
	})
	n := max(capacity-1, 0)
	listed = make(HostAddrs, n+1)
	for _, k := range keys[:n] {
		listed[k] = all[k]
	}
	if capacity > 0 {
		listed[IncompleteKey] = 0
	}
	return listed, len(keys) - n
}
