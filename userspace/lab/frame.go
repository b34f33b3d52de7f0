//go:build linux

package lab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// Protocols understood by FrameSpec.Proto and FloodSpec.Proto.
const (
	ProtoUDP    = "udp"     // UDP datagram
	ProtoTCPSYN = "tcp-syn" // TCP segment with only SYN set
	ProtoTCP    = "tcp"     // TCP segment with FrameSpec.TCPFlags
)

// TCP flag bits for FrameSpec.TCPFlags.
const (
	TCPFin uint8 = 1 << iota
	TCPSyn
	TCPRst
	TCPPsh
	TCPAck
	TCPUrg
)

// EtherType values used in built frames.
const (
	EtherTypeIPv4   = 0x0800
	EtherTypeIPv6   = 0x86dd
	EtherType8021Q  = 0x8100
	EtherType8021AD = 0x88a8
)

// VLAN is one 802.1Q/802.1ad tag.
type VLAN struct {
	TPID uint16 // tag protocol identifier; 0 means 0x8100 (802.1Q), use 0x88a8 for an 802.1ad outer tag
	ID   uint16 // VLAN identifier, 0..4095
	PCP  uint8  // priority code point, 0..7
	DEI  bool   // drop eligible indicator
}

// FrameSpec describes one Ethernet frame for BuildFrame.
type FrameSpec struct {
	SrcMAC, DstMAC net.HardwareAddr // 6 bytes each; nil means 00:00:00:00:00:00
	VLANs          []VLAN           // tags, outermost first; empty for an untagged frame
	Src, Dst       netip.Addr       // both IPv4 or both IPv6 (IPv4-mapped IPv6 is unmapped)
	Proto          string           // ProtoUDP (default when empty), ProtoTCPSYN or ProtoTCP
	SrcPort        uint16
	DstPort        uint16
	TCPFlags       uint8  // only for ProtoTCP
	TCPSeq         uint32 // TCP sequence number
	TTL            uint8  // IPv4 TTL or IPv6 hop limit; 0 means 64
	Payload        []byte // L4 payload; when nil, PayloadLen zero bytes are used
	PayloadLen     int
}

const (
	ethHeaderLen  = 14
	vlanTagLen    = 4
	ipv4HeaderLen = 20
	ipv6HeaderLen = 40
	udpHeaderLen  = 8
	tcpHeaderLen  = 20
	protoNumTCP   = 6
	protoNumUDP   = 17
)

// frameLayout locates the fields Flood rewrites per packet.
type frameLayout struct {
	ipv4     bool
	udp      bool
	l3Off    int    // start of the IP header
	srcOff   int    // start of the IP source address
	l4CsumAt int    // offset of the UDP/TCP checksum
	l4Base   uint32 // unfolded one's-complement sum of the L4 checksum input without the source address
}

// BuildFrame builds one Ethernet frame (optionally VLAN-tagged) carrying an
// IPv4 or IPv6 packet with a UDP datagram or TCP segment. The IPv4 header
// checksum and the UDP/TCP checksum (including the pseudo-header) are
// computed; a UDP checksum that computes to zero is sent as 0xffff, so IPv6
// UDP always carries one. No padding to the 60-byte Ethernet minimum is added.
func BuildFrame(s FrameSpec) ([]byte, error) {
	b, _, err := buildFrame(s)
	return b, err
}

func buildFrame(s FrameSpec) ([]byte, frameLayout, error) {
	var lay frameLayout
	src, dst := s.Src.Unmap(), s.Dst.Unmap()
	switch {
	case !src.IsValid() || !dst.IsValid():
		return nil, lay, errors.New("build frame: source and destination address are required")
	case src.Is4() != dst.Is4():
		return nil, lay, fmt.Errorf("build frame: address family mismatch %s -> %s", src, dst)
	}
	for _, m := range []net.HardwareAddr{s.SrcMAC, s.DstMAC} {
		if m != nil && len(m) != 6 {
			return nil, lay, fmt.Errorf("build frame: MAC %s is not 6 bytes", m)
		}
	}
	var l4Len, protoNum int
	var flags uint8
	switch s.Proto {
	case "", ProtoUDP:
		l4Len, protoNum = udpHeaderLen, protoNumUDP
		lay.udp = true
	case ProtoTCPSYN:
		l4Len, protoNum, flags = tcpHeaderLen, protoNumTCP, TCPSyn
	case ProtoTCP:
		l4Len, protoNum, flags = tcpHeaderLen, protoNumTCP, s.TCPFlags
	default:
		return nil, lay, fmt.Errorf("build frame: unknown protocol %q", s.Proto)
	}
	payload := s.Payload
	if payload == nil {
		if s.PayloadLen < 0 {
			return nil, lay, fmt.Errorf("build frame: negative payload length %d", s.PayloadLen)
		}
		payload = make([]byte, s.PayloadLen)
	}
	l4Len += len(payload)
	lay.ipv4 = src.Is4()
	ipLen := ipv6HeaderLen
	if lay.ipv4 {
		ipLen = ipv4HeaderLen
	}
	if ipLen+l4Len > 0xffff {
		return nil, lay, fmt.Errorf("build frame: payload of %d bytes too large", len(payload))
	}
	for _, v := range s.VLANs {
		if v.ID > 0xfff || v.PCP > 7 {
			return nil, lay, fmt.Errorf("build frame: invalid VLAN tag id %d pcp %d", v.ID, v.PCP)
		}
	}
	ttl := s.TTL
	if ttl == 0 {
		ttl = 64
	}

	lay.l3Off = ethHeaderLen + vlanTagLen*len(s.VLANs)
	b := make([]byte, lay.l3Off+ipLen+l4Len)
	if s.DstMAC != nil {
		copy(b[0:6], s.DstMAC)
	}
	if s.SrcMAC != nil {
		copy(b[6:12], s.SrcMAC)
	}
	off := 12
	for _, v := range s.VLANs {
		tpid := v.TPID
		if tpid == 0 {
			tpid = EtherType8021Q
		}
		tci := uint16(v.PCP)<<13 | v.ID
		if v.DEI {
			tci |= 1 << 12
		}
		binary.BigEndian.PutUint16(b[off:], tpid)
		binary.BigEndian.PutUint16(b[off+2:], tci)
		off += vlanTagLen
	}

	ip := b[lay.l3Off:]
	l4 := ip[ipLen:]
	var pseudo uint32 // pseudo-header sum without the source address
	if lay.ipv4 {
		binary.BigEndian.PutUint16(b[off:], EtherTypeIPv4)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(ipLen+l4Len))
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		ip[8] = ttl
		ip[9] = byte(protoNum)
		s4, d4 := src.As4(), dst.As4()
		copy(ip[12:16], s4[:])
		copy(ip[16:20], d4[:])
		binary.BigEndian.PutUint16(ip[10:], checksum(ip[:ipv4HeaderLen]))
		lay.srcOff = lay.l3Off + 12
		pseudo = sumBytes(0, d4[:]) + uint32(protoNum) + uint32(l4Len)
	} else {
		binary.BigEndian.PutUint16(b[off:], EtherTypeIPv6)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(l4Len))
		ip[6] = byte(protoNum)
		ip[7] = ttl
		s16, d16 := src.As16(), dst.As16()
		copy(ip[8:24], s16[:])
		copy(ip[24:40], d16[:])
		lay.srcOff = lay.l3Off + 8
		pseudo = sumBytes(0, d16[:]) + uint32(protoNum) + uint32(l4Len)
	}

	binary.BigEndian.PutUint16(l4[0:], s.SrcPort)
	binary.BigEndian.PutUint16(l4[2:], s.DstPort)
	if lay.udp {
		binary.BigEndian.PutUint16(l4[4:], uint16(l4Len))
		copy(l4[udpHeaderLen:], payload)
		lay.l4CsumAt = lay.l3Off + ipLen + 6
	} else {
		binary.BigEndian.PutUint32(l4[4:], s.TCPSeq)
		l4[12] = (tcpHeaderLen / 4) << 4
		l4[13] = flags
		binary.BigEndian.PutUint16(l4[14:], 64240) // window
		copy(l4[tcpHeaderLen:], payload)
		lay.l4CsumAt = lay.l3Off + ipLen + 16
	}
	lay.l4Base = sumBytes(pseudo, l4)
	lay.setSource(b, src)
	return b, lay, nil
}

// setSource writes addr (same family as the frame) as the IP source address
// of frame b and fixes the IPv4 header checksum and the L4 checksum.
func (lay *frameLayout) setSource(b []byte, addr netip.Addr) {
	var srcSum uint32
	if lay.ipv4 {
		a := addr.As4()
		copy(b[lay.srcOff:], a[:])
		ip := b[lay.l3Off : lay.l3Off+ipv4HeaderLen]
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], checksum(ip))
		srcSum = sumBytes(0, a[:])
	} else {
		a := addr.As16()
		copy(b[lay.srcOff:], a[:])
		srcSum = sumBytes(0, a[:])
	}
	c := ^fold(lay.l4Base + srcSum)
	if c == 0 && lay.udp {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[lay.l4CsumAt:], c)
}

// sumBytes adds b as big-endian 16-bit words to the one's-complement
// accumulator sum (odd trailing byte padded with zero).
func sumBytes(sum uint32, b []byte) uint32 {
	for len(b) >= 2 {
		sum += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	return sum
}

// fold folds a 32-bit one's-complement accumulator to 16 bits.
func fold(sum uint32) uint16 {
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}

// checksum is the Internet checksum (RFC 1071) of b.
func checksum(b []byte) uint16 {
	return ^fold(sumBytes(0, b))
}
