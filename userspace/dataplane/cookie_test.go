package dataplane

import (
	"net"
	"net/netip"
	"testing"

	"github.com/xlimit/xlimit/tests/kit/frame"
)

// unanswerableFloods are the spoofed SYNs of issue 41's H1 that the cookie
// path cannot answer, each from source i: what the kernel would discard (a
// TCP data offset past the frame) and what it would answer itself (one
// IPv4 NOP option word, an IPv6 destination-options header).
var unanswerableFloods = []struct {
	name string
	syn  func(i int) []byte
}{
	{"TCP data offset 15 past the frame", func(i int) []byte {
		b := frame.MustBuild(frame.Spec{Src: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Proto: frame.ProtoTCP,
			SrcPort: uint16(1024 + i), DstPort: 80, TCPFlags: frame.TCPSyn})
		b[14+20+12] = 0xf0 // 60 bytes of header, of which 20 are there
		return b
	}},
	{"one IPv4 NOP option word", func(i int) []byte {
		return frame.MustBuild(frame.Spec{Src: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Proto: frame.ProtoTCP,
			IPv4OptionWords: 1, SrcPort: uint16(1024 + i), DstPort: 80, TCPFlags: frame.TCPSyn})
	}},
	{"an IPv6 destination-options header", func(i int) []byte {
		return frame.MustBuild(frame.Spec{Src: netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0xff, 15: byte(i)}),
			Proto: frame.ProtoTCP, IPv6Ext: []uint8{60}, SrcPort: uint16(1024 + i), DstPort: 80, TCPFlags: frame.TCPSyn})
	}},
}

func modelHost() HostAddrs {
	h := HostAddrs{MACKey(net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}): 1}
	for _, a := range []string{"192.0.2.1", "2001:db8::1"} {
		h[IPKey(netip.MustParseAddr(a))] = 1
	}
	h[LeaseKey] = ^uint32(0) // a daemon maintains the map
	return h
}

// TestCookieUnanswerableFloodModel is issue 41's H1 in the Go model: rule
// 10/s, burst 10, `syn_cookies: always`; 50 spoofed SYNs of a class the
// cookie path cannot answer, at one instant, then five real clients, each
// answered with a cookie, whose ACKs must all be admitted. Before the fix
// the flood's first ten SYNs took the whole bucket that the clients' ACKs
// are charged to, and every ACK was refused. Also: the SYNs with a data
// offset past the frame (which Linux discards) are dropped as malformed,
// never passed; the others take at most a quarter of the burst.
func TestCookieUnanswerableFloodModel(t *testing.T) {
	for _, fl := range unanswerableFloods {
		t.Run(fl.name, func(t *testing.T) {
			plan, err := Compile(&Spec{Rules: []RuleSpec{{Name: "web", Protocol: "tcp", Ports: []PortRange{{80, 80}},
				SynOnly: true, Rate: 10, Burst: 10, SynCookies: CookiesAlways}}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			m := &Model{Plan: plan, Host: modelHost(), SrcSets: SrcSets(1 << 10), SrcSeed: 1}
			slot := plan.Slot("web")
			now := uint64(1000e9)
			passed := 0
			for i := range 50 {
				res := m.Eval(fl.syn(i), now)
				if res.Pass() {
					passed++
				}
				if res.Cookie {
					t.Fatalf("flood SYN %d answered with a cookie", i)
				}
			}
			malformed := m.Counters[slot].Reasons[ReasonMalformedL4]
			t.Logf("flood: %d of 50 passed to the kernel, %d dropped as malformed", passed, malformed)
			if fl.name == unanswerableFloods[0].name && (passed != 0 || malformed != 50) {
				t.Errorf("data offset past the frame: %d passed, %d counted malformed_l4: want 0 passed, 50 malformed (Linux discards them)", passed, malformed)
			}
			if passed > 3 {
				t.Errorf("%d of 50 unanswerable SYNs passed and were charged to the rule (burst 10): want at most a quarter of the burst", passed)
			}
			refused := 0
			for i := range 5 {
				src := netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)})
				syn := frame.MustBuild(frame.Spec{Src: src, Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80, TCPFlags: frame.TCPSyn})
				if res := m.Eval(syn, now); !res.Cookie {
					t.Fatalf("real client %d: SYN not answered with a cookie: %+v", i, res)
				}
				ack := frame.MustBuild(frame.Spec{Src: src, Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80, TCPFlags: frame.TCPAck})
				if m.CookieACK(ack, slot, now) {
					refused++
				}
			}
			if refused != 0 {
				t.Errorf("after 50 spoofed SYNs (%s): %d of 5 real clients' valid cookie ACKs refused, want 0", fl.name, refused)
			}
		})
	}
}
