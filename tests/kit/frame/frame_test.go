package frame

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.txt from Build (after an intended change only)")

const goldenFile = "testdata/golden.txt"

type goldenCase struct {
	name string
	s    Spec
}

// goldenCases are the frames of testdata/golden.txt. The dp/ ones are specs
// of the data plane's tests (default header values), the lab/ ones what the
// lab sends (Literal, DF, Linux's TCP window).
func goldenCases() []goldenCase {
	src4, src6 := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8:77::7")
	var cs []goldenCase
	add := func(name string, s Spec) { cs = append(cs, goldenCase{name, s}) }
	add("dp/v4-udp", Spec{Src: src4, Proto: ProtoUDP, SrcPort: 4000, DstPort: 53, PayloadLen: 31})
	add("dp/v6-udp", Spec{Src: src6, Proto: ProtoUDP, SrcPort: 4000, DstPort: 53, PayloadLen: 31})
	add("dp/v4-tcp-syn", Spec{Src: src4, Proto: ProtoTCP, SrcPort: 40000, DstPort: 80, TCPFlags: TCPSyn})
	add("dp/v6-tcp-syn", Spec{Src: src6, Proto: ProtoTCP, SrcPort: 40000, DstPort: 80, TCPFlags: TCPSyn})
	add("dp/v4-tcp-ack-data", Spec{Src: src4, Proto: ProtoTCP, DstPort: 443, TCPFlags: TCPAck, PayloadLen: 100})
	add("dp/v6-tcp-synack-data", Spec{Src: src6, Proto: ProtoTCP, DstPort: 80, TCPFlags: TCPSyn | TCPAck, PayloadLen: 1})
	add("dp/v4-tcp-all-flags", Spec{Src: src4, Proto: ProtoTCP, SrcPort: 1, DstPort: 2, TCPFlags: 0xff, PayloadLen: 3})
	add("dp/v4-icmp-echo", Spec{Src: src4, Proto: ProtoICMP, ICMPType: 8, PayloadLen: 24})
	add("dp/v6-icmpv6-echo", Spec{Src: src6, Proto: ProtoICMPv6, ICMPType: 128, PayloadLen: 24})
	add("dp/v6-icmpv6-ns", Spec{Src: src6, Proto: ProtoICMPv6, ICMPType: 135, PayloadLen: 16})
	add("dp/v4-icmpv6-type", Spec{Src: src4, Proto: ProtoICMPv6, ICMPType: 130})
	add("dp/v6-icmp-type", Spec{Src: src6, Proto: ProtoICMP, ICMPType: 8})
	add("dp/v4-gre", Spec{Src: src4, Proto: 47, PayloadLen: 12})
	add("dp/v6-sctp", Spec{Src: src6, Proto: 132, PayloadLen: 5})
	add("dp/v4-vlan-udp", Spec{Src: src4, VLANs: Tags(EtherType8021Q), Proto: ProtoUDP, DstPort: 9})
	add("dp/v4-qinq-udp", Spec{Src: src4, VLANs: Tags(EtherType8021AD, EtherType8021Q), Proto: ProtoUDP, DstPort: 9})
	add("dp/v6-qinq-tcp", Spec{Src: src6, VLANs: Tags(EtherType8021AD, EtherType8021Q), Proto: ProtoTCP, DstPort: 22, TCPFlags: TCPSyn})
	add("dp/v4-three-tags", Spec{Src: src4, VLANs: Tags(EtherType8021AD, EtherType8021Q, EtherType8021Q), Proto: ProtoUDP, DstPort: 9})
	for _, w := range []int{1, 3, 10} {
		add(fmt.Sprintf("dp/v4-options-%d", w), Spec{Src: src4, IPv4OptionWords: w, Proto: ProtoUDP, DstPort: 53, PayloadLen: w})
	}
	add("dp/v4-first-fragment", Spec{Src: src4, Proto: ProtoUDP, DstPort: 53, MoreFragments: true, PayloadLen: 64})
	add("dp/v4-middle-fragment", Spec{Src: src4, Proto: ProtoUDP, DstPort: 53, FragOffset: 185, MoreFragments: true, PayloadLen: 64})
	add("dp/v4-last-fragment-icmp", Spec{Src: src4, Proto: ProtoICMP, DstPort: 53, FragOffset: 0x1fff, PayloadLen: 3})
	add("dp/v4-tcp-fragment-options", Spec{Src: src4, Proto: ProtoTCP, TCPFlags: TCPSyn, IPv4OptionWords: 2, FragOffset: 10})
	add("dp/v6-first-fragment", Spec{Src: src6, IPv6Ext: []uint8{ExtFragment}, Proto: ProtoUDP, DstPort: 53, MoreFragments: true, PayloadLen: 64})
	add("dp/v6-nonfirst-fragment-tcp", Spec{Src: src6, IPv6Ext: []uint8{ExtFragment}, Proto: ProtoTCP, DstPort: 53, FragOffset: 185, PayloadLen: 64})
	chain := []uint8{ExtHopByHop, ExtRouting, ExtDstOpts, ExtAH, ExtFragment, ExtDstOpts}
	add("dp/v6-ext-chain", Spec{Src: src6, IPv6Ext: chain, Proto: ProtoUDP, DstPort: 53, MoreFragments: true})
	add("dp/v6-ext-chain-tcp-nonfirst", Spec{Src: src6, IPv6Ext: chain, Proto: ProtoTCP, DstPort: 80, TCPFlags: TCPSyn, FragOffset: 7})
	add("dp/v6-ext-hbh", Spec{Src: src6, IPv6Ext: []uint8{ExtHopByHop}, Proto: ProtoUDP, DstPort: 53})
	add("dp/v6-ext-ah", Spec{Src: src6, IPv6Ext: []uint8{ExtAH}, Proto: ProtoTCP, DstPort: 80, TCPFlags: TCPSyn})
	add("dp/arp", Spec{EtherType: EtherTypeARP, PayloadLen: 28})
	add("dp/lldp-in-vlan", Spec{VLANs: Tags(EtherType8021Q), EtherType: 0x88cc, PayloadLen: 40})
	add("dp/ethernet-only", Spec{EtherType: 0x88cc})
	add("dp/no-ethertype", Spec{})
	add("dp/v4-under-arp-ethertype", Spec{Src: src4, EtherType: EtherTypeARP, Proto: ProtoUDP, DstPort: 9})
	add("dp/v6-under-ipv4-ethertype", Spec{Src: src6, EtherType: EtherTypeIPv4, Proto: ProtoUDP, DstPort: 9})
	add("dp/v4-udp-large", Spec{Src: src4, Dst: netip.MustParseAddr("10.1.2.3"), Proto: ProtoUDP, DstPort: 65535, PayloadLen: 1472})
	add("dp/v6-udp-linklocal-dst", Spec{Src: src6, Dst: netip.MustParseAddr("fe80::1"), Proto: ProtoUDP, DstPort: 0})
	add("dp/v6-mapped-src", Spec{Src: netip.MustParseAddr("::ffff:192.0.2.10"), Proto: ProtoUDP, SrcPort: 40000, DstPort: 53, PayloadLen: 32})
	// Source ports whose UDP checksum computes to 0, sent as 0xffff.
	add("dp/v4-udp-zero-sum", Spec{Src: src4, Proto: ProtoUDP, SrcPort: 4973, DstPort: 53})
	add("dp/v6-udp-zero-sum", Spec{Src: src6, Proto: ProtoUDP, SrcPort: 41912, DstPort: 53})

	mac1, mac2 := mustMAC("02:00:00:00:00:01"), mustMAC("02:00:00:00:00:02")
	mac3, mac4 := mustMAC("0a:1b:2c:3d:4e:5f"), mustMAC("fe:dc:ba:98:76:54")
	v4a, v4b := netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.1.2")
	v6a, v6b := netip.MustParseAddr("2001:2::1"), netip.MustParseAddr("2001:2::2")
	host := func(s Spec) Spec {
		s.Literal, s.DontFragment = true, true
		if s.Proto == ProtoTCP {
			s.TCPWindow = 64240
		}
		return s
	}
	vlans := map[string][]VLAN{
		"untagged": nil,
		"q100":     {{ID: 100}},
		"qinq":     {{TPID: EtherType8021AD, ID: 10, PCP: 3}, {ID: 4095, DEI: true}},
	}
	for _, p := range []struct {
		name  string
		proto uint8
		flags uint8
	}{{"udp", ProtoUDP, 0}, {"tcp-syn", ProtoTCP, TCPSyn}, {"tcp", ProtoTCP, TCPAck | TCPPsh}} {
		for _, pair := range [][2]netip.Addr{{v4a, v4b}, {v6a, v6b}} {
			for _, vn := range []string{"untagged", "q100", "qinq"} {
				for _, plen := range []int{0, 1, 7, 300} {
					add(fmt.Sprintf("lab/%s/%s/%s/%d", p.name, family(pair[0]), vn, plen), host(Spec{
						SrcMAC: mac1, DstMAC: mac2, VLANs: vlans[vn], Src: pair[0], Dst: pair[1],
						Proto: p.proto, TCPFlags: p.flags, SrcPort: 1234, DstPort: 80, PayloadLen: plen}))
				}
			}
		}
	}
	add("lab/nil-macs-udp", host(Spec{Src: v4a, Dst: v4b, Proto: ProtoUDP, SrcPort: 40000, DstPort: 9, PayloadLen: 18}))
	add("lab/macs-payload-v6", host(Spec{SrcMAC: mac3, DstMAC: mac4, Src: v6a, Dst: v6b, Proto: ProtoUDP,
		SrcPort: 1000, DstPort: 9004, Payload: []byte("hello")}))
	add("lab/tcp-seq-ttl", host(Spec{SrcMAC: mac3, DstMAC: mac4, Src: v4a, Dst: v4b, Proto: ProtoTCP,
		TCPFlags: TCPRst | TCPFin | TCPUrg, TCPSeq: 0xdeadbeef, TTL: 7, SrcPort: 5, DstPort: 6, PayloadLen: 2}))
	add("lab/ttl-v6-syn", host(Spec{SrcMAC: mac3, DstMAC: mac4, Src: v6a, Dst: v6b, Proto: ProtoTCP,
		TCPFlags: TCPSyn, TTL: 1, SrcPort: 40000, DstPort: 443}))
	add("lab/v4-udp-zero-sum", host(Spec{SrcMAC: mac1, DstMAC: mac2, Src: v4a, Dst: v4b, Proto: ProtoUDP, SrcPort: 29057, DstPort: 53}))
	add("lab/v6-udp-zero-sum", host(Spec{SrcMAC: mac1, DstMAC: mac2, Src: v6a, Dst: v6b, Proto: ProtoUDP, SrcPort: 49056, DstPort: 53}))
	return cs
}

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "v4"
	}
	return "v6"
}

// TestGolden compares Build's frames with the golden ones byte for byte and
// verifies the golden frames' structure and checksums independently of the
// code under test.
func TestGolden(t *testing.T) {
	cases := goldenCases()
	if *update {
		var out strings.Builder
		out.WriteString("# Golden frames of frame_test.go's goldenCases: <name> <hex>, one a line.\n" +
			"# TestGolden compares Build with them and verifies their checksums on its own.\n")
		for _, c := range cases {
			fmt.Fprintf(&out, "%s %x\n", c.name, MustBuild(c.s))
		}
		if err := os.WriteFile(goldenFile, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden := readGolden(t)
	if len(golden) != len(cases) {
		t.Errorf("%s has %d frames, goldenCases %d", goldenFile, len(golden), len(cases))
	}
	for _, c := range cases {
		want, ok := golden[c.name]
		if !ok {
			t.Errorf("%s: not in %s", c.name, goldenFile)
			continue
		}
		verifyFrame(t, c.name, c.s, want)
		got, err := Build(c.s)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: frame differs from the golden one at byte %d\ngot  %x\nwant %x", c.name, firstDiff(got, want), got, want)
		}
	}
}

func readGolden(t *testing.T) map[string][]byte {
	t.Helper()
	f, err := os.Open(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	golden := map[string][]byte{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, h, ok := strings.Cut(line, " ")
		b, err := hex.DecodeString(h)
		if !ok || err != nil {
			t.Fatalf("%s: bad line %q", goldenFile, line)
		}
		golden[name] = b
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return golden
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// refSum is the ones' complement sum of data (RFC 1071) computed another
// way than OnesSum: the big-endian 16-bit words added up in 64 bits, then
// reduced modulo 0xffff, with 0xffff standing for a non-zero multiple of it
// (ones' complement has no +0 from a non-zero sum). Data with a correct
// checksum sums to 0xffff.
func refSum(parts ...[]byte) uint16 {
	data := bytes.Join(parts, nil)
	var s uint64
	for i, c := range data {
		if i%2 == 0 {
			s += uint64(c) << 8
		} else {
			s += uint64(c)
		}
	}
	r := s % 0xffff
	if r == 0 && s != 0 {
		r = 0xffff
	}
	return uint16(r)
}

func be16(v int) []byte { return binary.BigEndian.AppendUint16(nil, uint16(v)) }
func be32(v int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(v)) }

// verifyFrame checks frame f against spec s without the code under test:
// every length, the fields the spec sets, the IPv4 header checksum and the
// L4 checksum over the pseudo-header and the segment.
func verifyFrame(t *testing.T, name string, s Spec, f []byte) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("%s: %s\n%x", name, fmt.Sprintf(format, args...), f)
	}
	if len(f) < 14+4*len(s.VLANs) {
		fail("%d bytes", len(f))
		return
	}
	dstMAC, srcMAC := s.DstMAC, s.SrcMAC
	switch {
	case s.Literal && dstMAC == nil:
		dstMAC = make(net.HardwareAddr, 6)
	case dstMAC == nil:
		dstMAC = mustMAC("02:00:00:00:00:02")
	}
	switch {
	case s.Literal && srcMAC == nil:
		srcMAC = make(net.HardwareAddr, 6)
	case srcMAC == nil:
		srcMAC = mustMAC("02:00:00:00:00:01")
	}
	if !bytes.Equal(f[0:6], dstMAC) || !bytes.Equal(f[6:12], srcMAC) {
		fail("MACs %x %x, want %s %s", f[0:6], f[6:12], dstMAC, srcMAC)
	}
	off := 12
	for i, v := range s.VLANs {
		tpid := v.TPID
		if tpid == 0 {
			tpid = 0x8100
		}
		tci := int(v.PCP)<<13 | int(v.ID)
		if v.DEI {
			tci |= 0x1000
		}
		if got := f[off : off+4]; !bytes.Equal(got, append(be16(int(tpid)), be16(tci)...)) {
			fail("tag %d is %x, want TPID %#x TCI %#x", i, got, tpid, tci)
		}
		off += 4
	}
	et := int(binary.BigEndian.Uint16(f[off:]))
	wantET := int(s.EtherType)
	if wantET == 0 && s.Src.Is4() {
		wantET = 0x0800
	} else if wantET == 0 && s.Src.Is6() {
		wantET = 0x86dd
	}
	if et != wantET {
		fail("ethertype %#x, want %#x", et, wantET)
	}
	l3 := off + 2
	payloadLen := s.PayloadLen
	if s.Payload != nil {
		payloadLen = len(s.Payload)
	}
	if !s.Src.IsValid() {
		if len(f) != l3+payloadLen {
			fail("%d bytes, want %d", len(f), l3+payloadLen)
		}
		return
	}
	ip := f[l3:]
	ttl := int(s.TTL)
	if ttl == 0 {
		ttl = 64
	}
	var src, dst []byte
	var l4 int        // offset of the L4 data in ip
	fragment := false // non-first fragment
	if s.Src.Is4() {
		hlen := 20 + 4*s.IPv4OptionWords
		if ip[0] != byte(0x40|hlen/4) || ip[8] != byte(ttl) || ip[9] != s.Proto {
			fail("IPv4 version/IHL %#x, TTL %d, protocol %d", ip[0], ip[8], ip[9])
		}
		if int(binary.BigEndian.Uint16(ip[2:])) != len(ip) {
			fail("IPv4 total length %d, want %d", binary.BigEndian.Uint16(ip[2:]), len(ip))
		}
		wantID := int(s.IPv4ID)
		if !s.Literal {
			wantID = cmpOr(wantID, 0x1234)
		}
		if id := int(binary.BigEndian.Uint16(ip[4:])); id != wantID {
			fail("IPv4 identification %#x, want %#x", id, wantID)
		}
		ff := int(binary.BigEndian.Uint16(ip[6:]))
		if ff&0x1fff != int(s.FragOffset) || (ff&0x2000 != 0) != s.MoreFragments || (ff&0x4000 != 0) != s.DontFragment || ff&0x8000 != 0 {
			fail("IPv4 flags and fragment offset %#x", ff)
		}
		for _, o := range ip[20:hlen] {
			if o != 1 {
				fail("IPv4 options %x, want NOPs", ip[20:hlen])
				break
			}
		}
		if refSum(ip[:hlen]) != 0xffff {
			fail("IPv4 header checksum does not verify")
		}
		src, dst = ip[12:16], ip[16:20]
		l4, fragment = hlen, s.FragOffset != 0
	} else {
		if binary.BigEndian.Uint32(ip[0:]) != 6<<28 || ip[7] != byte(ttl) {
			fail("IPv6 first word %#x, hop limit %d", binary.BigEndian.Uint32(ip), ip[7])
		}
		if int(binary.BigEndian.Uint16(ip[4:])) != len(ip)-40 {
			fail("IPv6 payload length %d, want %d", binary.BigEndian.Uint16(ip[4:]), len(ip)-40)
		}
		src, dst = ip[8:24], ip[24:40]
		next, o := ip[6], 40
		for i, h := range s.IPv6Ext {
			if next != h {
				fail("extension header %d: next header %d, want %d", i, next, h)
				return
			}
			next = ip[o]
			switch h {
			case ExtAH:
				if ip[o+1] != 4 {
					fail("AH length %d", ip[o+1])
				}
				o += 24
			case ExtFragment:
				fo := int(binary.BigEndian.Uint16(ip[o+2:]))
				if fo>>3 != int(s.FragOffset) || (fo&1 != 0) != s.MoreFragments || binary.BigEndian.Uint32(ip[o+4:]) != 0x5678 {
					fail("fragment header %x", ip[o:o+8])
				}
				fragment = fragment || s.FragOffset != 0
				o += 8
			default:
				if ip[o+1] != 0 {
					fail("extension header %d length %d", i, ip[o+1])
				}
				o += 8
			}
		}
		if next != s.Proto {
			fail("chain ends with next header %d, want %d", next, s.Proto)
		}
		l4 = o
	}
	wantSrc, wantDst := s.Src.AsSlice(), s.Dst.AsSlice()
	if !s.Dst.IsValid() && s.Src.Is4() {
		wantDst = []byte{192, 0, 2, 1}
	} else if !s.Dst.IsValid() {
		wantDst = netip.MustParseAddr("2001:db8::1").AsSlice()
	}
	if !bytes.Equal(src, wantSrc) || !bytes.Equal(dst, wantDst) {
		fail("addresses %x -> %x", src, dst)
	}
	seg := ip[l4:]
	hdr := 0
	if !fragment {
		switch s.Proto {
		case ProtoTCP:
			hdr = 20
		case ProtoUDP, ProtoICMP, ProtoICMPv6:
			hdr = 8
		}
	}
	if len(seg) != hdr+payloadLen {
		fail("L4 data of %d bytes, want %d", len(seg), hdr+payloadLen)
		return
	}
	if s.Payload != nil && !bytes.Equal(seg[hdr:], s.Payload) || s.Payload == nil && !bytes.Equal(seg[hdr:], make([]byte, payloadLen)) {
		fail("payload %x", seg[hdr:])
	}
	if hdr == 0 {
		return
	}
	var pseudo []byte
	if s.Src.Is4() {
		pseudo = bytes.Join([][]byte{src, dst, {0, s.Proto}, be16(len(seg))}, nil)
	} else {
		pseudo = bytes.Join([][]byte{src, dst, be32(len(seg)), {0, 0, 0, s.Proto}}, nil)
	}
	switch s.Proto {
	case ProtoTCP:
		seq, ack, win := int(s.TCPSeq), int(s.TCPAck), int(s.TCPWindow)
		if !s.Literal {
			seq = cmpOr(seq, 1000)
			if s.TCPFlags&TCPAck != 0 {
				ack = cmpOr(ack, 2000)
			}
			win = cmpOr(win, 65535)
		}
		want := bytes.Join([][]byte{be16(int(s.SrcPort)), be16(int(s.DstPort)), be32(seq), be32(ack),
			{0x50, s.TCPFlags}, be16(win)}, nil)
		if !bytes.Equal(seg[:16], want) || seg[18] != 0 || seg[19] != 0 {
			fail("TCP header %x, want %x", seg[:20], want)
		}
	case ProtoUDP:
		want := bytes.Join([][]byte{be16(int(s.SrcPort)), be16(int(s.DstPort)), be16(len(seg))}, nil)
		if !bytes.Equal(seg[:6], want) {
			fail("UDP header %x, want %x", seg[:8], want)
		}
		if seg[6] == 0 && seg[7] == 0 {
			fail("UDP checksum 0")
		}
	default:
		if !bytes.Equal(seg[:2], []byte{s.ICMPType, 0}) || !bytes.Equal(seg[4:8], []byte{0, 1, 0, 1}) {
			fail("ICMP header %x", seg[:8])
		}
		if s.Proto == ProtoICMP {
			pseudo = nil
		}
	}
	if got := refSum(pseudo, seg); got != 0xffff {
		fail("L4 checksum does not verify (sum %#x)", got)
	}
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// randomSpec is a random valid spec of either convention.
func randomSpec(rng *rand.Rand) Spec {
	var s Spec
	for range rng.IntN(4) {
		s.VLANs = append(s.VLANs, VLAN{TPID: []uint16{0, EtherType8021Q, EtherType8021AD}[rng.IntN(3)],
			ID: uint16(rng.IntN(4096)), PCP: uint8(rng.IntN(8)), DEI: rng.IntN(2) == 0})
	}
	if rng.IntN(2) == 0 {
		s.Src = netip.AddrFrom4([4]byte{10, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
		s.IPv4OptionWords = rng.IntN(11)
		s.DontFragment = rng.IntN(2) == 0
		if rng.IntN(2) == 0 {
			s.Dst = netip.AddrFrom4([4]byte{172, 16, byte(rng.IntN(256)), byte(rng.IntN(256))})
		}
	} else {
		var a [16]byte
		for j := range a {
			a[j] = byte(rng.IntN(256))
		}
		s.Src = netip.AddrFrom16(a)
		for range rng.IntN(8) {
			s.IPv6Ext = append(s.IPv6Ext, []uint8{ExtHopByHop, ExtRouting, ExtDstOpts, ExtFragment, ExtAH}[rng.IntN(5)])
		}
		if rng.IntN(2) == 0 {
			s.Dst = netip.AddrFrom16([16]byte{0xfe, 0x80, 15: byte(rng.IntN(256))})
		}
	}
	if rng.IntN(4) == 0 {
		s.FragOffset = uint16(rng.IntN(0x2000))
	}
	s.MoreFragments = rng.IntN(2) == 0
	s.Proto = []uint8{ProtoTCP, ProtoUDP, ProtoICMP, ProtoICMPv6, 47, 132}[rng.IntN(6)]
	s.SrcPort, s.DstPort = uint16(rng.Uint32()), uint16(rng.Uint32())
	s.TCPFlags = uint8(rng.Uint32())
	s.ICMPType = uint8(rng.Uint32())
	s.TTL = uint8(rng.IntN(3) * rng.IntN(256))
	if s.Literal = rng.IntN(2) == 0; s.Literal || rng.IntN(2) == 0 {
		s.IPv4ID, s.TCPWindow = uint16(rng.Uint32()), uint16(rng.Uint32())
		s.TCPSeq, s.TCPAck = rng.Uint32(), rng.Uint32()
	}
	if rng.IntN(3) == 0 {
		s.SrcMAC = net.HardwareAddr{2, 0, 0, 0, byte(rng.IntN(256)), byte(rng.IntN(256))}
	}
	s.PayloadLen = rng.IntN(100)
	if rng.IntN(5) == 0 {
		s.Payload = make([]byte, rng.IntN(100))
		for i := range s.Payload {
			s.Payload[i] = byte(rng.Uint32())
		}
	}
	return s
}

// TestRandom builds random frames and verifies them.
func TestRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 3000 {
		s := randomSpec(rng)
		f, err := Build(s)
		if err != nil {
			t.Fatalf("%+v: %v", s, err)
		}
		verifyFrame(t, fmt.Sprintf("random %d (%+v)", i, s), s, f)
	}
}

// TestSetSource rewrites the source of built frames and compares them with
// frames built for that source.
func TestSetSource(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	var specs []goldenCase
	for _, c := range goldenCases() {
		if c.s.Src.IsValid() {
			specs = append(specs, c)
		}
	}
	for i := range 500 {
		specs = append(specs, goldenCase{fmt.Sprintf("random %d", i), randomSpec(rng)})
	}
	for _, c := range specs {
		b, lay, err := BuildLayout(c.s)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(b[lay.Src:lay.Src+c.s.Src.BitLen()/8], c.s.Src.AsSlice()) {
			t.Errorf("%s: Layout.Src %d does not point at the source address", c.name, lay.Src)
		}
		if lay.L3 != 14+4*len(c.s.VLANs) {
			t.Errorf("%s: Layout.L3 %d", c.name, lay.L3)
		}
		for range 20 {
			var a netip.Addr
			if c.s.Src.Is4() {
				a = netip.AddrFrom4([4]byte{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())})
			} else {
				var x [16]byte
				for i := range x {
					x[i] = byte(rng.Uint32())
				}
				a = netip.AddrFrom16(x)
			}
			lay.SetSource(b, a)
			s2 := c.s
			s2.Src = a
			if fresh := MustBuild(s2); !bytes.Equal(fresh, b) {
				t.Fatalf("%s: source %s rewritten:\n%x\nbuilt for it:\n%x", c.name, a, b, fresh)
			}
			verifyFrame(t, c.name+" from "+a.String(), s2, b)
		}
	}
}

// TestLayout checks the offsets of a few layouts.
func TestLayout(t *testing.T) {
	src4, src6 := netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")
	for _, c := range []struct {
		s                    Spec
		l3, l4, src, checksm int
	}{
		{Spec{Src: src4, Proto: ProtoUDP}, 14, 34, 26, 40},
		{Spec{Src: src4, Proto: ProtoTCP, VLANs: Tags(EtherType8021AD, EtherType8021Q)}, 22, 42, 34, 58},
		{Spec{Src: src4, Proto: ProtoICMP, IPv4OptionWords: 2}, 14, 42, 26, 44},
		{Spec{Src: src4, Proto: ProtoUDP, FragOffset: 1}, 14, 34, 26, -1},
		{Spec{Src: src4, Proto: 47}, 14, 34, 26, -1},
		{Spec{Src: src6, Proto: ProtoUDP}, 14, 54, 22, 60},
		{Spec{Src: src6, Proto: ProtoTCP, IPv6Ext: []uint8{ExtHopByHop, ExtAH}}, 14, 86, 22, 102},
		{Spec{Src: src6, Proto: ProtoICMPv6, VLANs: Tags(EtherType8021Q)}, 18, 58, 26, 60},
		{Spec{EtherType: EtherTypeARP, PayloadLen: 28}, 14, 14, -1, -1},
	} {
		_, lay, err := BuildLayout(c.s)
		if err != nil {
			t.Fatal(err)
		}
		if got := [4]int{lay.L3, lay.L4, lay.Src, lay.Checksum}; got != [4]int{c.l3, c.l4, c.src, c.checksm} {
			t.Errorf("%+v: L3, L4, Src, Checksum %v, want %v", c.s, got, [4]int{c.l3, c.l4, c.src, c.checksm})
		}
	}
}

// TestDefaults checks the header values zero fields stand for, and that
// Literal writes them as given.
func TestDefaults(t *testing.T) {
	s := Spec{Src: netip.MustParseAddr("192.0.2.7"), Proto: ProtoTCP, TCPFlags: TCPAck}
	f := MustBuild(s)
	ip, tcp := f[14:], f[34:]
	if !bytes.Equal(f[:12], []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1}) || ip[8] != 64 ||
		binary.BigEndian.Uint16(ip[4:]) != 0x1234 || binary.BigEndian.Uint16(ip[6:]) != 0 ||
		!bytes.Equal(ip[16:20], []byte{192, 0, 2, 1}) ||
		binary.BigEndian.Uint32(tcp[4:]) != 1000 || binary.BigEndian.Uint32(tcp[8:]) != 2000 || binary.BigEndian.Uint16(tcp[14:]) != 65535 {
		t.Errorf("defaults: %x", f)
	}
	s.Literal, s.DontFragment = true, true
	f = MustBuild(s)
	ip, tcp = f[14:], f[34:]
	if !bytes.Equal(f[:12], make([]byte, 12)) || ip[8] != 64 ||
		binary.BigEndian.Uint16(ip[4:]) != 0 || binary.BigEndian.Uint16(ip[6:]) != 0x4000 ||
		binary.BigEndian.Uint32(tcp[4:]) != 0 || binary.BigEndian.Uint32(tcp[8:]) != 0 || binary.BigEndian.Uint16(tcp[14:]) != 0 {
		t.Errorf("literal: %x", f)
	}
	s.Literal, s.TCPFlags = false, TCPSyn
	s.IPv4ID, s.TCPSeq, s.TCPAck, s.TCPWindow, s.TTL = 7, 8, 9, 10, 11
	f = MustBuild(s)
	ip, tcp = f[14:], f[34:]
	if binary.BigEndian.Uint16(ip[4:]) != 7 || ip[8] != 11 || binary.BigEndian.Uint32(tcp[4:]) != 8 ||
		binary.BigEndian.Uint32(tcp[8:]) != 9 || binary.BigEndian.Uint16(tcp[14:]) != 10 {
		t.Errorf("given values: %x", f)
	}
	if v6 := MustBuild(Spec{Src: netip.MustParseAddr("2001:db8::7"), Proto: ProtoUDP}); !bytes.Equal(v6[38:54], netip.MustParseAddr("2001:db8::1").AsSlice()) {
		t.Errorf("IPv6 default destination: %x", v6)
	}
}

func TestBuildErrors(t *testing.T) {
	v4, v6 := netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")
	for _, s := range []Spec{
		{Src: v4, Dst: v6},
		{Src: v6, Dst: v4},
		{Src: v4, SrcMAC: net.HardwareAddr{1, 2, 3}},
		{DstMAC: make(net.HardwareAddr, 8)},
		{Src: v4, VLANs: []VLAN{{ID: 4096}}},
		{Src: v6, VLANs: []VLAN{{PCP: 8}}},
		{Src: v4, PayloadLen: -1},
		{PayloadLen: -1},
		{Src: v4, IPv4OptionWords: 11},
		{Src: v4, IPv4OptionWords: -1},
		{Src: v4, FragOffset: 0x2000},
		{Src: v4, Proto: ProtoUDP, PayloadLen: 65535 - 28 + 1},
		{Src: v6, Proto: ProtoUDP, PayloadLen: 65535 - 8 + 1},
		{Src: v6, Proto: ProtoTCP, IPv6Ext: []uint8{ExtAH}, PayloadLen: 65535 - 44 + 1},
	} {
		if _, err := Build(s); err == nil {
			t.Errorf("%+v: built", s)
		}
	}
	for _, s := range []Spec{
		{Src: v4, Proto: ProtoUDP, PayloadLen: 65535 - 28},
		{Src: v6, Proto: ProtoUDP, PayloadLen: 65535 - 8},
		{Src: v4, Proto: ProtoUDP, Payload: []byte{}, PayloadLen: -1}, // Payload wins
	} {
		if _, err := Build(s); err != nil {
			t.Errorf("%+v: %v", s, err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Errorf("MustBuild of an invalid spec did not panic")
		}
	}()
	MustBuild(Spec{Src: v4, Dst: v6})
}

func TestOnesSum(t *testing.T) {
	// RFC 1071 section 3's example.
	if got := OnesSum(0, []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}); got != 0xddf2 {
		t.Errorf("RFC 1071 example: %#x, want 0xddf2", got)
	}
	if got := OnesSum(0, []byte{0xab}); got != 0xab00 {
		t.Errorf("odd byte: %#x", got)
	}
	if got := OnesSum(0, nil); got != 0 {
		t.Errorf("nothing: %#x", got)
	}
	// Against refSum, in one call and split at even offsets.
	rng := rand.New(rand.NewPCG(11, 12))
	for range 2000 {
		b := make([]byte, rng.IntN(3000))
		for i := range b {
			b[i] = byte(rng.Uint32())
			if rng.IntN(4) == 0 {
				b[i] = 0xff
			}
		}
		want := uint32(refSum(b))
		cut := rng.IntN(len(b)+1) &^ 1
		if got := OnesSum(0, b); got != want {
			t.Fatalf("%x: %#x, want %#x", b, got, want)
		}
		if got := OnesSum(OnesSum(0, b[:cut]), b[cut:]); got != want {
			t.Fatalf("%x split at %d: %#x, want %#x", b, cut, got, want)
		}
	}
}

func TestTags(t *testing.T) {
	got := Tags(EtherType8021AD, EtherType8021Q, EtherType8021Q)
	want := []VLAN{{TPID: EtherType8021AD, ID: 100}, {TPID: EtherType8021Q, ID: 101}, {TPID: EtherType8021Q, ID: 102}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Tags = %v, want %v", got, want)
	}
	if len(Tags()) != 0 {
		t.Errorf("Tags() not empty")
	}
}
