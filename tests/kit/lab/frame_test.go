//go:build linux

package lab

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/xlimit/xlimit/tests/kit/frame"
)

// verifyFrame checks the IPv4 header checksum and the L4 checksum of b by
// summing over the received data (a correct checksum sums to 0xffff).
func verifyFrame(t *testing.T, b []byte, vlans int) {
	t.Helper()
	off := 12 + 4*vlans
	et := binary.BigEndian.Uint16(b[off:])
	l3 := b[off+2:]
	var pseudo uint32
	var l4 []byte
	var proto byte
	switch et {
	case frame.EtherTypeIPv4:
		if c := frame.OnesSum(0, l3[:20]); c != 0xffff {
			t.Errorf("IPv4 header checksum wrong (sum %#x)", c)
		}
		proto = l3[9]
		l4 = l3[20:binary.BigEndian.Uint16(l3[2:])]
		pseudo = frame.OnesSum(frame.OnesSum(0, l3[12:20]), []byte{0, proto}) + uint32(len(l4))
	case frame.EtherTypeIPv6:
		proto = l3[6]
		l4 = l3[40 : 40+binary.BigEndian.Uint16(l3[4:])]
		pseudo = frame.OnesSum(frame.OnesSum(0, l3[8:40]), []byte{0, proto}) + uint32(len(l4))
	default:
		t.Fatalf("ethertype %#x", et)
	}
	if proto == frame.ProtoUDP && binary.BigEndian.Uint16(l4[6:]) == 0 {
		t.Errorf("UDP checksum is zero")
	}
	if c := frame.OnesSum(pseudo, l4); c != 0xffff {
		t.Errorf("L4 (proto %d) checksum wrong (sum %#x)", proto, c)
	}
}

// TestFloodFrame checks the frames Flood sends: valid checksums, the tags,
// the host's header values, and per-packet source rewriting that matches a
// frame built for that source.
func TestFloodFrame(t *testing.T) {
	mac1, _ := net.ParseMAC("02:00:00:00:00:01")
	mac2, _ := net.ParseMAC("02:00:00:00:00:02")
	v4a, v4b := netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.1.2")
	v6a, v6b := netip.MustParseAddr("2001:2::1"), netip.MustParseAddr("2001:2::2")
	for _, proto := range []string{"", ProtoUDP, ProtoTCPSYN} {
		for _, pair := range [][2]netip.Addr{{v4a, v4b}, {v6a, v6b}} {
			for _, vlans := range [][]frame.VLAN{nil, {{ID: 100}}, {{TPID: frame.EtherType8021AD, ID: 10, PCP: 3}, {ID: 4095, DEI: true}}} {
				for _, plen := range []int{0, 1, 7, 1400} {
					s := FloodSpec{SrcMAC: mac1, DstMAC: mac2, VLANs: vlans, Src: pair[0], Dst: pair[1],
						Proto: proto, SrcPort: 1234, DstPort: 80, PayloadLen: plen}
					b, lay, err := floodFrame(s)
					if err != nil {
						t.Fatalf("%+v: %v", s, err)
					}
					verifyFrame(t, b, len(vlans))
					if vlans != nil {
						if tpid := binary.BigEndian.Uint16(b[12:]); tpid != vlans[0].TPID && !(vlans[0].TPID == 0 && tpid == frame.EtherType8021Q) {
							t.Errorf("outer TPID %#x", tpid)
						}
					}
					ip := b[14+4*len(vlans):]
					if pair[0].Is4() && binary.BigEndian.Uint32(ip[4:]) != 0x4000 {
						t.Errorf("IPv4 identification and flags %x, want 0 and DF", ip[4:8])
					}
					if proto == ProtoTCPSYN {
						tcp := ip[lay.L4-lay.L3:]
						if tcp[13] != frame.TCPSyn || binary.BigEndian.Uint32(tcp[4:]) != 0 || binary.BigEndian.Uint16(tcp[14:]) != synWindow {
							t.Errorf("TCP header %x", tcp[:20])
						}
					}
					// Per-packet source rewriting keeps checksums valid and
					// matches a fresh build.
					for range 50 {
						var src netip.Addr
						if pair[0].Is4() {
							src = netip.AddrFrom4([4]byte{byte(rand.Uint32()), byte(rand.Uint32()), byte(rand.Uint32()), byte(rand.Uint32())})
						} else {
							var a [16]byte
							for i := range a {
								a[i] = byte(rand.Uint32())
							}
							src = netip.AddrFrom16(a)
						}
						lay.SetSource(b, src)
						verifyFrame(t, b, len(vlans))
						s2 := s
						s2.Src = src
						fresh, _, err := floodFrame(s2)
						if err != nil {
							t.Fatal(err)
						}
						if string(fresh) != string(b) {
							t.Fatalf("rewritten frame differs from fresh build for %s", src)
						}
					}
				}
			}
		}
	}
	// No MACs are zeros; IPv4-mapped addresses make IPv4.
	b, _, err := floodFrame(FloodSpec{Src: netip.MustParseAddr("::ffff:198.18.1.1"), Dst: netip.MustParseAddr("::ffff:198.18.1.2")})
	if err != nil || string(b[:12]) != string(make([]byte, 12)) || binary.BigEndian.Uint16(b[12:]) != frame.EtherTypeIPv4 {
		t.Errorf("mapped addresses, no MACs: %x, %v", b, err)
	}
	if _, _, err := floodFrame(FloodSpec{Src: v4a, Dst: v6b}); err == nil {
		t.Errorf("mixed families accepted")
	}
	if _, _, err := floodFrame(FloodSpec{Src: v4a, Dst: v4b, Proto: "icmp"}); err == nil {
		t.Errorf("unknown protocol accepted")
	}
	if _, _, err := floodFrame(FloodSpec{Dst: v4b}); err == nil {
		t.Errorf("no source accepted")
	}
	if _, _, err := floodFrame(FloodSpec{Src: v4a}); err == nil {
		t.Errorf("no destination accepted")
	}
}

func TestSourceRand(t *testing.T) {
	for _, p := range []string{"198.18.0.0/15", "10.1.2.3/32", "0.0.0.0/0", "2001:2::/48", "2001:2:0:1::/64", "2001:2::1/128", "2001:2:0:1:8000::/65"} {
		pfx := netip.MustParsePrefix(p).Masked()
		r := newSourceRand(pfx)
		seen := map[netip.Addr]bool{}
		for range 1000 {
			a := r.next()
			if !pfx.Contains(a) {
				t.Fatalf("%s: %s outside", p, a)
			}
			seen[a] = true
		}
		if pfx.Bits() < pfx.Addr().BitLen()-8 && len(seen) < 900 {
			t.Errorf("%s: only %d distinct of 1000", p, len(seen))
		}
	}
}
