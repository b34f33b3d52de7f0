//go:build linux

package maps

import (
	"math/rand/v2"
	"net/netip"
	"testing"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Issue 41's fragment findings at the kernel tier, the kernel and the Go
// model side by side: H2 (an IPv6 later fragment's own Next Header decides
// nothing: Linux joins it to its datagram by source, destination and
// identification, and takes the protocol from the first fragment) and M5
// (first fragments to ports no rule names must not turn the fragment
// table over).

// withNextHeader returns a copy of the IPv6 fragment f (built by datagram)
// with nh in its fragment header's Next Header.
func withNextHeader(f []byte, nh byte) []byte {
	g := append([]byte(nil), f...)
	g[14+40] = nh
	return g
}

// TestFragmentIPv6NextHeader is H2: 40 orphan IPv6 later fragments (no
// first fragment ever sent) against a 1000 B/s UDP byte rule are dropped
// as orphans whatever their Next Header; and the later fragments of a
// datagram whose first fragment is UDP to the rule's port are decided by
// that first fragment, Next Header 59 (no next header) or 17 alike.
func TestFragmentIPv6NextHeader(t *testing.T) {
	for _, nh := range []byte{17, 59} {
		t.Run("orphans NH "+itoa(int(nh)), func(t *testing.T) {
			h := newHarness(t)
			h.apply(t, compile(t, fragSpec("", 1000, 1000, true), nil))
			now := uint64(1000 * second)
			before := h.slotCounters(t, dataplane.GlobalSlot)
			passed, bytes := 0, 0
			for i := range 40 {
				frames := datagram(srcA6, 53, uint16(100+i), 1448*2)
				p, b := h.runAll(t, [][]byte{withNextHeader(frames[1], nh)}, now)
				passed += p
				bytes += b
				now += second / 1000
			}
			h.checkCounters(t)
			c := h.slotCounters(t, dataplane.GlobalSlot).Sub(before)
			t.Logf("NH %d: %d of 40 orphan later fragments passed (%d B); global %s", nh, passed, bytes, fmtCounters(c))
			if passed != 0 {
				t.Errorf("NH %d: %d of 40 orphan later fragments passed (%d B through a 1000 B/s rule), want 0", nh, passed, bytes)
			}
			if c.Reasons[dataplane.ReasonFragOrphan] != 40 {
				t.Errorf("NH %d: %d counted fragment_orphan, want 40", nh, c.Reasons[dataplane.ReasonFragOrphan])
			}
		})
		t.Run("joined NH "+itoa(int(nh)), func(t *testing.T) {
			h := newHarness(t)
			h.apply(t, compile(t, fragSpec("", 1000, 3200, true), nil))
			slot := h.slot(t, "dns")
			now := uint64(1000 * second)
			send := func(id uint16) (int, int) {
				frames := datagram(srcA6, 53, id, 8000)
				for i := 1; i < len(frames); i++ {
					frames[i] = withNextHeader(frames[i], nh)
				}
				p, _ := h.runAll(t, frames, now)
				return p, len(frames)
			}
			before := h.slotCounters(t, slot)
			// The full bucket lends the first datagram whole; the second
			// finds it owing: its first fragment is refused, and the rest,
			// useless to the host, must not reach it.
			p1, n1 := send(1)
			p2, n2 := send(2)
			h.checkCounters(t)
			c := h.slotCounters(t, slot).Sub(before)
			t.Logf("NH %d: first datagram %d of %d fragments passed, second %d of %d; rule %s", nh, p1, n1, p2, n2, fmtCounters(c))
			if p1 != n1 {
				t.Errorf("NH %d: %d of %d fragments of the lent datagram passed, want all", nh, p1, n1)
			}
			if p2 != 0 {
				t.Errorf("NH %d: %d of %d fragments of the refused datagram passed, want 0", nh, p2, n2)
			}
			if c.Packets[dataplane.VerdictPass] != uint64(n1) || c.Reasons[dataplane.ReasonFragment] != uint64(n2-1) {
				t.Errorf("NH %d: rule counted %d passed and %d fragment drops, want %d and %d", nh,
					c.Packets[dataplane.VerdictPass], c.Reasons[dataplane.ReasonFragment], n1, n2-1)
			}
		})
	}
}

// TestFragmentTableChurn is M5: with one UDP port rule, a datagram to a
// port no rule names sends its first fragment, then 20 000 spoofed first
// fragments (random sources, 60-byte frames, another unnamed port) arrive
// before its later fragments. The later fragments must still pass: the
// fragment table holds only datagrams whose first fragment met a port
// rule, so the flood cannot evict anything that decides their fate.
func TestFragmentTableChurn(t *testing.T) {
	for _, src := range []netip.Addr{srcA4, srcA6} {
		t.Run(map[bool]string{true: "IPv4", false: "IPv6"}[src.Is4()], func(t *testing.T) {
			h := newHarness(t)
			h.apply(t, compile(t, fragSpec("", 1e6, 1e6, true), nil))
			now := uint64(1000 * second)
			rng := rand.New(rand.NewPCG(41, 5))
			frames := datagram(src, 7777, 4242, 4000)
			if !h.kernelRun(t, frames[0], now, 1) {
				t.Fatal("the first fragment to an unnamed port was dropped")
			}
			const flood = 20000
			for i := range flood {
				var a netip.Addr
				if src.Is4() {
					a = netip.AddrFrom4([4]byte{10, byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))})
				} else {
					var b [16]byte
					b[0], b[1] = 0x20, 0x01
					for j := 2; j < 16; j++ {
						b[j] = byte(rng.IntN(256))
					}
					a = netip.AddrFrom16(b)
				}
				f := datagram(a, 9999, uint16(i), 4000)[0] // MF set: a first fragment
				h.kernelRun(t, f[:min(len(f), 60+20*btoi(src.Is6()))], now, 1)
			}
			passed := 0
			for _, f := range frames[1:] {
				if h.kernelRun(t, f, now, 1) {
					passed++
				}
			}
			g := h.slotCounters(t, dataplane.GlobalSlot)
			t.Logf("after %d spoofed first fragments: %d of %d later fragments of a datagram to an unnamed port passed; global %s",
				flood, passed, len(frames)-1, fmtCounters(g))
			if passed != len(frames)-1 {
				t.Errorf("%d of %d later fragments of a datagram to a port no rule names passed after a flood of first fragments, want all",
					passed, len(frames)-1)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// portlessSpec is one UDP rule without ports: rate and burst in bytes.
func portlessSpec(rate, burst float64) *dataplane.Spec {
	return &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "udp-all", Protocol: "udp", Rate: rate, Burst: burst, Bytes: true},
	}}
}

// TestFragmentPortlessRule is the last round's "a rule without ports
// charges each fragment" (issue 41, lower): a UDP byte rule without ports
// (1000 B/s, burst 3200) and no port rule. A rule without ports must treat
// a fragmented datagram as a port rule does: decided whole at its first
// fragment (the bucket lends a full bucket one datagram of 8 kB, whose
// fragments must all pass; the next, refused, must lose every fragment),
// IPv6 later fragments joined to their datagram whatever their Next Header
// (59 or 17), and orphans dropped. Charged fragment by fragment, the lent
// datagram lost its tail (the host cannot reassemble it: goodput 0 under
// overload, as issue 26 measured for port rules), and with no port rule
// IPv6 fragments were not followed at all: a later fragment naming 59 met
// no UDP rule and passed uncharged.
func TestFragmentPortlessRule(t *testing.T) {
	type variant struct {
		name string
		src  netip.Addr
		nh   byte // IPv6: the later fragments' Next Header
	}
	for _, v := range []variant{{"IPv4", srcA4, 0}, {"IPv6 NH 17", srcA6, 17}, {"IPv6 NH 59", srcA6, 59}} {
		t.Run(v.name+" joined", func(t *testing.T) {
			h := newHarness(t)
			h.apply(t, compile(t, portlessSpec(1000, 3200), nil))
			slot := h.slot(t, "udp-all")
			now := uint64(1000 * second)
			send := func(id uint16) (int, int) {
				frames := datagram(v.src, 53, id, 8000)
				for i := 1; i < len(frames) && v.nh != 0; i++ {
					frames[i] = withNextHeader(frames[i], v.nh)
				}
				p, _ := h.runAll(t, frames, now)
				return p, len(frames)
			}
			before := h.slotCounters(t, slot)
			p1, n1 := send(1)
			p2, n2 := send(2)
			h.checkCounters(t)
			c := h.slotCounters(t, slot).Sub(before)
			t.Logf("%s: first datagram %d of %d fragments passed, second %d of %d; rule %s", v.name, p1, n1, p2, n2, fmtCounters(c))
			if p1 != n1 {
				t.Errorf("%s: %d of %d fragments of the datagram a full bucket lends passed, want all", v.name, p1, n1)
			}
			if p2 != 0 {
				t.Errorf("%s: %d of %d fragments of the refused datagram passed, want 0", v.name, p2, n2)
			}
		})
		t.Run(v.name+" orphans", func(t *testing.T) {
			h := newHarness(t)
			h.apply(t, compile(t, portlessSpec(1000, 3200), nil))
			now := uint64(1000 * second)
			before := h.slotCounters(t, dataplane.GlobalSlot)
			passed, bytes := 0, 0
			for i := range 40 {
				f := datagram(v.src, 53, uint16(100+i), 1448*2)[1]
				if v.nh != 0 {
					f = withNextHeader(f, v.nh)
				}
				p, b := h.runAll(t, [][]byte{f}, now)
				passed += p
				bytes += b
				now += second / 1000
			}
			h.checkCounters(t)
			c := h.slotCounters(t, dataplane.GlobalSlot).Sub(before)
			t.Logf("%s: %d of 40 orphan later fragments passed (%d B); global %s", v.name, passed, bytes, fmtCounters(c))
			if passed != 0 {
				t.Errorf("%s: %d of 40 orphan later fragments passed (%d B through a 1000 B/s rule), want 0", v.name, passed, bytes)
			}
			if c.Reasons[dataplane.ReasonFragOrphan] != 40 {
				t.Errorf("%s: %d counted fragment_orphan, want 40", v.name, c.Reasons[dataplane.ReasonFragOrphan])
			}
		})
	}
}
