package dataplane

import (
	"encoding/binary"
	"net/netip"
)

// FrameSpec describes an Ethernet frame for BuildFrame: what tests and
// tools need to exercise every branch of the parser.
type FrameSpec struct {
	// VLANs are the TPIDs of the tags, outermost first, for example
	// {0x88a8, 0x8100} for QinQ. Tag i carries VLAN ID 100+i.
	VLANs []uint16
	// EtherType overrides the ethertype after the tags; 0 means the one of
	// Src's family. A frame without a valid Src has no IP header at all:
	// only PayloadLen zero bytes follow the ethertype (an ARP body, say).
	EtherType uint16
	// Src and Dst are both IPv4 or both IPv6. A zero Dst means 192.0.2.1
	// or 2001:db8::1.
	Src, Dst netip.Addr
	// IPv4OptionWords is the number of 32-bit words of IPv4 options (NOPs):
	// the IHL is 5 + IPv4OptionWords, so at most 10.
	IPv4OptionWords int
	// FragOffset is the fragment offset in 8-byte units; non-zero makes a
	// non-first fragment, which carries no L4 header (only PayloadLen bytes
	// of fragment data). It applies to the IPv4 header, or to an IPv6
	// fragment header (44 in IPv6Ext); an IPv6 frame without one ignores it.
	FragOffset    uint16
	MoreFragments bool
	// IPv6Ext lists the extension headers to insert, in order: 0
	// hop-by-hop, 43 routing, 60 destination options (8 bytes each), 44
	// fragment (FragOffset, MoreFragments), 51 AH (24 bytes: a 12-byte ICV).
	IPv6Ext []uint8
	// Proto is the IP protocol: 6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6, or any
	// other number, which gets no L4 header (only the payload).
	Proto            uint8
	SrcPort, DstPort uint16
	TCPFlags         uint8 // e.g. 0x02 SYN, 0x12 SYN|ACK, 0x10 ACK
	ICMPType         uint8
	PayloadLen       int // zero bytes after the L4 header
}

// IP protocol numbers and ethertypes for FrameSpec.
const (
	ProtoNumICMP   = ipprotoICMP
	ProtoNumTCP    = ipprotoTCP
	ProtoNumUDP    = ipprotoUDP
	ProtoNumICMPv6 = ipprotoICMPv6

	ExtHopByHop = ipprotoHopOpts
	ExtRouting  = ipprotoRouting
	ExtFragment = ipprotoFragment
	ExtAH       = ipprotoAH
	ExtDstOpts  = ipprotoDstOpts

	EtherTypeIPv4   = ethPIPv4
	EtherTypeIPv6   = ethPIPv6
	EtherTypeARP    = 0x0806
	EtherType8021Q  = ethP8021Q
	EtherType8021AD = ethP8021AD
)

var (
	frameDstMAC = [6]byte{0x02, 0, 0, 0, 0, 0x02}
	frameSrcMAC = [6]byte{0x02, 0, 0, 0, 0, 0x01}
)

// BuildFrame builds the frame s describes, with a correct IPv4 header
// checksum and TCP/UDP/ICMP/ICMPv6 checksums. The L4 checksums cover the
// bytes in the frame: for a first fragment that is only the first part of
// the datagram, so a receiver reassembling it would disagree; for a parser
// it does not matter.
func BuildFrame(s FrameSpec) []byte {
	b := make([]byte, 0, 128+s.PayloadLen)
	b = append(b, frameDstMAC[:]...)
	b = append(b, frameSrcMAC[:]...)
	for i, tpid := range s.VLANs {
		b = binary.BigEndian.AppendUint16(b, tpid)
		b = binary.BigEndian.AppendUint16(b, uint16(100+i))
	}
	etherType := s.EtherType
	if etherType == 0 {
		switch {
		case s.Src.Is4():
			etherType = ethPIPv4
		case s.Src.Is6():
			etherType = ethPIPv6
		}
	}
	b = binary.BigEndian.AppendUint16(b, etherType)

	switch {
	case s.Src.Is4():
		return appendIPv4(b, &s)
	case s.Src.Is6():
		return appendIPv6(b, &s)
	}
	return append(b, make([]byte, s.PayloadLen)...)
}

func appendIPv4(b []byte, s *FrameSpec) []byte {
	dst := s.Dst
	if !dst.IsValid() {
		dst = netip.AddrFrom4([4]byte{192, 0, 2, 1})
	}
	fragment := s.FragOffset != 0
	l4 := buildL4(s, !fragment, s.Src.AsSlice(), dst.AsSlice(), false)
	hlen := 20 + 4*s.IPv4OptionWords
	start := len(b)
	b = append(b, byte(0x40|(hlen/4)&0x0f), 0)
	b = binary.BigEndian.AppendUint16(b, uint16(hlen+len(l4)))
	b = binary.BigEndian.AppendUint16(b, 0x1234) // identification
	frag := s.FragOffset & 0x1fff
	if s.MoreFragments {
		frag |= 0x2000
	}
	b = binary.BigEndian.AppendUint16(b, frag)
	b = append(b, 64, s.Proto, 0, 0)
	b = append(b, s.Src.AsSlice()...)
	b = append(b, dst.AsSlice()...)
	for range 4 * s.IPv4OptionWords {
		b = append(b, 1) // NOP
	}
	binary.BigEndian.PutUint16(b[start+10:], ^uint16(OnesSum(0, b[start:])))
	return append(b, l4...)
}

func appendIPv6(b []byte, s *FrameSpec) []byte {
	dst := s.Dst
	if !dst.IsValid() {
		dst = netip.MustParseAddr("2001:db8::1")
	}
	var ext []byte
	fragment := false
	for i, h := range s.IPv6Ext {
		next := s.Proto
		if i+1 < len(s.IPv6Ext) {
			next = s.IPv6Ext[i+1]
		}
		switch h {
		case ipprotoFragment:
			off := s.FragOffset << 3
			if s.MoreFragments {
				off |= 1
			}
			ext = append(ext, next, 0)
			ext = binary.BigEndian.AppendUint16(ext, off)
			ext = binary.BigEndian.AppendUint32(ext, 0x5678) // identification
			if s.FragOffset != 0 {
				fragment = true
			}
		case ipprotoAH:
			// Payload length in 4-octet units minus 2: 24 bytes.
			ext = append(ext, next, 24/4-2, 0, 0)
			ext = binary.BigEndian.AppendUint32(ext, 0x100) // SPI
			ext = binary.BigEndian.AppendUint32(ext, 1)     // sequence
			ext = append(ext, make([]byte, 12)...)          // ICV
		case ipprotoRouting:
			// Length 0 (8 bytes): routing type 0, segments left 0.
			ext = append(ext, next, 0, 0, 0, 0, 0, 0, 0)
		default:
			// Hop-by-hop and destination options (and any other number):
			// 8 bytes, padded with one PadN option of 4 bytes.
			ext = append(ext, next, 0, 1, 4, 0, 0, 0, 0)
		}
	}
	l4 := buildL4(s, !fragment, s.Src.AsSlice(), dst.AsSlice(), true)
	first := s.Proto
	if len(s.IPv6Ext) > 0 {
		first = s.IPv6Ext[0]
	}
	b = binary.BigEndian.AppendUint32(b, 6<<28)
	b = binary.BigEndian.AppendUint16(b, uint16(len(ext)+len(l4)))
	b = append(b, first, 64)
	b = append(b, s.Src.AsSlice()...)
	b = append(b, dst.AsSlice()...)
	b = append(b, ext...)
	return append(b, l4...)
}

// buildL4 returns the L4 header and payload; withHeader false gives the
// payload alone (the data of a non-first fragment).
func buildL4(s *FrameSpec, withHeader bool, src, dst []byte, v6 bool) []byte {
	payload := make([]byte, s.PayloadLen)
	if !withHeader {
		return payload
	}
	var h []byte
	off := -1 // offset of the checksum field
	pseudo := true
	switch s.Proto {
	case ipprotoTCP:
		h = binary.BigEndian.AppendUint16(h, s.SrcPort)
		h = binary.BigEndian.AppendUint16(h, s.DstPort)
		h = binary.BigEndian.AppendUint32(h, 1000) // seq
		ack := uint32(0)
		if s.TCPFlags&0x10 != 0 {
			ack = 2000
		}
		h = binary.BigEndian.AppendUint32(h, ack)
		h = append(h, 5<<4, s.TCPFlags)
		h = binary.BigEndian.AppendUint16(h, 65535) // window
		h = append(h, 0, 0, 0, 0)                   // checksum, urgent pointer
		off = 16
	case ipprotoUDP:
		h = binary.BigEndian.AppendUint16(h, s.SrcPort)
		h = binary.BigEndian.AppendUint16(h, s.DstPort)
		h = binary.BigEndian.AppendUint16(h, uint16(8+len(payload)))
		h = append(h, 0, 0)
		off = 6
	case ipprotoICMP, ipprotoICMPv6:
		// Type, code, checksum, and 4 bytes of identifier and sequence
		// (echo) or reserved (neighbour discovery).
		h = append(h, s.ICMPType, 0, 0, 0, 0, 1, 0, 1)
		off = 2
		pseudo = s.Proto == ipprotoICMPv6
	}
	seg := append(h, payload...)
	if off < 0 {
		return seg
	}
	var sum uint32
	if pseudo {
		sum = OnesSum(sum, src)
		sum = OnesSum(sum, dst)
		if v6 {
			sum = OnesSum(sum, binary.BigEndian.AppendUint32(nil, uint32(len(seg))))
			sum = OnesSum(sum, []byte{0, 0, 0, s.Proto})
		} else {
			sum = OnesSum(sum, []byte{0, s.Proto})
			sum = OnesSum(sum, binary.BigEndian.AppendUint16(nil, uint16(len(seg))))
		}
	}
	c := ^uint16(OnesSum(sum, seg))
	if c == 0 && s.Proto == ipprotoUDP {
		c = 0xffff // 0 means "no checksum" in UDP
	}
	binary.BigEndian.PutUint16(seg[off:], c)
	return seg
}

// OnesSum adds b to the Internet checksum's ones' complement sum (RFC
// 1071) and returns it folded to 16 bits, not yet complemented: a header
// with a correct checksum sums to 0xffff. Each call must start at an even
// offset of the checksummed data.
func OnesSum(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return sum
}
