package dataplane

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/xlimit/xlimit/tests/kit/frame"
)

var (
	testSrc4 = netip.MustParseAddr("198.51.100.7")
	testSrc6 = netip.MustParseAddr("2001:db8:77::7")
)

// frameLayout is where frame.Build should have put each header, computed from
// the spec alone (not from the frame).
type frameLayout struct {
	l3, l4, end int  // offsets of the IP header, of the L4 header, and length
	v6          bool // IPv6
	fragment    bool // non-first fragment
	l4Header    int  // length of the L4 header
}

func layoutOf(s frame.Spec) frameLayout {
	var l frameLayout
	l.l3 = 14 + 4*len(s.VLANs)
	switch {
	case s.Src.Is4():
		l.l4 = l.l3 + 20 + 4*s.IPv4OptionWords
		l.fragment = s.FragOffset != 0
	case s.Src.Is6():
		l.v6 = true
		l.l4 = l.l3 + 40
		for _, h := range s.IPv6Ext {
			if h == frame.ExtAH {
				l.l4 += 24
			} else {
				l.l4 += 8
			}
			if h == frame.ExtFragment && s.FragOffset != 0 {
				l.fragment = true
			}
		}
	default:
		l.l4 = l.l3
	}
	if s.Src.IsValid() && !l.fragment {
		switch s.Proto {
		case frame.ProtoTCP:
			l.l4Header = 20
		case frame.ProtoUDP, frame.ProtoICMP, frame.ProtoICMPv6:
			l.l4Header = 8
		}
	}
	l.end = l.l4 + l.l4Header + s.PayloadLen
	return l
}

// wantParse is what Parse must return for a frame built from s, derived
// from the spec.
func wantParse(s frame.Spec, frameLen int) (Packet, ParseResult) {
	want := Packet{Len: frameLen}
	if len(s.VLANs) > VLANMax {
		return want, ParseVLANDepth
	}
	if !s.Src.IsValid() ||
		s.EtherType != 0 && s.EtherType != frame.EtherTypeIPv4 && s.EtherType != frame.EtherTypeIPv6 {
		return want, ParseNotIP
	}
	dst := s.Dst
	want.Src = s.Src
	want.Family = 4
	want.L4 = s.Proto
	if s.Src.Is4() {
		if !dst.IsValid() {
			dst = netip.MustParseAddr("192.0.2.1")
		}
		if s.FragOffset != 0 || s.MoreFragments {
			id := s.IPv4ID
			if id == 0 && !s.Literal {
				id = 0x1234
			}
			want.Fragment, want.FirstFrag = s.FragOffset != 0, s.FragOffset == 0
			want.Dst, want.FragID = dst, uint32(id>>8|id<<8) // the ID's bytes as the kernel reads them
		}
	}
	if s.Src.Is6() {
		if !dst.IsValid() {
			dst = netip.MustParseAddr("2001:db8::1")
		}
		want.Family = 6
		want.HopLimit = s.TTL
		if want.HopLimit == 0 {
			want.HopLimit = 64
		}
		// Walk the chain as the parser must: at most IPv6ExtMax headers,
		// stopping early at a non-first fragment header.
		i := 0
		for ; i < len(s.IPv6Ext) && i < IPv6ExtMax; i++ {
			if s.IPv6Ext[i] != frame.ExtFragment || (s.FragOffset == 0 && !s.MoreFragments) {
				continue
			}
			want.Dst, want.FragID = dst, 0x78560000 // 0x5678 as the kernel reads it
			if s.FragOffset != 0 {
				want.Fragment = true
				if i+1 < len(s.IPv6Ext) {
					want.L4 = s.IPv6Ext[i+1]
				}
				break
			}
			want.FirstFrag = true
		}
		if !want.Fragment && i < len(s.IPv6Ext) {
			return Packet{Len: frameLen, Family: 6, Src: s.Src, HopLimit: want.HopLimit,
				FirstFrag: want.FirstFrag, Dst: want.Dst, FragID: want.FragID}, ParseExtLimit
		}
	}
	want.Proto = protoClass(int(want.L4))
	if !want.Fragment {
		switch s.Proto {
		case frame.ProtoTCP:
			want.HasPort, want.DstPort = true, s.DstPort
			want.SYN = s.TCPFlags&0x12 == 0x02
		case frame.ProtoUDP:
			want.HasPort, want.DstPort = true, s.DstPort
		case frame.ProtoICMPv6:
			if !s.Src.Is6() || s.ICMPType < 133 || s.ICMPType > 137 {
				break
			}
			// RFC 4861's cheap checks: hop limit 255, the fixed part
			// present (8 bytes of ICMPv6 header and the payload here),
			// a link-local source for RA and redirect; not a fragment.
			minLen := map[uint8]int{133: 8, 134: 16, 135: 24, 136: 24, 137: 40}[s.ICMPType]
			a := s.Src.As16()
			linkLocal := a[0] == 0xfe && a[1]&0xc0 == 0x80
			if want.HopLimit != 255 || want.FirstFrag || 8+s.PayloadLen < minLen ||
				(s.ICMPType == 134 || s.ICMPType == 137) && !linkLocal {
				return want, ParseNDInvalid
			}
			want.Exempt = true
		}
	}
	return want, ParseOK
}

// checkFrame checks the bytes frame.Build wrote against the spec: lengths,
// tags, fields and checksums.
func checkFrame(t *testing.T, s frame.Spec, f []byte) {
	t.Helper()
	l := layoutOf(s)
	if len(f) != l.end {
		t.Fatalf("frame is %d bytes, want %d", len(f), l.end)
	}
	for i, tag := range s.VLANs {
		if got := binary.BigEndian.Uint16(f[12+4*i:]); got != tag.TPID {
			t.Errorf("tag %d: TPID %#x, want %#x", i, got, tag.TPID)
		}
	}
	et := binary.BigEndian.Uint16(f[l.l3-2:])
	switch {
	case s.EtherType != 0:
		if et != s.EtherType {
			t.Errorf("ethertype %#x, want %#x", et, s.EtherType)
		}
	case s.Src.Is4() && et != frame.EtherTypeIPv4, s.Src.Is6() && et != frame.EtherTypeIPv6:
		t.Errorf("ethertype %#x for %v", et, s.Src)
	}
	if !s.Src.IsValid() {
		return
	}
	ip := f[l.l3:]
	var pseudo uint32
	if l.v6 {
		if ip[0]>>4 != 6 {
			t.Errorf("IPv6 version %d", ip[0]>>4)
		}
		if got, want := int(binary.BigEndian.Uint16(ip[4:])), len(f)-l.l3-40; got != want {
			t.Errorf("IPv6 payload length %d, want %d", got, want)
		}
		if netip.AddrFrom16([16]byte(ip[8:24])) != s.Src {
			t.Errorf("IPv6 source %v", netip.AddrFrom16([16]byte(ip[8:24])))
		}
		pseudo = frame.OnesSum(frame.OnesSum(0, ip[8:40]), binary.BigEndian.AppendUint32(nil, uint32(len(f)-l.l4)))
		pseudo = frame.OnesSum(pseudo, []byte{0, 0, 0, s.Proto})
		// Walk the chain by its next-header fields.
		next, off := ip[6], 40
		for i, h := range s.IPv6Ext {
			if next != h {
				t.Fatalf("extension header %d: next header %d, want %d", i, next, h)
			}
			next = ip[off]
			switch h {
			case frame.ExtAH:
				off += (int(ip[off+1]) + 2) * 4
			case frame.ExtFragment:
				fo := binary.BigEndian.Uint16(ip[off+2:])
				if fo>>3 != s.FragOffset || (fo&1 != 0) != s.MoreFragments {
					t.Errorf("fragment header offset field %#x", fo)
				}
				off += 8
			default:
				off += (int(ip[off+1]) + 1) * 8
			}
		}
		if next != s.Proto || l.l3+off != l.l4 {
			t.Errorf("chain ends with next header %d at %d, want %d at %d", next, l.l3+off, s.Proto, l.l4)
		}
	} else {
		hlen := int(ip[0]&0x0f) * 4
		if ip[0]>>4 != 4 || hlen != 20+4*s.IPv4OptionWords {
			t.Errorf("IPv4 version/IHL byte %#x", ip[0])
		}
		if frame.OnesSum(0, ip[:hlen]) != 0xffff {
			t.Errorf("IPv4 header checksum does not verify")
		}
		if got := int(binary.BigEndian.Uint16(ip[2:])); got != len(f)-l.l3 {
			t.Errorf("IPv4 total length %d, want %d", got, len(f)-l.l3)
		}
		fo := binary.BigEndian.Uint16(ip[6:])
		if fo&0x1fff != s.FragOffset || (fo&0x2000 != 0) != s.MoreFragments {
			t.Errorf("IPv4 fragment field %#x", fo)
		}
		if ip[9] != s.Proto || netip.AddrFrom4([4]byte(ip[12:16])) != s.Src {
			t.Errorf("IPv4 protocol %d source %v", ip[9], netip.AddrFrom4([4]byte(ip[12:16])))
		}
		pseudo = frame.OnesSum(frame.OnesSum(0, ip[12:20]), []byte{0, s.Proto})
		pseudo = frame.OnesSum(pseudo, binary.BigEndian.AppendUint16(nil, uint16(len(f)-l.l4)))
	}
	if l.l4Header == 0 {
		return
	}
	seg := f[l.l4:]
	if binary.BigEndian.Uint16(seg[2:]) != s.DstPort && (s.Proto == frame.ProtoTCP || s.Proto == frame.ProtoUDP) {
		t.Errorf("destination port %d, want %d", binary.BigEndian.Uint16(seg[2:]), s.DstPort)
	}
	if s.Proto == frame.ProtoICMP {
		pseudo = 0
	}
	if got := frame.OnesSum(pseudo, seg); got != 0xffff {
		t.Errorf("L4 checksum does not verify (sum %#x)", got)
	}
}

func frameSpecs() []frame.Spec {
	var specs []frame.Spec
	for _, src := range []netip.Addr{testSrc4, testSrc6} {
		icmp := frame.ProtoICMP
		if src.Is6() {
			icmp = frame.ProtoICMPv6
		}
		specs = append(specs,
			frame.Spec{Src: src, Proto: frame.ProtoUDP, SrcPort: 4000, DstPort: 53, PayloadLen: 31},
			frame.Spec{Src: src, Proto: frame.ProtoTCP, DstPort: 80, TCPFlags: 0x02},
			frame.Spec{Src: src, Proto: frame.ProtoTCP, DstPort: 80, TCPFlags: 0x12, PayloadLen: 1},
			frame.Spec{Src: src, Proto: frame.ProtoTCP, DstPort: 443, TCPFlags: 0x10, PayloadLen: 100},
			frame.Spec{Src: src, Proto: icmp, ICMPType: 8},
			frame.Spec{Src: src, Proto: 47, PayloadLen: 12},
			frame.Spec{Src: src, VLANs: frame.Tags(frame.EtherType8021Q), Proto: frame.ProtoUDP, DstPort: 9},
			frame.Spec{Src: src, VLANs: frame.Tags(frame.EtherType8021AD, frame.EtherType8021Q), Proto: frame.ProtoTCP, DstPort: 22, TCPFlags: 0x02},
			frame.Spec{Src: src, VLANs: frame.Tags(frame.EtherType8021AD, frame.EtherType8021Q, frame.EtherType8021Q), Proto: frame.ProtoUDP, DstPort: 9},
			frame.Spec{Src: src, EtherType: frame.EtherTypeARP, Proto: frame.ProtoUDP, DstPort: 9},
		)
	}
	for _, typ := range []uint8{128, 129, 132, 133, 134, 135, 136, 137, 138} {
		specs = append(specs, frame.Spec{Src: testSrc6, Proto: frame.ProtoICMPv6, ICMPType: typ, PayloadLen: 16})
	}
	for w := 0; w <= 10; w++ {
		specs = append(specs, frame.Spec{Src: testSrc4, IPv4OptionWords: w, Proto: frame.ProtoUDP, DstPort: 53, PayloadLen: w})
	}
	for _, proto := range []uint8{frame.ProtoUDP, frame.ProtoTCP, frame.ProtoICMP, 99} {
		specs = append(specs,
			frame.Spec{Src: testSrc4, Proto: proto, DstPort: 53, MoreFragments: true, PayloadLen: 64},
			frame.Spec{Src: testSrc4, Proto: proto, DstPort: 53, FragOffset: 185, MoreFragments: true, PayloadLen: 64},
			frame.Spec{Src: testSrc4, Proto: proto, DstPort: 53, FragOffset: 0x1fff, PayloadLen: 3},
			frame.Spec{Src: testSrc6, IPv6Ext: []uint8{frame.ExtFragment}, Proto: proto, DstPort: 53, MoreFragments: true, PayloadLen: 64},
			frame.Spec{Src: testSrc6, IPv6Ext: []uint8{frame.ExtFragment}, Proto: proto, DstPort: 53, FragOffset: 185, PayloadLen: 64},
		)
	}
	for _, ext := range [][]uint8{
		{frame.ExtHopByHop}, {frame.ExtRouting}, {frame.ExtDstOpts}, {frame.ExtAH}, {frame.ExtFragment},
		{frame.ExtHopByHop, frame.ExtRouting, frame.ExtDstOpts, frame.ExtAH, frame.ExtFragment, frame.ExtDstOpts},
		{frame.ExtHopByHop, frame.ExtRouting, frame.ExtDstOpts, frame.ExtAH, frame.ExtFragment, frame.ExtDstOpts, frame.ExtDstOpts},
		{frame.ExtDstOpts, frame.ExtDstOpts, frame.ExtDstOpts, frame.ExtDstOpts, frame.ExtDstOpts, frame.ExtFragment, frame.ExtDstOpts},
	} {
		specs = append(specs,
			frame.Spec{Src: testSrc6, IPv6Ext: ext, Proto: frame.ProtoUDP, DstPort: 53},
			frame.Spec{Src: testSrc6, IPv6Ext: ext, Proto: frame.ProtoTCP, DstPort: 80, TCPFlags: 0x02, FragOffset: 7},
		)
	}
	specs = append(specs,
		frame.Spec{EtherType: frame.EtherTypeARP, PayloadLen: 28},
		frame.Spec{VLANs: frame.Tags(frame.EtherType8021Q), EtherType: 0x88cc, PayloadLen: 40},
		frame.Spec{Src: testSrc4, Dst: netip.MustParseAddr("10.1.2.3"), Proto: frame.ProtoUDP, DstPort: 65535, PayloadLen: 1472},
		frame.Spec{Src: testSrc6, Dst: netip.MustParseAddr("fe80::1"), Proto: frame.ProtoUDP, DstPort: 0},
	)
	return specs
}

func TestBuildFrameParse(t *testing.T) {
	for i, s := range frameSpecs() {
		t.Run(fmt.Sprintf("%d", i), func(t *testing.T) {
			f := frame.MustBuild(s)
			checkFrame(t, s, f)
			checkParse(t, s, f)
		})
	}
}

// TestBuildFrameParseRandom builds random frames and checks the same.
func TestBuildFrameParseRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// Not 0: as a next header that is hop-by-hop, which needs a body.
	protos := []uint8{frame.ProtoTCP, frame.ProtoUDP, frame.ProtoICMP, frame.ProtoICMPv6, 47, 132}
	exts := []uint8{frame.ExtHopByHop, frame.ExtRouting, frame.ExtDstOpts, frame.ExtFragment, frame.ExtAH}
	for range 5000 {
		var s frame.Spec
		var tpids []uint16
		for range rng.IntN(4) {
			tpids = append(tpids, []uint16{frame.EtherType8021Q, frame.EtherType8021AD}[rng.IntN(2)])
		}
		s.VLANs = frame.Tags(tpids...)
		if rng.IntN(2) == 0 {
			s.Src = netip.AddrFrom4([4]byte{10, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
			s.IPv4OptionWords = rng.IntN(11)
		} else {
			var a [16]byte
			for j := range a {
				a[j] = byte(rng.IntN(256))
			}
			s.Src = netip.AddrFrom16(a)
			for range rng.IntN(8) {
				s.IPv6Ext = append(s.IPv6Ext, exts[rng.IntN(len(exts))])
			}
		}
		if rng.IntN(10) == 0 {
			s.EtherType = []uint16{frame.EtherTypeARP, frame.EtherTypeIPv4, frame.EtherTypeIPv6}[rng.IntN(3)]
		}
		if rng.IntN(4) == 0 {
			s.FragOffset = uint16(rng.IntN(0x2000))
		}
		s.MoreFragments = rng.IntN(2) == 0
		s.Proto = protos[rng.IntN(len(protos))]
		s.SrcPort, s.DstPort = uint16(rng.Uint32()), uint16(rng.Uint32())
		s.TCPFlags = uint8(rng.Uint32())
		s.ICMPType = uint8(128 + rng.IntN(16))
		s.PayloadLen = rng.IntN(64)
		f := frame.MustBuild(s)
		// A mismatched ethertype makes the IP header unparseable as
		// another family: only check the matched ones.
		if s.EtherType == frame.EtherTypeIPv4 && !s.Src.Is4() || s.EtherType == frame.EtherTypeIPv6 && !s.Src.Is6() {
			continue
		}
		checkFrame(t, s, f)
		checkParse(t, s, f)
	}
}

// checkParse parses f, built from s, and compares the result with what the
// spec says, header offsets included.
func checkParse(t *testing.T, s frame.Spec, f []byte) {
	t.Helper()
	got, res := Parse(f)
	want, wantRes := wantParse(s, len(f))
	offsets := [2]int{got.L3Off, got.L4Off}
	got.L3Off, got.L4Off = 0, 0
	if res != wantRes || got != want {
		t.Fatalf("spec %+v:\nParse = %+v, %v\nwant    %+v, %v", s, got, res, want, wantRes)
	}
	if l := layoutOf(s); res == ParseOK && !got.Fragment && offsets != [2]int{l.l3, l.l4} {
		t.Fatalf("spec %+v: header offsets %v, want %v", s, offsets, [2]int{l.l3, l.l4})
	}
}
