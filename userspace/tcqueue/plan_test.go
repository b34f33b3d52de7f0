package tcqueue

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

func TestShapeFor(t *testing.T) {
	for _, tc := range []struct {
		rate    float64
		bytes   bool
		q       time.Duration
		want    Shape
		wantErr string
	}{
		// 1000/s × 800ms: 800 packets queued; each packet costs 65535 B of 65.535 MB/s.
		{rate: 1000, q: 800 * time.Millisecond, want: Shape{RateBytes: 65_535_000, MPU: PacketMPU, Burst: 2 * PacketMPU, Limit: 800, Packets: true}},
		// Sentinel's golden case: 10/s, 500ms: 5 wait.
		{rate: 10, q: 500 * time.Millisecond, want: Shape{RateBytes: 655_350, MPU: PacketMPU, Burst: 2 * PacketMPU, Limit: 5, Packets: true}},
		// 0.3 × 10 s = 3 despite 0.3 not being exact in binary.
		{rate: 0.3, q: 10 * time.Second, want: Shape{RateBytes: 19661, MPU: PacketMPU, Burst: 2 * PacketMPU, Limit: 3, Packets: true}},
		{rate: 1e8, q: time.Second, want: Shape{RateBytes: 6_553_500_000_000, MPU: PacketMPU, Burst: 2 * PacketMPU, Limit: 100_000_000, Packets: true}},
		// Bytes: the rate itself, a frame of bucket, rate × time of queue.
		{rate: 125e6, bytes: true, q: 100 * time.Millisecond, want: Shape{RateBytes: 125e6, Burst: 1518, Limit: 12_500_000}},
		{rate: 1000, bytes: true, q: time.Millisecond, want: Shape{RateBytes: 1000, Burst: 1518, Limit: 1518}},
		{rate: 1, q: 500 * time.Millisecond, wantErr: "not one packet fits"},
		{rate: 0, q: time.Second, wantErr: "must be positive"},
	} {
		got, err := ShapeFor(tc.rate, tc.bytes, tc.q, 1518)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ShapeFor(%g, %v, %v): error %v, want %q", tc.rate, tc.bytes, tc.q, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ShapeFor(%g, %v, %v) = %+v, %v; want %+v", tc.rate, tc.bytes, tc.q, got, err, tc.want)
		}
		if err == nil && !tc.bytes {
			// The TBF's packet rate is the rule's to half a byte per
			// second of rate × PacketMPU: 2.5e-5 at 0.3/s, 1e-6 from 8/s.
			if r, tol := got.Rate(), 0.5/(tc.rate*PacketMPU); r/tc.rate-1 > tol || 1-r/tc.rate > tol {
				t.Errorf("rate %g: shape enforces %g", tc.rate, r)
			}
		}
	}
}

func TestPortBlocks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi uint16
		n      int
	}{{80, 80, 1}, {0, 65535, 1}, {8000, 8100, 4}, {1, 65535, 16}, {1024, 2047, 1}, {1, 65534, 30}} {
		bs := PortBlocks(tc.lo, tc.hi)
		if len(bs) != tc.n {
			t.Errorf("%d-%d: %d blocks %v, want %d", tc.lo, tc.hi, len(bs), bs, tc.n)
		}
		// Exactly the range, every port checked.
		for p := 0; p < 1<<16; p++ {
			in := false
			for _, b := range bs {
				in = in || uint16(p)&b.Mask == b.Value
			}
			if want := uint16(p) >= tc.lo && uint16(p) <= tc.hi; in != want {
				t.Fatalf("%d-%d: port %d covered %v, want %v", tc.lo, tc.hi, p, in, want)
			}
		}
	}
}

func TestFilters(t *testing.T) {
	spec := Spec{
		Allow: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Queues: []Queue{
			{Rule: "web", Protocol: TCP, SynOnly: true, Ports: []dataplane.PortRange{{Lo: 443, Hi: 443}}, Rate: 100, MaxQueue: time.Second},
			{Rule: "dns", Protocol: Any, Ports: []dataplane.PortRange{{Lo: 53, Hi: 53}},
				Sources: []netip.Prefix{netip.MustParsePrefix("2001:db8::/48")}, Rate: 100, MaxQueue: time.Second},
		},
	}
	fs, err := Filters("eth9", spec)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, f := range fs {
		if f.Pref != uint16(FirstPref+i) {
			t.Errorf("filter %d has pref %d", i, f.Pref)
		}
		got = append(got, f.Sig())
	}
	web, dns := IFBName("eth9", "web"), IFBName("eth9", "dns")
	want := []string{
		`0x0800 [{12 167772160 4278190080}] -> ""`, // allow 10/8: pass
		// web v4: IHL 5, first fragment, TCP, port 443, SYN without ACK.
		`0x0800 [{0 83886080 251658240} {4 0 8191} {8 393216 16711680} {20 443 65535} {32 131072 1179648}] -> "` + web + `"`,
		`0x86dd [{4 1536 65280} {40 443 65535} {52 131072 1179648}] -> "` + web + `"`,
		// dns: IPv6 sources only, TCP and UDP.
		`0x86dd [{4 1536 65280} {8 536939960 4294967295} {12 0 4294901760} {40 53 65535}] -> "` + dns + `"`,
		`0x86dd [{4 4352 65280} {8 536939960 4294967295} {12 0 4294901760} {40 53 65535}] -> "` + dns + `"`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("filters:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(web) != 11 || !strings.HasPrefix(web, IFBPrefix) || web == dns {
		t.Errorf("IFB names %q %q", web, dns)
	}
	// Too many filters: every port of a wide range, many sources.
	big := Spec{Queues: []Queue{{Rule: "x", Protocol: Any, Ports: []dataplane.PortRange{{Lo: 1, Hi: 65534}},
		Sources: make([]netip.Prefix, 20), Rate: 10, MaxQueue: time.Second}}}
	for i := range big.Queues[0].Sources {
		big.Queues[0].Sources[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16)
	}
	if _, err := Filters("eth9", big); err == nil || !strings.Contains(err.Error(), "more than 1024") {
		t.Errorf("20 sources × 2 protocols × 30 port blocks: error %v, want too many filters", err)
	}
}

func TestPlanFilters(t *testing.T) {
	a := Filter{Pref: FirstPref, Match: Match{EthType: ethIPv4, IPProto: ipUDP}, Target: "xlq1"}
	b := Filter{Pref: FirstPref + 1, Match: Match{EthType: ethIPv6, IPProto: ipUDP}, Target: "xlq1"}
	have := map[uint16]string{FirstPref: a.Sig(), FirstPref + 1: "foreign", FirstPref + 2: "stale"}
	p := PlanFilters(have, []Filter{a, b})
	if len(p.Put) != 1 || p.Put[0] != b || len(p.Delete) != 1 || p.Delete[0] != FirstPref+2 {
		t.Errorf("plan %+v: want put b, delete pref %d", p, FirstPref+2)
	}
	if p := PlanFilters(map[uint16]string{FirstPref: a.Sig()}, []Filter{a}); !p.Empty() {
		t.Errorf("plan of what exists: %+v, want nothing", p)
	}
}

func TestNeedsShapeAndRateChanged(t *testing.T) {
	s, _ := ShapeFor(1000, false, time.Second, 1518)
	ok := QdiscState{RootTBF: true, RateBytes: s.RateBytes, Limit: s.Limit, ChildKind: "pfifo"}
	if NeedsShape(ok, s) {
		t.Errorf("a matching TBF over pfifo needs rewriting")
	}
	for _, bad := range []QdiscState{{}, {RootTBF: true, RateBytes: s.RateBytes, Limit: s.Limit, ChildKind: "bfifo"},
		{RootTBF: true, RateBytes: s.RateBytes + 1, Limit: s.Limit, ChildKind: "pfifo"}} {
		if !NeedsShape(bad, s) {
			t.Errorf("%+v does not need rewriting", bad)
		}
	}
	if RateChanged(1000, 1004) || !RateChanged(1000, 1006) || !RateChanged(0, 1) {
		t.Errorf("RateChanged: margin is 0.5%%")
	}
}
