package dataplane

import (
	"encoding/binary"
	"net/netip"
)

// Packet is what the parser extracts from a frame (struct xl_pkt).
type Packet struct {
	Family   uint8 // 4, 6, or 0 when not IP
	Src      netip.Addr
	Proto    Proto
	L4       uint8 // IP protocol number
	DstPort  uint16
	HasPort  bool
	SYN      bool // TCP SYN without ACK
	Fragment bool // non-first fragment: no L4 header
	// FirstFrag: the first fragment of a fragmented datagram.
	FirstFrag bool
	Exempt    bool // valid ICMPv6 neighbour discovery: never rule-limited
	Len       int
	// L3Off and L4Off are the offsets of the IP and L4 headers (L4Off
	// valid once the IP stage parsed).
	L3Off, L4Off int
	// Fragments only (Fragment or FirstFrag): the datagram's destination
	// and identification (struct xl_frag_key).
	Dst    netip.Addr
	FragID uint32
	// HopLimit is the IPv6 hop limit (0 for IPv4).
	HopLimit uint8
}

// FragKey identifies a fragmented datagram (struct xl_frag_key).
type FragKey struct {
	Src, Dst netip.Addr
	ID       uint32
	L4       uint8
}

// FragKey returns the key of the packet's datagram (fragments only): an
// IPv6 datagram's has no protocol, which a later fragment does not tell.
func (p *Packet) FragKey() FragKey {
	k := FragKey{Src: p.Src, Dst: p.Dst, ID: p.FragID, L4: p.L4}
	if p.Family == 6 {
		k.L4 = 0
	}
	return k
}

// SeenSlot is frag.h's xl_frag_seen_slot: the slot of xl_frag_seen of
// the datagram of k, a hash of struct xl_frag_key's ten words.
func (k FragKey) SeenSlot() uint32 {
	var b [40]byte
	if k.Src.Is4() {
		a, d := k.Src.As4(), k.Dst.As4()
		copy(b[0:], a[:])
		copy(b[16:], d[:])
		b[36] = 4
	} else {
		a, d := k.Src.As16(), k.Dst.As16()
		copy(b[0:], a[:])
		copy(b[16:], d[:])
		b[36] = 6
	}
	binary.LittleEndian.PutUint32(b[32:], k.ID)
	b[37] = k.L4
	var h uint32
	for i := 0; i < 40; i += 4 {
		h = (h ^ binary.LittleEndian.Uint32(b[i:])) * 0x9e3779b1
	}
	return (h ^ h>>16) & (FragSeenSlots - 1)
}

// ParseResult says how far parsing got. Stage results other than ParseOK
// carry the reason the kernel counts.
type ParseResult uint8

const (
	ParseOK ParseResult = iota
	ParseNotIP
	ParseMalformedL2
	ParseMalformedL3
	ParseExtLimit
	ParseMalformedL4
	ParseVLANDepth
	ParseNDInvalid
)

const (
	ethPIPv4   = 0x0800
	ethPIPv6   = 0x86dd
	ethP8021Q  = 0x8100
	ethP8021AD = 0x88a8

	ipprotoHopOpts  = 0
	ipprotoICMP     = 1
	ipprotoTCP      = 6
	ipprotoUDP      = 17
	ipprotoRouting  = 43
	ipprotoFragment = 44
	ipprotoAH       = 51
	ipprotoICMPv6   = 58
	ipprotoDstOpts  = 60
)

// Parse is the Go model of parse.h. It stops at the first stage that
// fails; the packet holds what was parsed up to then (the source address
// is known from the IP stage on, which the allowlist needs).
func Parse(frame []byte) (Packet, ParseResult) {
	pkt := Packet{Len: len(frame)}
	c := cursor{b: frame}
	if c.pull(14) == nil {
		return pkt, ParseMalformedL2
	}
	ethType := binary.BigEndian.Uint16(frame[12:14])
	for range VLANMax {
		if ethType != ethP8021Q && ethType != ethP8021AD {
			break
		}
		v := c.pull(4)
		if v == nil {
			return pkt, ParseMalformedL2
		}
		ethType = binary.BigEndian.Uint16(v[2:4])
	}
	if ethType == ethP8021Q || ethType == ethP8021AD {
		return pkt, ParseVLANDepth
	}
	pkt.L3Off = c.pos
	var l4 int
	var res ParseResult
	switch ethType {
	case ethPIPv4:
		l4, res = parseIPv4(&c, &pkt)
	case ethPIPv6:
		l4, res = parseIPv6(&c, &pkt)
	default:
		return pkt, ParseNotIP
	}
	if res != ParseOK {
		return pkt, res
	}
	pkt.L4 = uint8(l4)
	pkt.Proto = protoClass(l4)
	pkt.L4Off = c.pos
	if pkt.Fragment {
		return pkt, ParseOK
	}
	switch l4 {
	case ipprotoTCP:
		h := c.pull(20)
		if h == nil || h[12]>>4 < 5 {
			return pkt, ParseMalformedL4
		}
		pkt.DstPort = binary.BigEndian.Uint16(h[2:4])
		pkt.HasPort = true
		pkt.SYN = h[13]&(0x02|0x10) == 0x02
	case ipprotoUDP:
		h := c.pull(8)
		if h == nil {
			return pkt, ParseMalformedL4
		}
		pkt.DstPort = binary.BigEndian.Uint16(h[2:4])
		pkt.HasPort = true
	case ipprotoICMP, ipprotoICMPv6:
		h := c.pull(4)
		if h == nil {
			return pkt, ParseMalformedL4
		}
		if l4 == ipprotoICMPv6 && pkt.Family == 6 && h[0] >= 133 && h[0] <= 137 {
			if !ndValid(&pkt, h[0], h[1], len(frame)-(c.pos-4)) {
				return pkt, ParseNDInvalid
			}
			pkt.Exempt = true
		}
	}
	return pkt, ParseOK
}

// ndValid is the Go model of parse.h's xl_nd_valid: RFC 4861's cheap
// validity checks of a neighbour discovery message of type typ and code,
// avail bytes of which (from its ICMPv6 header on) are in the frame.
func ndValid(pkt *Packet, typ, code uint8, avail int) bool {
	minLen := 24 // neighbour solicitation and advertisement
	switch typ {
	case 133:
		minLen = 8
	case 134:
		minLen = 16
	case 137:
		minLen = 40
	}
	if pkt.HopLimit != 255 || code != 0 || pkt.FirstFrag || avail < minLen {
		return false
	}
	if typ == 134 || typ == 137 {
		a := pkt.Src.As16()
		return a[0] == 0xfe && a[1]&0xc0 == 0x80
	}
	return true
}

type cursor struct {
	b   []byte
	pos int
}

func (c *cursor) pull(n int) []byte {
	if n < 0 || c.pos+n > len(c.b) {
		return nil
	}
	p := c.b[c.pos : c.pos+n]
	c.pos += n
	return p
}

func parseIPv4(c *cursor, pkt *Packet) (int, ParseResult) {
	h := c.pull(20)
	if h == nil || h[0]>>4 != 4 {
		return 0, ParseMalformedL3
	}
	ihl := int(h[0]&0x0f) * 4
	if ihl < 20 || c.pull(ihl-20) == nil {
		return 0, ParseMalformedL3
	}
	pkt.Family = 4
	pkt.Src = netip.AddrFrom4([4]byte(h[12:16]))
	if frag := binary.BigEndian.Uint16(h[6:8]); frag&0x3fff != 0 {
		pkt.Fragment = frag&0x1fff != 0
		pkt.FirstFrag = !pkt.Fragment
		pkt.FragID = uint32(binary.LittleEndian.Uint16(h[4:6]))
		pkt.Dst = netip.AddrFrom4([4]byte(h[16:20]))
	}
	return int(h[9]), ParseOK
}

func parseIPv6(c *cursor, pkt *Packet) (int, ParseResult) {
	h := c.pull(40)
	if h == nil || h[0]>>4 != 6 {
		return 0, ParseMalformedL3
	}
	pkt.Family = 6
	pkt.HopLimit = h[7]
	pkt.Src = netip.AddrFrom16([16]byte(h[8:24]))
	next := int(h[6])
	for range IPv6ExtMax {
		switch next {
		case ipprotoHopOpts, ipprotoRouting, ipprotoDstOpts:
			o := c.pull(2)
			if o == nil {
				return 0, ParseMalformedL3
			}
			next = int(o[0])
			if c.pull((int(o[1])+1)*8-2) == nil {
				return 0, ParseMalformedL3
			}
		case ipprotoAH:
			o := c.pull(2)
			if o == nil {
				return 0, ParseMalformedL3
			}
			next = int(o[0])
			if c.pull((int(o[1])+2)*4-2) == nil {
				return 0, ParseMalformedL3
			}
		case ipprotoFragment:
			f := c.pull(8)
			if f == nil {
				return 0, ParseMalformedL3
			}
			next = int(f[0])
			if off := binary.BigEndian.Uint16(f[2:4]); off&0xfff9 != 0 {
				pkt.FragID = binary.LittleEndian.Uint32(f[4:8])
				pkt.Dst = netip.AddrFrom16([16]byte(h[24:40]))
				if off&0xfff8 != 0 {
					pkt.Fragment = true
					return next, ParseOK
				}
				pkt.FirstFrag = true
			}
		default:
			return next, ParseOK
		}
	}
	switch next {
	case ipprotoHopOpts, ipprotoRouting, ipprotoDstOpts, ipprotoAH, ipprotoFragment:
		return 0, ParseExtLimit
	}
	return next, ParseOK
}

func protoClass(l4 int) Proto {
	switch l4 {
	case ipprotoTCP:
		return ProtoTCP
	case ipprotoUDP:
		return ProtoUDP
	case ipprotoICMP, ipprotoICMPv6:
		return ProtoICMP
	}
	return ProtoOther
}
