// Package frame builds Ethernet frames carrying IPv4 or IPv6 packets with
// TCP, UDP, ICMP or ICMPv6 (or any other protocol's bytes), with correct
// checksums: the test frames of the data plane's Go model and the kernel
// tests, and the frames the lab floods onto a veth. A built frame's layout
// lets a sender rewrite its source address per copy (Layout.SetSource)
// without building it again.
//
// It depends on the standard library alone, so the model's tests, the lab
// and the benchmarks can all use it without importing each other. It serves
// tests: it is part of the test kit (tests/kit), which the release binary
// does not import.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// IP protocol numbers for Spec.Proto and IPv6 extension headers for
// Spec.IPv6Ext.
const (
	ProtoICMP   uint8 = 1
	ProtoTCP    uint8 = 6
	ProtoUDP    uint8 = 17
	ProtoICMPv6 uint8 = 58

	ExtHopByHop uint8 = 0
	ExtRouting  uint8 = 43
	ExtFragment uint8 = 44
	ExtAH       uint8 = 51
	ExtDstOpts  uint8 = 60
)

// Ethertypes and tag protocol identifiers.
const (
	EtherTypeIPv4   uint16 = 0x0800
	EtherTypeARP    uint16 = 0x0806
	EtherTypeIPv6   uint16 = 0x86dd
	EtherType8021Q  uint16 = 0x8100
	EtherType8021AD uint16 = 0x88a8
)

// TCP flag bits for Spec.TCPFlags.
const (
	TCPFin uint8 = 1 << iota
	TCPSyn
	TCPRst
	TCPPsh
	TCPAck
	TCPUrg
)

// VLAN is one 802.1Q/802.1ad tag.
type VLAN struct {
	TPID uint16 // tag protocol identifier; 0 means 0x8100 (802.1Q), use 0x88a8 for an 802.1ad outer tag
	ID   uint16 // VLAN identifier, 0..4095
	PCP  uint8  // priority code point, 0..7
	DEI  bool   // drop eligible indicator
}

// Tags returns one tag per TPID, outermost first, with VLAN IDs 100, 101,
// and so on: Tags(EtherType8021AD, EtherType8021Q) is a QinQ frame's pair.
func Tags(tpids ...uint16) []VLAN {
	if len(tpids) == 0 {
		return nil
	}
	v := make([]VLAN, len(tpids))
	for i, tpid := range tpids {
		v[i] = VLAN{TPID: tpid, ID: uint16(100 + i)}
	}
	return v
}

// Spec describes one Ethernet frame for Build.
//
// Its zero values are defaults for a valid frame, so a spec names only what
// it is about. The header fields no parser decides anything by (MACs, IPv4
// identification, TCP sequence, acknowledgment and window) default to fixed
// values unless Literal is set.
type Spec struct {
	// SrcMAC and DstMAC are 6 bytes each. nil means 02:00:00:00:00:01
	// and 02:00:00:00:00:02, or with Literal 00:00:00:00:00:00.
	SrcMAC, DstMAC net.HardwareAddr
	// VLANs are the tags, outermost first (see Tags).
	VLANs []VLAN
	// EtherType overrides the ethertype after the tags; 0 means the one of
	// Src's family. A frame without a valid Src has no IP header at all:
	// only the payload follows the ethertype (an ARP body, say).
	EtherType uint16
	// Src and Dst are both IPv4 or both IPv6, written as they are (an
	// IPv4-mapped IPv6 address makes an IPv6 packet). A zero Dst means
	// 192.0.2.1 or 2001:db8::1.
	Src, Dst netip.Addr
	// TTL is the IPv4 TTL or the IPv6 hop limit; 0 means 64.
	TTL uint8
	// IPv4ID is the IPv4 identification; 0 means 0x1234 unless Literal.
	// (An IPv6 fragment header's identification is always 0x5678.)
	IPv4ID uint16
	// DontFragment sets the IPv4 DF flag.
	DontFragment bool
	// IPv4OptionWords is the number of 32-bit words of IPv4 options (NOPs):
	// the IHL is 5 + IPv4OptionWords, so at most 10.
	IPv4OptionWords int
	// FragOffset is the fragment offset in 8-byte units, at most 0x1fff;
	// non-zero makes a non-first fragment, which carries no L4 header (only
	// the payload, as fragment data). It applies to the IPv4 header, or to
	// an IPv6 fragment header (ExtFragment in IPv6Ext); an IPv6 packet
	// without one ignores it. MoreFragments sets the MF flag (IPv4) or M
	// bit (IPv6 fragment header) alike.
	FragOffset    uint16
	MoreFragments bool
	// IPv6Ext lists the extension headers to insert, in order: hop-by-hop,
	// routing and destination options (8 bytes each; so is any other
	// number), fragment (FragOffset, MoreFragments), AH (24 bytes: a 12-byte
	// ICV).
	IPv6Ext []uint8
	// Proto is the IP protocol: ProtoTCP, ProtoUDP, ProtoICMP, ProtoICMPv6,
	// or any other number, which gets no L4 header (only the payload).
	Proto            uint8
	SrcPort, DstPort uint16 // TCP and UDP
	TCPFlags         uint8  // e.g. TCPSyn, TCPSyn|TCPAck
	// TCPSeq, TCPAck and TCPWindow are the TCP sequence number,
	// acknowledgment number and window. Unless Literal, 0 means 1000, 2000
	// when TCPFlags has TCPAck (0 otherwise), and 65535.
	TCPSeq, TCPAck uint32
	TCPWindow      uint16
	// ICMPType is the ICMP or ICMPv6 type (code 0; the 4 bytes after the
	// checksum are identifier 1 and sequence 1).
	ICMPType uint8
	// Payload follows the L4 header; when nil, PayloadLen zero bytes do.
	Payload    []byte
	PayloadLen int
	// Literal writes MACs, IPv4ID, TCPSeq, TCPAck and TCPWindow as given,
	// zero (nil) included, instead of defaulting their zero values.
	Literal bool
}

const (
	ethHeaderLen  = 14
	vlanTagLen    = 4
	ipv4HeaderLen = 20
	ipv6HeaderLen = 40
)

var (
	defaultSrcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	defaultDstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	zeroMAC       = net.HardwareAddr{0, 0, 0, 0, 0, 0}
	defaultDst4   = netip.AddrFrom4([4]byte{192, 0, 2, 1})
	defaultDst6   = netip.MustParseAddr("2001:db8::1")
)

// Layout locates the headers of a frame Build made, and what SetSource
// needs to rewrite its source address.
type Layout struct {
	L3       int // start of the IP header (after the tags)
	L4       int // end of the IP header and its extension headers: the L4 header, fragment data or payload
	Src      int // offset of the IP source address; -1 without an IP header
	Checksum int // offset of the L4 checksum; -1 when there is none (a non-first fragment, another protocol)

	ipv4     bool
	ipHdrLen int    // IPv4 header length, options included
	udp      bool   // a UDP checksum of 0 is sent as 0xffff
	pseudo   bool   // the L4 checksum covers the pseudo-header (not ICMP)
	l4Sum    uint32 // OnesSum of the L4 checksum's input without the source address
}

// Build builds the frame s describes: an IPv4 header checksum, and TCP,
// UDP, ICMP and ICMPv6 checksums over the pseudo-header (not for ICMP) and
// the segment in the frame. A UDP checksum that computes to zero is sent as
// 0xffff, so IPv6 UDP always carries one. For a first fragment the L4
// checksum covers only the first part of the datagram (a receiver
// reassembling it would disagree; a parser does not care). No padding to
// the 60-byte Ethernet minimum is added.
func Build(s Spec) ([]byte, error) {
	b, _, err := BuildLayout(s)
	return b, err
}

// MustBuild is Build for specs known to be valid, as in tests: it panics on
// an error.
func MustBuild(s Spec) []byte {
	b, err := Build(s)
	if err != nil {
		panic(err)
	}
	return b
}

// BuildLayout is Build that also returns the frame's layout.
func BuildLayout(s Spec) ([]byte, Layout, error) {
	lay := Layout{Src: -1, Checksum: -1}
	if err := s.check(); err != nil {
		return nil, lay, fmt.Errorf("build frame: %w", err)
	}
	payload := s.Payload
	if payload == nil {
		payload = make([]byte, s.PayloadLen)
	}
	b := make([]byte, 0, ethHeaderLen+vlanTagLen*len(s.VLANs)+ipv6HeaderLen+24*len(s.IPv6Ext)+20+len(payload))
	b = append(b, s.mac(s.DstMAC, defaultDstMAC)...)
	b = append(b, s.mac(s.SrcMAC, defaultSrcMAC)...)
	for _, v := range s.VLANs {
		tpid := v.TPID
		if tpid == 0 {
			tpid = EtherType8021Q
		}
		tci := uint16(v.PCP)<<13 | v.ID
		if v.DEI {
			tci |= 1 << 12
		}
		b = binary.BigEndian.AppendUint16(b, tpid)
		b = binary.BigEndian.AppendUint16(b, tci)
	}
	etherType := s.EtherType
	if etherType == 0 {
		switch {
		case s.Src.Is4():
			etherType = EtherTypeIPv4
		case s.Src.Is6():
			etherType = EtherTypeIPv6
		}
	}
	b = binary.BigEndian.AppendUint16(b, etherType)
	lay.L3 = len(b)
	switch {
	case s.Src.Is4():
		b = s.appendIPv4(b, payload, &lay)
	case s.Src.Is6():
		b = s.appendIPv6(b, payload, &lay)
	default:
		lay.L4 = len(b)
		return append(b, payload...), lay, nil
	}
	lay.SetSource(b, s.Src)
	return b, lay, nil
}

// check returns what makes s unbuildable.
func (s *Spec) check() error {
	for _, m := range []net.HardwareAddr{s.SrcMAC, s.DstMAC} {
		if m != nil && len(m) != 6 {
			return fmt.Errorf("MAC %s is not 6 bytes", m)
		}
	}
	for _, v := range s.VLANs {
		if v.ID > 0xfff || v.PCP > 7 {
			return fmt.Errorf("invalid VLAN tag id %d pcp %d", v.ID, v.PCP)
		}
	}
	if s.Payload == nil && s.PayloadLen < 0 {
		return fmt.Errorf("negative payload length %d", s.PayloadLen)
	}
	if !s.Src.IsValid() {
		return nil
	}
	if s.Dst.IsValid() && s.Src.Is4() != s.Dst.Is4() {
		return fmt.Errorf("address family mismatch %s -> %s", s.Src, s.Dst)
	}
	if s.IPv4OptionWords < 0 || s.IPv4OptionWords > 10 {
		return fmt.Errorf("%d words of IPv4 options, want 0..10", s.IPv4OptionWords)
	}
	if s.FragOffset > 0x1fff {
		return fmt.Errorf("fragment offset %d over 0x1fff", s.FragOffset)
	}
	// The IPv4 total length, or the IPv6 payload length, is 16 bits.
	n := s.l4Len()
	if s.Src.Is4() {
		n += ipv4HeaderLen + 4*s.IPv4OptionWords
	} else {
		n += s.ipv6ExtLen()
	}
	if n > 0xffff {
		return errors.New("packet over 65535 bytes")
	}
	return nil
}

func (s *Spec) mac(m, def net.HardwareAddr) net.HardwareAddr {
	switch {
	case m != nil:
		return m
	case s.Literal:
		return zeroMAC
	}
	return def
}

// fragment reports a non-first fragment: no L4 header.
func (s *Spec) fragment() bool {
	if s.FragOffset == 0 {
		return false
	}
	if s.Src.Is4() {
		return true
	}
	for _, h := range s.IPv6Ext {
		if h == ExtFragment {
			return true
		}
	}
	return false
}

// l4HeaderLen is the length of the L4 header Build writes.
func (s *Spec) l4HeaderLen() int {
	if s.fragment() {
		return 0
	}
	switch s.Proto {
	case ProtoTCP:
		return 20
	case ProtoUDP, ProtoICMP, ProtoICMPv6:
		return 8
	}
	return 0
}

func (s *Spec) payloadLen() int {
	if s.Payload != nil {
		return len(s.Payload)
	}
	return s.PayloadLen
}

// l4Len is the length of everything after the IP header and its extensions.
func (s *Spec) l4Len() int { return s.l4HeaderLen() + s.payloadLen() }

func (s *Spec) ipv6ExtLen() int {
	n := 0
	for _, h := range s.IPv6Ext {
		if h == ExtAH {
			n += 24
		} else {
			n += 8
		}
	}
	return n
}

func (s *Spec) appendIPv4(b, payload []byte, lay *Layout) []byte {
	dst := s.Dst
	if !dst.IsValid() {
		dst = defaultDst4
	}
	hlen := ipv4HeaderLen + 4*s.IPv4OptionWords
	id := s.IPv4ID
	if id == 0 && !s.Literal {
		id = 0x1234
	}
	frag := s.FragOffset
	if s.DontFragment {
		frag |= 0x4000
	}
	if s.MoreFragments {
		frag |= 0x2000
	}
	ttl := s.TTL
	if ttl == 0 {
		ttl = 64
	}
	b = append(b, byte(0x40|hlen/4), 0)
	b = binary.BigEndian.AppendUint16(b, uint16(hlen+s.l4Len()))
	b = binary.BigEndian.AppendUint16(b, id)
	b = binary.BigEndian.AppendUint16(b, frag)
	b = append(b, ttl, s.Proto, 0, 0) // checksum: SetSource
	lay.Src = len(b)
	b = append(b, s.Src.AsSlice()...)
	d4 := dst.As4()
	b = append(b, d4[:]...)
	for range 4 * s.IPv4OptionWords {
		b = append(b, 1) // NOP
	}
	lay.ipv4, lay.ipHdrLen, lay.L4 = true, hlen, len(b)
	// Pseudo-header without the source address: destination, protocol,
	// L4 length.
	pseudo := OnesSum(0, d4[:]) + uint32(s.Proto) + uint32(s.l4Len())
	return s.appendL4(b, payload, pseudo, lay)
}

func (s *Spec) appendIPv6(b, payload []byte, lay *Layout) []byte {
	dst := s.Dst
	if !dst.IsValid() {
		dst = defaultDst6
	}
	first := s.Proto
	if len(s.IPv6Ext) > 0 {
		first = s.IPv6Ext[0]
	}
	hop := s.TTL
	if hop == 0 {
		hop = 64
	}
	b = binary.BigEndian.AppendUint32(b, 6<<28) // version, traffic class 0, flow label 0
	b = binary.BigEndian.AppendUint16(b, uint16(s.ipv6ExtLen()+s.l4Len()))
	b = append(b, first, hop)
	lay.Src = len(b)
	b = append(b, s.Src.AsSlice()...)
	d16 := dst.As16()
	b = append(b, d16[:]...)
	for i, h := range s.IPv6Ext {
		next := s.Proto
		if i+1 < len(s.IPv6Ext) {
			next = s.IPv6Ext[i+1]
		}
		switch h {
		case ExtFragment:
			off := s.FragOffset << 3
			if s.MoreFragments {
				off |= 1
			}
			b = append(b, next, 0)
			b = binary.BigEndian.AppendUint16(b, off)
			b = binary.BigEndian.AppendUint32(b, 0x5678) // identification
		case ExtAH:
			// Payload length in 4-octet units minus 2: 24 bytes.
			b = append(b, next, 24/4-2, 0, 0)
			b = binary.BigEndian.AppendUint32(b, 0x100) // SPI
			b = binary.BigEndian.AppendUint32(b, 1)     // sequence
			b = append(b, make([]byte, 12)...)          // ICV
		case ExtRouting:
			// Length 0 (8 bytes): routing type 0, segments left 0.
			b = append(b, next, 0, 0, 0, 0, 0, 0, 0)
		default:
			// Hop-by-hop and destination options (and any other number):
			// 8 bytes, padded with one PadN option of 4 bytes.
			b = append(b, next, 0, 1, 4, 0, 0, 0, 0)
		}
	}
	lay.L4 = len(b)
	pseudo := OnesSum(0, d16[:]) + uint32(s.Proto) + uint32(s.l4Len())
	return s.appendL4(b, payload, pseudo, lay)
}

// appendL4 appends the L4 header and the payload, and records in lay what
// the L4 checksum sums besides the source address.
func (s *Spec) appendL4(b, payload []byte, pseudo uint32, lay *Layout) []byte {
	start := len(b)
	if s.l4HeaderLen() == 0 {
		return append(b, payload...)
	}
	lay.pseudo = true
	switch s.Proto {
	case ProtoTCP:
		seq, ack, win := s.TCPSeq, s.TCPAck, s.TCPWindow
		if !s.Literal {
			if seq == 0 {
				seq = 1000
			}
			if ack == 0 && s.TCPFlags&TCPAck != 0 {
				ack = 2000
			}
			if win == 0 {
				win = 65535
			}
		}
		b = binary.BigEndian.AppendUint16(b, s.SrcPort)
		b = binary.BigEndian.AppendUint16(b, s.DstPort)
		b = binary.BigEndian.AppendUint32(b, seq)
		b = binary.BigEndian.AppendUint32(b, ack)
		b = append(b, 5<<4, s.TCPFlags) // data offset: no options
		b = binary.BigEndian.AppendUint16(b, win)
		b = append(b, 0, 0, 0, 0) // checksum, urgent pointer
		lay.Checksum = start + 16
	case ProtoUDP:
		b = binary.BigEndian.AppendUint16(b, s.SrcPort)
		b = binary.BigEndian.AppendUint16(b, s.DstPort)
		b = binary.BigEndian.AppendUint16(b, uint16(s.l4Len()))
		b = append(b, 0, 0)
		lay.Checksum, lay.udp = start+6, true
	case ProtoICMP, ProtoICMPv6:
		// Type, code, checksum, and 4 bytes of identifier and sequence
		// (echo) or reserved (neighbour discovery).
		b = append(b, s.ICMPType, 0, 0, 0, 0, 1, 0, 1)
		lay.Checksum = start + 2
		lay.pseudo = s.Proto == ProtoICMPv6
	}
	b = append(b, payload...)
	lay.l4Sum = OnesSum(0, b[start:])
	if lay.pseudo {
		lay.l4Sum = OnesSum(lay.l4Sum+pseudo, nil)
	}
	return b
}

// SetSource writes addr as the IP source address of b, a frame built
// with layout lay (or a copy of one), and updates the IPv4 header checksum
// and the L4 checksum: b then is what Build makes with Spec.Src = addr. The
// frame must have an IP header and addr its family.
func (lay *Layout) SetSource(b []byte, addr netip.Addr) {
	var src []byte
	if lay.ipv4 {
		a := addr.As4()
		src = a[:]
		copy(b[lay.Src:], src)
		ip := b[lay.L3 : lay.L3+lay.ipHdrLen]
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], ^uint16(OnesSum(0, ip)))
	} else {
		a := addr.As16()
		src = a[:]
		copy(b[lay.Src:], src)
	}
	if lay.Checksum < 0 {
		return
	}
	sum := lay.l4Sum
	if lay.pseudo {
		sum = OnesSum(sum, src)
	}
	c := ^uint16(sum)
	if c == 0 && lay.udp {
		c = 0xffff // 0 means "no checksum" in UDP
	}
	binary.BigEndian.PutUint16(b[lay.Checksum:], c)
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
