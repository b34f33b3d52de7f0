//go:build linux

package maps

import (
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// seedEnv overrides the seed of the randomised tests.
const seedEnv = "XLIMIT_TEST_SEED"

// testSeed returns the seed from XLIMIT_TEST_SEED, or a new one, and logs it.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(seedEnv); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (rerun with %s=%d)", seed, seedEnv, seed)
	return seed
}

// diffSpec is a plan with every kind of rule, tiny rates so that drops
// happen, and both prefix lists.
func diffSpec(malformedPass bool) *dataplane.Spec {
	return &dataplane.Spec{
		MalformedPass: malformedPass,
		Allow:         []netip.Prefix{pfx("10.1.99.0/24"), pfx("2001:db8:1:99::/64")},
		Deny:          []netip.Prefix{pfx("10.3.0.0/16"), pfx("2001:db8:3::/48"), pfx("10.1.98.0/24")},
		Rules: []dataplane.RuleSpec{
			{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 50, Burst: 5},
			{Name: "web-syn", Protocol: "tcp", Ports: []dataplane.PortRange{{Lo: 80, Hi: 80}, {Lo: 443, Hi: 443}, {Lo: 8000, Hi: 8010}},
				SynOnly: true, Rate: 20, Burst: 3},
			{Name: "web", Protocol: "tcp", Ports: ports(80, 80), Fragments: "limit", Rate: 200, Burst: 20},
			{Name: "icmp", Protocol: "icmp", Rate: 10, Burst: 2},
			{Name: "ssh", Protocol: "tcp", Ports: ports(22, 22), Rate: 5, Burst: 2,
				Sources: []netip.Prefix{pfx("10.1.0.0/16"), pfx("2001:db8:1::/48")}},
			{Name: "shadow", Protocol: "udp", Ports: ports(1000, 1999), Shadow: true, Rate: 30, Burst: 3},
			{Name: "bytes", Protocol: "udp", Ports: ports(5000, 5000), Bytes: true, Fragments: "drop", Rate: 20000, Burst: 3000},
			{Name: "any-9999", Protocol: "any", Ports: ports(9999, 9999), Rate: 10, Burst: 1},
			{Name: "udp-src", Protocol: "udp", Rate: 40, Burst: 4,
				Sources: []netip.Prefix{pfx("10.2.0.0/16"), pfx("2001:db8:2::/48")}},
		},
	}
}

// frameGen makes random frames: mostly valid IPv4/IPv6 TCP, UDP and ICMP to
// a few ports from a few prefixes, with VLANs, options, extension headers,
// fragments, and some truncated or corrupted.
type frameGen struct{ rng *rand.Rand }

func (g *frameGen) pick(n int) int { return g.rng.IntN(n) }

func (g *frameGen) chance(p float64) bool { return g.rng.Float64() < p }

func (g *frameGen) src(v6 bool) netip.Addr {
	r := func() byte { return byte(g.rng.Uint32()) }
	if !v6 {
		pool := [][2]byte{{10, 1}, {10, 1}, {10, 2}, {10, 3}, {192, 0}, {10, 9}}
		p := pool[g.pick(len(pool))]
		a := [4]byte{p[0], p[1], r(), r()}
		switch g.pick(8) {
		case 0:
			a[2] = 99 // allowlisted
		case 1:
			a[2] = 98 // denylisted
		case 2:
			a = [4]byte{r(), r(), r(), r()}
		}
		return netip.AddrFrom4(a)
	}
	var a [16]byte
	for i := range a {
		a[i] = r()
	}
	a[0], a[1], a[2], a[3] = 0x20, 0x01, 0x0d, 0xb8
	a[4], a[5] = 0, byte(1+g.pick(4)) // 2001:db8:1..4::/48
	if g.pick(6) == 0 {
		a[5], a[6], a[7] = 1, 0, 99 // 2001:db8:1:99::/64, allowlisted
	}
	if g.pick(10) == 0 {
		a[0] = r()
	}
	return netip.AddrFrom16(a)
}

func (g *frameGen) frame() []byte {
	var s frame.Spec
	v6 := g.chance(0.5)
	s.Src = g.src(v6)
	switch x := g.rng.Float64(); {
	case x < 0.08:
		s.VLANs = frame.Tags(frame.EtherType8021Q)
	case x < 0.13:
		s.VLANs = frame.Tags(frame.EtherType8021AD, frame.EtherType8021Q)
	case x < 0.15:
		s.VLANs = frame.Tags(frame.EtherType8021AD, frame.EtherType8021Q, frame.EtherType8021Q)
	}
	if g.chance(0.02) {
		s.EtherType = []uint16{frame.EtherTypeARP, 0x88cc, frame.EtherTypeIPv4, frame.EtherTypeIPv6}[g.pick(4)]
	}
	portList := []uint16{53, 80, 443, 22, 8005, 1500, 5000, 9999, 7}
	s.DstPort = portList[g.pick(len(portList))]
	if g.chance(0.1) {
		s.DstPort = uint16(g.rng.Uint32())
	}
	s.SrcPort = uint16(g.rng.Uint32())
	switch x := g.rng.Float64(); {
	case x < 0.35:
		s.Proto = frame.ProtoTCP
		s.TCPFlags = []uint8{synFlags, synFlags, synAckFlags, ackFlags, ackFlags, uint8(g.rng.Uint32())}[g.pick(6)]
	case x < 0.7:
		s.Proto = frame.ProtoUDP
	case x < 0.85:
		s.Proto = frame.ProtoICMP
		s.ICMPType = []uint8{8, 0, 3, uint8(g.rng.Uint32())}[g.pick(4)]
		if v6 {
			s.Proto = frame.ProtoICMPv6
			s.ICMPType = []uint8{128, 128, 129, 133, 135, 136, 137, 138, uint8(g.rng.Uint32())}[g.pick(9)]
		}
	case x < 0.9:
		// ICMP of the other family, or ICMPv6 type numbers over IPv4.
		s.Proto = []uint8{frame.ProtoICMP, frame.ProtoICMPv6}[g.pick(2)]
		s.ICMPType = uint8(128 + g.pick(12))
	default:
		s.Proto = []uint8{47, 50, 132, 89}[g.pick(4)]
	}
	switch x := g.rng.Float64(); {
	case x < 0.08:
		s.MoreFragments = true // first fragment
	case x < 0.18:
		s.FragOffset = uint16(1 + g.pick(0x1fff))
		s.MoreFragments = g.chance(0.5)
	}
	if !v6 && g.chance(0.1) {
		s.IPv4OptionWords = 1 + g.pick(10)
	}
	if v6 && (g.chance(0.2) || s.FragOffset != 0 || s.MoreFragments) {
		exts := []uint8{frame.ExtHopByHop, frame.ExtRouting, frame.ExtDstOpts, frame.ExtAH, frame.ExtFragment}
		n := g.pick(4)
		if g.chance(0.2) {
			n = 5 + g.pick(3) // around the bound of 6
		}
		for range n {
			s.IPv6Ext = append(s.IPv6Ext, exts[g.pick(len(exts))])
		}
		if s.FragOffset != 0 || s.MoreFragments {
			s.IPv6Ext = append(s.IPv6Ext, frame.ExtFragment)
		}
	}
	s.PayloadLen = g.pick(200)
	if g.chance(0.1) {
		s.PayloadLen = g.pick(1400)
	}
	f := frame.MustBuild(s)
	switch x := g.rng.Float64(); {
	case x < 0.08 && len(f) > 14:
		f = f[:14+g.pick(len(f)-14)] // truncated somewhere
	case x < 0.11:
		f[g.pick(min(len(f), 80))] = byte(g.rng.Uint32()) // one header byte corrupted
	case x < 0.12 && !v6 && s.EtherType == 0:
		f[14+4*len(s.VLANs)] = 0x40 | byte(g.pick(5)) // IHL < 5
	}
	return f
}

// step returns the next time step: often none, mostly a few ms, sometimes
// up to a second, rarely hours.
func (g *frameGen) step() uint64 {
	switch x := g.rng.Float64(); {
	case x < 0.35:
		return 0
	case x < 0.85:
		return g.rng.Uint64N(3 * second / 1000)
	case x < 0.98:
		return g.rng.Uint64N(second)
	default:
		return g.rng.Uint64N(6 * 3600 * second)
	}
}

// TestDifferential runs a random trace of frames and times through the
// kernel and the model: every packet's verdict must agree, and so must
// every slot's counters after every packet.
func TestDifferential(t *testing.T) {
	h := newHarness(t)
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	g := &frameGen{rng: rng}
	spec := diffSpec(g.chance(0.5))
	h.apply(t, compile(t, spec, nil))
	slots := h.plan.ActiveSlots()

	// Start near boot, a year in, or shortly before the 2^-6 ns units
	// wrap at 2^58 ns, so that the trace crosses the wrap.
	starts := []uint64{second, 365 * 24 * 3600 * second, 1<<58 - 300*second}
	now := starts[g.pick(len(starts))]
	t.Logf("malformed pass %v, start at %d ns", spec.MalformedPass, now)

	const packets = 20000
	var drops, reloads, limits int
	for i := range packets {
		now += g.step()
		switch x := g.rng.Float64(); {
		case x < 0.005:
			// The control loop writes a limit: usually for the rule in the
			// slot, sometimes for another epoch; deadline soon.
			slot := slots[g.pick(len(slots))]
			rate, burst := float64(1+g.pick(500)), float64(1+g.pick(20))
			bytes := h.plan.Rules[slot].Flags&dataplane.RuleBytes != 0
			if bytes {
				rate, burst = rate*1000, burst*100
			}
			b, err := dataplane.NewBucket(rate, burst, bytes)
			if err != nil {
				t.Fatal(err)
			}
			epoch := h.plan.Rules[slot].Epoch
			if g.chance(0.2) {
				epoch = rng.Uint32()
			}
			h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: now + g.rng.Uint64N(200*second/1000), Epoch: epoch})
			limits++
		case x < 0.0055:
			// A reload with new rates for the same rules.
			for j := range spec.Rules {
				spec.Rules[j].Rate = float64(1 + g.pick(100))
				if spec.Rules[j].Bytes {
					spec.Rules[j].Rate *= 1000
				}
			}
			h.apply(t, compile(t, spec, h.plan))
			reloads++
		}
		frame := g.frame()
		pass := h.kernelRun(t, frame, now, 1)
		res := h.model.Eval(frame, now)
		// Every slot's counters, after every packet: the global slot
		// carries the reason, the rule slots each rule's decision.
		if diff := diffCounters(h.counters(t), h.model.Counters, h.plan); pass != res.Pass() || diff != "" {
			pkt, pr := dataplane.Parse(frame)
			t.Fatalf("packet %d at %d ns: kernel pass=%v, model %v/%v; counters:%s\nframe %x\nparse %+v result %d",
				i, now, pass, res.Verdict, res.Reason, diff, frame, pkt, pr)
		}
		if !pass {
			drops++
		}
		if i%5000 == 4999 {
			// The batch read agrees with the per-slot one.
			if diff := diffCounters(h.counters(t), h.counters(t), h.plan); diff != "" {
				t.Fatalf("AllCounters and the batch read differ:%s", diff)
			}
		}
	}
	var rulePackets uint64
	for _, s := range slots {
		c := h.model.Counters[s]
		rulePackets += c.Packets[0] + c.Packets[1] + c.Packets[2]
	}
	t.Logf("%d packets, %d dropped, %d rule decisions, %d limits written, %d reloads, trace ends at %d ns\nglobal: %s",
		packets, drops, rulePackets, limits, reloads, now, fmtCounters(h.model.Counters[dataplane.GlobalSlot]))
	if drops == 0 || drops == packets {
		t.Errorf("the trace dropped %d of %d packets: it exercises nothing", drops, packets)
	}
}
