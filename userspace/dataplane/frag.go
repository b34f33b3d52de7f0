package dataplane

import "encoding/binary"

// The Go model of bpf/frag.h's decision for a whole datagram at its first
// fragment (docs/dataplane.md, "Fragments").

// FragMinFrame is frag.h's XL_FRAG_MIN_FRAME: the frame a datagram's last
// fragment is counted as at least.
const FragMinFrame = 64

// fragState is what a datagram's first fragment decided (struct xl_frag).
type fragState struct {
	rules   uint64 // port rules charging each later fragment
	whole   uint64 // port rules that admitted the whole datagram at its first
	dropped int    // slot + 1 of the rule that dropped a fragment, or 0
	// bytes and frags are what the later fragments may still bring (whole).
	bytes, frags int32
	l4           uint8 // the first fragment's IP protocol
}

// fragTracked is frag.h's xl_frag_tracked: an IPv4 fragment's datagram is
// looked up when its protocol is followed, an IPv6 one's once any is.
func (m *Model) fragTracked(pkt *Packet) bool {
	if pkt.Family == 6 {
		return m.Plan.Globals.FragMatch[0]|m.Plan.Globals.FragMatch[1] != 0
	}
	return m.fragFollowed(pkt)
}

// fragSee is frag.h's xl_frag_see: the first fragment of a datagram that
// met no port rule marks its slot of xl_frag_seen.
func (m *Model) fragSee(pkt *Packet, nowNS uint64) {
	if m.fragSeen == nil {
		m.fragSeen = make(map[uint32]uint64)
	}
	m.fragSeen[pkt.FragKey().SeenSlot()] = nowNS&^0xff | uint64(pkt.L4)
}

// fragSeenAt is xl_frag_later's look in xl_frag_seen: whether the slot of
// the datagram of k was marked in the last FragSeenNS, and the protocol
// it recorded.
func (m *Model) fragSeenAt(k FragKey, nowNS uint64) (uint8, bool) {
	v := m.fragSeen[k.SeenSlot()]
	if v == 0 || int64(nowNS-v&^0xff) >= FragSeenNS {
		return 0, false
	}
	return uint8(v), true
}

// FragSize is frag.h's xl_frag_size: the fragments and frame bytes of the
// datagram of a first UDP fragment, from its UDP length, and false when
// that length does not go beyond the first fragment.
func FragSize(frame []byte, pkt *Packet) (bytes, frags uint64, ok bool) {
	off := pkt.L4Off
	if !pkt.FirstFrag || pkt.L4 != ipprotoUDP || off > 512 || off+8 > len(frame) {
		return 0, 0, false
	}
	total := uint64(binary.BigEndian.Uint16(frame[off+4:]))
	n := uint64(len(frame))
	if n <= uint64(off) || total <= n-uint64(off) {
		return 0, 0, false
	}
	chunk := n - uint64(off)
	frags = (total + chunk - 1) / chunk
	last := uint64(off) + total - (frags-1)*chunk
	return (frags-1)*n + max(last, FragMinFrame), frags, true
}

// fragWhole is frag.h's xl_frag_whole: whether rule r in slot decides for
// the whole datagram of the first fragment pkt, and then its cost.
func (m *Model) fragWhole(frame []byte, r *Rule, slot int, pkt *Packet) (uint64, bool) {
	if !pkt.FirstFrag || r.Flags&(RuleShadow|RulePerSource) != 0 || !m.fragFollowed(pkt) ||
		m.Plan.Globals.FragMatch[pkt.Proto]>>slot&1 == 0 {
		return 0, false
	}
	bytes, frags, ok := FragSize(frame, pkt)
	if !ok {
		return 0, false
	}
	if r.Flags&RuleBytes != 0 {
		return bytes, true
	}
	return frags, true
}

// FragTake is frag.h's xl_frag_take: a whole datagram's inc taken from
// the shared bucket b at once, when it has room for min(inc, tol).
func FragTake(tat *uint64, b Bucket, inc, nowNS uint64) bool {
	if inc > StaleAhead/2 {
		return false
	}
	now := nowNS << TimeShift
	ahead := int64(*tat - now)
	base := *tat
	if ahead < 0 || uint64(ahead) > StaleAhead {
		base = now
	}
	if int64(b.Tol)-int64(base-now) < int64(min(inc, b.Tol)) {
		return false
	}
	*tat = base + inc
	return true
}

// fragLater is frag.h's xl_frag_follow for a datagram decided whole: the
// later fragment of length bytes takes its share of what the first
// declared, and passes in the rules that decided (counted as theirs).
// False when it goes beyond that share.
func (m *Model) fragLater(e *fragState, length int) bool {
	if e.whole == 0 {
		return true
	}
	frags, bytes := e.frags, e.bytes
	e.frags--
	e.bytes -= int32(length)
	if frags <= 0 || bytes < int32(length) {
		return false
	}
	for i := range MaxRules {
		if e.whole>>i == 0 {
			break
		}
		if e.whole>>i&1 != 0 {
			m.Counters[i].count(VerdictPass, ReasonAdmit, uint64(length))
		}
	}
	return true
}

// fragRecord is frag.h's xl_frag_record: the first fragment's decision
// for its datagram.
func (m *Model) fragRecord(frame []byte, pkt *Packet, followed, whole uint64, dropped int) {
	if m.frags == nil {
		m.frags = make(map[FragKey]*fragState)
	}
	if dropped != 0 {
		whole = 0
	}
	e := &fragState{rules: followed &^ whole, whole: whole, dropped: dropped, l4: pkt.L4}
	if bytes, frags, ok := FragSize(frame, pkt); whole != 0 && ok {
		if n := uint64(len(frame)); bytes > n {
			e.bytes = int32(bytes - n)
		}
		e.frags = int32(frags - 1)
	}
	m.frags[pkt.FragKey()] = e
}
