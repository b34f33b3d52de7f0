//go:build linux

package maps

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Per-source ("hot parameter") limits, in the kernel with the fake clock.
// Every case runs the Go model side by side and compares each packet's
// verdict (harness.run), the counters and the per-source table (the
// model's is the kernel's, way for way: its sets and seed, harness.apply).

const psMS = second / 1000

// psT0 is where the tests' timelines start: well after boot, as in
// production (a bucket state of zero means something else).
const psT0 = 1000 * second

// newPSHarness is newHarness with a per-source table of tableSize entries
// (0: the default).
func newPSHarness(tb testing.TB, tableSize int) *harness {
	tb.Helper()
	requireRoot(tb)
	pinToOneCPU(tb)
	o, err := Load(Options{FakeClock: true, SourceTableSize: tableSize})
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	tb.Cleanup(func() { o.Close() })
	h := &harness{obj: o, tab: o.Tables(), model: &dataplane.Model{}}
	h.bind(tb)
	return h
}

// psRule is a UDP rule on port with a rule-wide rate and a per-source limit.
func psRule(name string, port uint16, rate, burst float64, ps dataplane.PerSourceSpec) dataplane.RuleSpec {
	return dataplane.RuleSpec{Name: name, Protocol: "udp", Ports: ports(port, port), Rate: rate, Burst: burst, PerSource: &ps}
}

// psKey is the model's key of a kernel table entry.
func psKey(s Source) dataplane.SourceKey {
	k := dataplane.SourceKey{Slot: uint32(s.Slot), PrefixLen: uint8(s.Prefix.Bits())}
	if s.Prefix.Addr().Is4() {
		k.Family = 4
		a := s.Prefix.Addr().As4()
		copy(k.Addr[:], a[:])
	} else {
		k.Family = 6
		k.Addr = s.Prefix.Addr().As16()
	}
	return k
}

// psSources lists the kernel's per-source table for a slot (all slots when
// slot < 0), most dropped first.
func psSources(tb testing.TB, h *harness, slot int) []Source {
	tb.Helper()
	s, err := h.tab.Sources(slot, 0)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// psFind returns the kernel's entry for a prefix in a slot.
func psFind(list []Source, slot int, p netip.Prefix) (Source, bool) {
	for _, s := range list {
		if s.Slot == slot && s.Prefix == p {
			return s, true
		}
	}
	return Source{}, false
}

// psCompareTable fails unless the kernel's per-source table (every slot)
// holds exactly the model's entries with the same state.
func psCompareTable(tb testing.TB, h *harness) {
	tb.Helper()
	kernel := psSources(tb, h, -1)
	model := h.model.Sources()
	if len(kernel) != len(model) {
		tb.Errorf("per-source table: kernel has %d entries, model %d", len(kernel), len(model))
	}
	for _, s := range kernel {
		m, ok := model[psKey(s)]
		if !ok {
			tb.Errorf("per-source table: kernel entry slot %d %s is not in the model", s.Slot, s.Prefix)
			continue
		}
		if *m != s.SourceState {
			tb.Errorf("per-source table: slot %d %s: kernel %+v, model %+v", s.Slot, s.Prefix, s.SourceState, *m)
		}
	}
}

// psCompareCounters fails unless the kernel's counters equal the model's
// for every slot.
func psCompareCounters(tb testing.TB, h *harness) {
	tb.Helper()
	if d := diffCounters(h.counters(tb), h.model.Counters, h.plan); d != "" {
		tb.Errorf("kernel counters (got) differ from the model's (want):%s", d)
	}
}

// TestSourceAccuracy offers three sources (two IPv4, one IPv6) three times
// their per-source rate of 100/s each for 10 s of fake-clock time, in 10 ms
// steps, interleaved (the order rotates every step). With a generous
// rule-wide rate each source is held to rate·10 s + burst within one
// packet; with a tight rule-wide rate (150/s, below the three sources'
// 300/s) the rule admits rate·10 s + burst in all, within the cache bound
// (one CPU: max(1 packet, rate × 50 µs)), and no source more than its own
// limit.
func TestSourceAccuracy(t *testing.T) {
	const (
		step    = 10 * psMS
		steps   = 1000 // 10 s
		psRate  = 100.0
		psBurst = 10
		perStep = 3 // the per-source bucket refills one packet a step
	)
	duration := float64(steps*step) / 1e9
	srcs := []netip.Addr{
		netip.MustParseAddr("192.0.2.10"),
		netip.MustParseAddr("192.0.2.20"),
		netip.MustParseAddr("2001:db8:1::10"),
	}
	cases := []struct {
		name        string
		rate, burst float64
		tight       bool
	}{
		{"generous rule-wide rate", 1e6, 1e6, false},
		{"tight rule-wide rate", 150, 15, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newPSHarness(t, 0)
			h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
				psRule("r", 53, c.rate, c.burst, dataplane.PerSourceSpec{Rate: psRate, Burst: psBurst, PrefixV4: 32, PrefixV6: 64}),
			}}, nil))
			slot := h.slot(t, "r")
			frames := make([][]byte, len(srcs))
			for i, s := range srcs {
				frames[i] = build(udpTo(s, 53))
			}
			admitted := make([]int, len(srcs))
			offered := make([]int, len(srcs))
			for k := range steps + 1 {
				now := psT0 + uint64(k)*step
				n := perStep
				if k == 0 {
					n += psBurst
				}
				for range n {
					for j := range srcs {
						i := (j + k) % len(srcs)
						pass, _ := h.run(t, frames[i], now)
						offered[i]++
						if pass {
							admitted[i]++
						}
					}
				}
			}
			got := h.slotCounters(t, slot)
			total := 0
			for i, s := range srcs {
				total += admitted[i]
				t.Logf("%s: offered %d, admitted %d = %.2f/s beyond the burst", s, offered[i], admitted[i], (float64(admitted[i])-psBurst)/duration)
			}
			t.Logf("rule (rule-wide %v/s, burst %v): admitted %d in all, expected at most %.0f; drops: %d rule, %d source",
				c.rate, c.burst, total, min(c.rate*duration+c.burst, float64(len(srcs))*(psRate*duration+psBurst)),
				got.Reasons[dataplane.ReasonRule], got.Reasons[dataplane.ReasonSource])

			psWant := psRate*duration + psBurst
			for i, s := range srcs {
				a := float64(admitted[i])
				if !c.tight && (a < psWant-1 || a > psWant+1) {
					t.Errorf("%s admitted %d, want rate·T + burst = %.0f within one packet", s, admitted[i], psWant)
				}
				if c.tight && a > psWant+1 {
					t.Errorf("%s admitted %d, more than its own limit %.0f", s, admitted[i], psWant)
				}
			}
			if c.tight {
				// One CPU: the cache holds at most max(1 packet, 50 µs of
				// the rate); the rate is 150/s, so one packet.
				bound := c.rate*duration + c.burst + max(1, c.rate*dataplane.BatchNS/1e9)
				if float64(total) > bound {
					t.Errorf("rule admitted %d, bound rate·T + burst + batch = %.2f", total, bound)
				}
				// The sources offer 900/s and may pass 300/s of their own:
				// the rule-wide bucket is saturated and must not starve.
				if low := c.rate*duration + c.burst - 1; float64(total) < low {
					t.Errorf("rule admitted %d, want at least %.0f (saturated)", total, low)
				}
			}
			if got.Packets[dataplane.VerdictPass] != uint64(total) {
				t.Errorf("slot counted %d passes, the runs %d", got.Packets[dataplane.VerdictPass], total)
			}
			if !c.tight && got.Reasons[dataplane.ReasonRule] != 0 {
				t.Errorf("the generous rule-wide bucket dropped %d", got.Reasons[dataplane.ReasonRule])
			}
			// Every per-source drop is in its source's entry.
			list := psSources(t, h, slot)
			for i, s := range srcs {
				plen := 32
				if s.Is6() {
					plen = 64
				}
				e, ok := psFind(list, slot, netip.PrefixFrom(s, plen).Masked())
				if !ok {
					t.Errorf("%s: no entry in the per-source table", s)
					continue
				}
				if !c.tight && e.Drops != uint64(offered[i]-admitted[i]) {
					t.Errorf("%s: entry counts %d drops, %d were dropped", s, e.Drops, offered[i]-admitted[i])
				}
			}
			psCompareCounters(t, h)
			psCompareTable(t, h)
		})
	}
}

// TestSourcePrefixAggregation: two addresses share a per-source bucket
// exactly when they are in the same prefix of the rule's length, for whole
// and partial bytes, IPv4 and IPv6; an IPv4 packet is aggregated by
// prefix_v4 only, an IPv6 one by prefix_v6 only, and the two families never
// share. Per-source rate 1/s, burst 3: a sends 4 packets (3 pass, 1 drop),
// then b sends 5 (none pass when they share, 3 when not).
func TestSourcePrefixAggregation(t *testing.T) {
	cases := []struct {
		name     string
		p4, p6   int
		a, b     string
		share    bool
		wantKeys []string // the table's prefixes, most dropped first
	}{
		{"IPv4 /24: same /24", 24, 64, "192.0.2.10", "192.0.2.200", true, []string{"192.0.2.0/24"}},
		{"IPv4 /32: same /24", 32, 64, "192.0.2.10", "192.0.2.200", false, []string{"192.0.2.200/32", "192.0.2.10/32"}},
		{"IPv4 /24: other /24", 24, 64, "192.0.2.10", "192.0.3.10", false, []string{"192.0.3.0/24", "192.0.2.0/24"}},
		{"IPv4 /25: same /25", 25, 64, "192.0.2.1", "192.0.2.127", true, []string{"192.0.2.0/25"}},
		{"IPv4 /25: other /25", 25, 64, "192.0.2.127", "192.0.2.128", false, []string{"192.0.2.128/25", "192.0.2.0/25"}},
		{"IPv4 /20: same /20", 20, 64, "198.51.16.1", "198.51.31.254", true, []string{"198.51.16.0/20"}},
		{"IPv4 /20: other /20", 20, 64, "198.51.31.254", "198.51.32.1", false, []string{"198.51.32.0/20", "198.51.16.0/20"}},
		{"IPv4 /1", 1, 64, "1.2.3.4", "127.0.0.9", true, []string{"0.0.0.0/1"}},
		{"IPv4 ignores prefix_v6", 32, 1, "192.0.2.10", "192.0.2.11", false, []string{"192.0.2.11/32", "192.0.2.10/32"}},
		{"IPv6 /64: same /64", 32, 64, "2001:db8:1:2::10", "2001:db8:1:2:ffff::1", true, []string{"2001:db8:1:2::/64"}},
		{"IPv6 /128: same /64", 32, 128, "2001:db8:1:2::10", "2001:db8:1:2:ffff::1", false, []string{"2001:db8:1:2:ffff::1/128", "2001:db8:1:2::10/128"}},
		{"IPv6 /64: other /64", 32, 64, "2001:db8:1:2::10", "2001:db8:1:3::10", false, []string{"2001:db8:1:3::/64", "2001:db8:1:2::/64"}},
		{"IPv6 /60: same /60", 32, 60, "2001:db8:1:20::1", "2001:db8:1:2f:ffff::1", true, []string{"2001:db8:1:20::/60"}},
		{"IPv6 /60: other /60", 32, 60, "2001:db8:1:2f::1", "2001:db8:1:30::1", false, []string{"2001:db8:1:30::/60", "2001:db8:1:20::/60"}},
		{"IPv6 /127", 32, 127, "2001:db8::4", "2001:db8::5", true, []string{"2001:db8::4/127"}},
		{"IPv6 ignores prefix_v4", 1, 128, "2001:db8::1", "2001:db8::2", false, []string{"2001:db8::2/128", "2001:db8::1/128"}},
		{"IPv4 and IPv4-mapped IPv6 never share", 32, 128, "192.0.2.10", "::ffff:192.0.2.10", false, []string{"::ffff:192.0.2.10/128", "192.0.2.10/32"}},
	}
	// One program for every case, each with its own rule on its own
	// port: a load costs about 10 s under TCG (make test-kernel-qemu),
	// and each rule's sources live in its own slot.
	h := newPSHarness(t, 0)
	var rules []dataplane.RuleSpec
	for i, c := range cases {
		rules = append(rules, psRule("agg-"+itoa(i), uint16(1000+i), 1e6, 1e6, dataplane.PerSourceSpec{Rate: 1, Burst: 3, PrefixV4: c.p4, PrefixV6: c.p6}))
	}
	h.apply(t, compile(t, &dataplane.Spec{Rules: rules}, nil))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.enter(t)
			name, port := "agg-"+itoa(i), uint16(1000+i)
			slot := h.slot(t, name)
			now := psT0 + uint64(i)*1000*second
			a, b := netip.MustParseAddr(c.a), netip.MustParseAddr(c.b)
			if got := offer(t, h, slot, build(udpTo(a, port)), now, 4); got != 3 {
				t.Errorf("%s admitted %d of 4, want its burst of 3", a, got)
			}
			want := 3
			if c.share {
				want = 0
			}
			if got := offer(t, h, slot, build(udpTo(b, port)), now, 5); got != want {
				t.Errorf("%s after %s: admitted %d of 5, want %d (share=%v)", b, a, got, want, c.share)
			}
			var keys []string
			var drops []uint64
			for _, s := range psSources(t, h, slot) {
				keys = append(keys, s.Prefix.String())
				drops = append(drops, s.Drops)
			}
			wantDrops := []uint64{2, 1}
			if c.share {
				wantDrops = []uint64{6}
			}
			if !slices.Equal(keys, c.wantKeys) || !slices.Equal(drops, wantDrops) {
				t.Errorf("table entries %v with drops %v, want %v with %v", keys, drops, c.wantKeys, wantDrops)
			}
			psCompareTable(t, h)
			psCompareCounters(t, h)
		})
	}
}

// TestSourceListing: Tables.Sources lists a slot's sources, IPv4 and IPv6,
// with their prefixes (as aggregated) and drop counts, most dropped first,
// at most n; slot -1 lists every slot.
func TestSourceListing(t *testing.T) {
	h := newPSHarness(t, 0)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		psRule("wide", 53, 1e6, 1e6, dataplane.PerSourceSpec{Rate: 1, Burst: 1, PrefixV4: 24, PrefixV6: 48}),
		psRule("narrow", 54, 1e6, 1e6, dataplane.PerSourceSpec{Rate: 1, Burst: 1, PrefixV4: 32, PrefixV6: 128}),
	}}, nil))
	wide, narrow := h.slot(t, "wide"), h.slot(t, "narrow")
	send := []struct {
		src  string
		port uint16
		n    int
	}{
		{"198.51.100.7", 53, 4}, {"198.51.100.200", 53, 4}, // 198.51.100.0/24: 7 drops
		{"203.0.113.9", 53, 3},                                      // 2 drops
		{"2001:db8:aa:1::1", 53, 5}, {"2001:db8:aa:ffff::2", 53, 5}, // 2001:db8:aa::/48: 9 drops
		{"2001:db8:bb::1", 53, 5}, // 4 drops
		{"192.0.2.1", 53, 1},      // an entry without a drop
		{"198.51.100.7", 54, 6},   // 5 drops
		{"2001:db8:aa:1::1", 54, 2},
	}
	for _, s := range send {
		for range s.n {
			h.run(t, build(udpTo(netip.MustParseAddr(s.src), s.port)), psT0)
		}
	}
	type entry struct {
		slot  int
		pfx   string
		drops uint64
	}
	list := func(slot, n int) []entry {
		got, err := h.tab.Sources(slot, n)
		if err != nil {
			t.Fatal(err)
		}
		var out []entry
		for _, s := range got {
			out = append(out, entry{s.Slot, s.Prefix.String(), s.Drops})
		}
		return out
	}
	wantWide := []entry{
		{wide, "2001:db8:aa::/48", 9}, {wide, "198.51.100.0/24", 7}, {wide, "2001:db8:bb::/48", 4},
		{wide, "203.0.113.0/24", 2}, {wide, "192.0.2.0/24", 0},
	}
	wantNarrow := []entry{{narrow, "198.51.100.7/32", 5}, {narrow, "2001:db8:aa:1::1/128", 1}}
	if got := list(wide, 3); !slices.Equal(got, wantWide[:3]) {
		t.Errorf("Sources(%d, 3) = %v, want %v", wide, got, wantWide[:3])
	}
	if got := list(wide, 0); !slices.Equal(got, wantWide) {
		t.Errorf("Sources(%d, 0) = %v, want %v", wide, got, wantWide)
	}
	if got := list(narrow, 10); !slices.Equal(got, wantNarrow) {
		t.Errorf("Sources(%d, 10) = %v, want %v", narrow, got, wantNarrow)
	}
	all := slices.Concat(wantWide[:2], wantNarrow[:1], wantWide[2:4], wantNarrow[1:], wantWide[4:])
	if got := list(-1, 0); !slices.Equal(got, all) {
		t.Errorf("Sources(-1, 0) = %v, want %v", got, all)
	}
	psCompareTable(t, h)
	psCompareCounters(t, h)
}

// psSourceGen draws sources whose per-source keys (at prefix_v4 32 and
// prefix_v6 64) were never drawn before, half IPv4 in 10.0.0.0/8, half
// IPv6 in 2001:db8::/32.
type psSourceGen struct {
	rng  *rand.Rand
	seen map[netip.Prefix]bool
}

func newPSSourceGen(seed uint64) *psSourceGen {
	return &psSourceGen{rng: rand.New(rand.NewPCG(seed, 0x5eed)), seen: map[netip.Prefix]bool{}}
}

func (g *psSourceGen) fresh() netip.Addr {
	for {
		var a netip.Addr
		var p netip.Prefix
		if g.rng.IntN(2) == 0 {
			v := g.rng.Uint32()
			a = netip.AddrFrom4([4]byte{10, byte(v >> 16), byte(v >> 8), byte(v)})
			p = netip.PrefixFrom(a, 32)
		} else {
			var b [16]byte
			b[0], b[1], b[2], b[3] = 0x20, 0x01, 0x0d, 0xb8
			hi, lo := g.rng.Uint64(), g.rng.Uint64()
			for i := range 4 {
				b[4+i] = byte(hi >> (8 * i))
			}
			for i := range 8 {
				b[8+i] = byte(lo >> (8 * i))
			}
			a = netip.AddrFrom16(b)
			p = netip.PrefixFrom(a, 64).Masked()
		}
		if !g.seen[p] {
			g.seen[p] = true
			return a
		}
	}
}

// TestSourceTableChurn loads the program with a small per-source table and
// floods it with tens of thousands of sources: the rule-wide bucket holds
// whatever the table forgets, and kernel and model (whose table is the
// kernel's, way for way) agree.
//
//   - Fresh sources: every packet comes from a source never seen before
//     (20000/s for 2 s, a table of 64): each takes a way, the table never
//     holds more than its size, and the rule admits rate·T + burst within
//     the cache bound. A source offered while the rule-wide bucket is
//     known to be empty is dropped without taking a way.
//   - Hot sources kept through churn: 8 sources at 10× their per-source
//     rate among 10000 new sources a second, under a rule-wide rate that
//     does not bind, in a table of 1024 (256 sets: a set takes a new
//     source every 26 ms, a hot source comes back every 10 ms). A new
//     source takes the way that owes least, and a hot source owes more
//     than a new one from its second packet on: each is held to its limit.
//   - Hot sources in a table too small: the same in a table of 64 (16
//     sets: a new source every 1.6 ms, each set turned over before a hot
//     source's second packet). A hot source is forgotten until it owes
//     more than a new one, and each time it is admitted its burst again:
//     the documented cost of a table too small for the churn (1014 of 200
//     here at 6024c13; the LRU's cost was larger: 1601 admitted of 200 at
//     cd7296b, bench/results/issue28/test-before-cd7296b-lru-eviction.txt).
//     Only kernel and model are compared.
//   - Churn saturating the rule: the same with the rule-wide rate binding:
//     the rule admits rate·T + burst within the cache bound whatever the
//     table did.
func TestSourceTableChurn(t *testing.T) {
	const step = psMS
	ps := dataplane.PerSourceSpec{Rate: 10, Burst: 5, PrefixV4: 32, PrefixV6: 64}
	t.Run("fresh sources", func(t *testing.T) {
		const table = 64
		const rate, burst, perStep, steps = 1000.0, 100.0, 20, 2000 // 20000/s for 2 s
		h := newPSHarness(t, table)
		h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{psRule("churn", 53, rate, burst, ps)}}, nil))
		slot := h.slot(t, "churn")
		gen := newPSSourceGen(1)
		maxTable := 0
		for k := range steps + 1 {
			now := psT0 + uint64(k)*step
			for range perStep {
				h.run(t, build(udpTo(gen.fresh(), 53)), now)
			}
			if k%200 == 0 {
				maxTable = max(maxTable, len(psSources(t, h, -1)))
			}
		}
		c := h.slotCounters(t, slot)
		admitted := float64(c.Packets[dataplane.VerdictPass])
		T := float64(steps*step) / 1e9
		bound := rate*T + burst + max(1, rate*dataplane.BatchNS/1e9)
		t.Logf("%d fresh sources: admitted %.0f (bound %.0f), drops %d rule, %d source; kernel table at most %d entries, model table %d",
			len(gen.seen), admitted, bound, c.Reasons[dataplane.ReasonRule], c.Reasons[dataplane.ReasonSource], maxTable, len(h.model.Sources()))
		if admitted > bound || admitted < rate*T+burst-1 {
			t.Errorf("admitted %.0f, want rate·T + burst = %.0f (at most %.0f)", admitted, rate*T+burst, bound)
		}
		if maxTable > table {
			t.Errorf("the table held %d entries, its size is %d", maxTable, table)
		}
		psCompareTable(t, h)
		psCompareCounters(t, h)

		// The rule-wide bucket is empty and this CPU's cache knows it: a new
		// source is dropped before the per-source table is touched.
		now := psT0 + steps*step
		x := netip.MustParseAddr("192.0.2.99")
		before := h.slotCounters(t, slot)
		if pass, res := h.run(t, build(udpTo(x, 53)), now); pass || res.Reason != dataplane.ReasonRule {
			t.Errorf("new source while the rule is known empty: pass=%v reason %v, want a RULE drop", pass, res.Reason)
		}
		if d := h.slotCounters(t, slot).Sub(before); d.Reasons[dataplane.ReasonRule] != 1 {
			t.Errorf("counted %s, want one RULE drop", fmtCounters(d))
		}
		if _, ok := psFind(psSources(t, h, slot), slot, netip.PrefixFrom(x, 32)); ok {
			t.Errorf("%s entered the per-source table although the rule-wide bucket was known empty", x)
		}
	})

	hot := func(t *testing.T, table int, rate, burst float64, churnPerStep int) (kernelHot, modelHot, admitted, modelAdmitted int, T float64) {
		const steps = 2000 // 2 s
		h := newPSHarness(t, table)
		h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{psRule("hot", 53, rate, burst, ps)}}, nil))
		slot := h.slot(t, "hot")
		gen := newPSSourceGen(2)
		var hotFrames [][]byte
		for i := range 8 {
			hotFrames = append(hotFrames, build(udpTo(netip.AddrFrom4([4]byte{192, 0, 2, byte(100 + i)}), 53)))
		}
		for k := range steps + 1 {
			now := psT0 + uint64(k)*step
			for i := range churnPerStep {
				f := build(udpTo(gen.fresh(), 53))
				h.kernelRun(t, f, now, 1)
				h.model.Eval(f, now)
				// Each hot source every 10 ms (100/s, 10× its limit),
				// spread over the steps and among the churn.
				if j := k % 10; i == churnPerStep/2 && j < len(hotFrames) {
					if h.kernelRun(t, hotFrames[j], now, 1) {
						kernelHot++
					}
					if h.model.Eval(hotFrames[j], now).Pass() {
						modelHot++
					}
				}
			}
		}
		psCompareTable(t, h)
		c := h.slotCounters(t, slot)
		T = float64(steps*step) / 1e9
		return kernelHot, modelHot, int(c.Packets[dataplane.VerdictPass]), int(h.model.Counters[slot].Packets[dataplane.VerdictPass]), T
	}
	t.Run("hot sources kept through churn", func(t *testing.T) {
		kernelHot, modelHot, admitted, modelAdmitted, T := hot(t, 1024, 1e6, 1e6, 10)
		limit := 8 * (ps.Rate*T + ps.Burst)
		t.Logf("8 hot sources at 100/s each among 10000 new sources/s, a table of 1024: kernel admitted %d of theirs, the model %d, "+
			"their per-source limit %.0f; all sources: kernel %d, model %d", kernelHot, modelHot, limit, admitted, modelAdmitted)
		if kernelHot != modelHot || admitted != modelAdmitted {
			t.Errorf("kernel admitted %d (hot %d), the model %d (hot %d)", admitted, kernelHot, modelAdmitted, modelHot)
		}
		if float64(kernelHot) > limit+8 {
			t.Errorf("the hot sources were admitted %d, over their limit %.0f: churn took their ways", kernelHot, limit)
		}
	})
	t.Run("hot sources in a table too small", func(t *testing.T) {
		kernelHot, modelHot, admitted, modelAdmitted, T := hot(t, 64, 1e6, 1e6, 10)
		limit := 8 * (ps.Rate*T + ps.Burst)
		t.Logf("8 hot sources at 100/s each among 10000 new sources/s, a table of 64: kernel admitted %d of theirs, the model %d, "+
			"their per-source limit %.0f, offered %d; all sources: kernel %d, model %d", kernelHot, modelHot, limit, 8*int(100*T), admitted, modelAdmitted)
		if kernelHot != modelHot || admitted != modelAdmitted {
			t.Errorf("kernel admitted %d (hot %d), the model %d (hot %d)", admitted, kernelHot, modelAdmitted, modelHot)
		}
	})
	t.Run("churn saturating the rule", func(t *testing.T) {
		const rate, burst = 1000.0, 100.0
		kernelHot, modelHot, admitted, modelAdmitted, T := hot(t, 64, rate, burst, 20)
		bound := rate*T + burst + max(1, rate*dataplane.BatchNS/1e9)
		t.Logf("rule %v/s burst %v, 20000 new sources/s and 8 hot ones: kernel admitted %d (hot %d), model %d (hot %d); bound %.0f",
			rate, burst, admitted, kernelHot, modelAdmitted, modelHot, bound)
		if float64(admitted) > bound {
			t.Errorf("the rule admitted %d under churn, over rate·T + burst + batch = %.0f", admitted, bound)
		}
		if float64(admitted) < rate*T+burst-1 {
			t.Errorf("the rule admitted %d under churn, want rate·T + burst = %.0f (saturated)", admitted, rate*T+burst)
		}
	})
}

// TestSourceBan: per-source 10/s, burst 5, ban after 1 s for 5 s.
//
//   - S offers 50/s: after its first over-limit packet it is banned at the
//     first over-limit packet at least 1 s later, and then dropped outright
//     (nothing admitted) for 5 s; at the end of the ban it is still over,
//     so the ban is renewed for another 5 s. S falls to 5/s (under its
//     limit) 2 s into the renewed ban: it stays banned to the end
//     (hysteresis), and is released then: everything passes afterwards.
//   - Q offers 5/s throughout: never dropped, never banned.
//   - R alternates 400 ms at 50/s with 3 s at 2/s: it is over its limit
//     in runs shorter than `after`, and its bucket refills in between, so
//     it is never banned and passes everything in its quiet phases.
//
// Every packet is compared with the model, and so is the table.
func TestSourceBan(t *testing.T) {
	const tick = 20 * psMS
	const banAfter, banFor = second, 5 * second
	h := newPSHarness(t, 0)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		psRule("ban", 53, 1e6, 1e6, dataplane.PerSourceSpec{Rate: 10, Burst: 5, PrefixV4: 32, PrefixV6: 64,
			BanAfter: time.Duration(banAfter), BanDuration: time.Duration(banFor)}),
	}}, nil))
	slot := h.slot(t, "ban")
	S, Q, R := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::3")
	fS, fQ, fR := build(udpTo(S, 53)), build(udpTo(Q, 53)), build(udpTo(R, 53))
	pS, pQ, pR := netip.PrefixFrom(S, 32), netip.PrefixFrom(Q, 32), netip.PrefixFrom(R, 64).Masked()

	state := func(p netip.Prefix) dataplane.SourceState {
		e, ok := psFind(psSources(t, h, slot), slot, p)
		if !ok {
			// A source seen once has no entry yet (the front): its
			// bucket is full and it has no ban; the model agrees.
			if _, inModel := h.model.Sources()[psKey(Source{Slot: slot, Prefix: p})]; !inModel {
				return dataplane.SourceState{}
			}
			t.Fatalf("%s: no table entry", p)
		}
		return e.SourceState
	}
	// firstDrop: S's first over-limit packet; dueBan: its first over-limit
	// packet at least banAfter later, where the ban must start.
	var firstDrop, dueBan, banStart, renewedAt, underAt, releasedAt uint64
	var sAdmitted [4]int // before the ban, first ban, renewed ban, after release
	var sOffered [4]int
	var qDrops, rBanned, rQuietDrops int
	const end = psT0 + 20*second
	for now := uint64(psT0); now < end; now += tick {
		i := (now - psT0) / tick
		// S: 50/s until 2 s into the renewed ban, then 5/s.
		if underAt == 0 && renewedAt != 0 && now >= renewedAt+2*second {
			underAt = now
		}
		if underAt == 0 || i%10 == 0 {
			pass, _ := h.run(t, fS, now)
			if !pass && firstDrop == 0 {
				firstDrop = now
			}
			if !pass && dueBan == 0 && firstDrop != 0 && now >= firstDrop+banAfter {
				dueBan = now
			}
			st := state(pS)
			switch {
			case banStart == 0 && st.BannedUntilNS != 0:
				banStart = now
				if st.BannedUntilNS != now+banFor {
					t.Errorf("ban at %d ns lasts until %d, want %d", now, st.BannedUntilNS, now+banFor)
				}
			case banStart != 0 && renewedAt == 0 && st.BannedUntilNS != banStart+banFor:
				renewedAt = now
				if now != banStart+banFor || st.BannedUntilNS != now+banFor {
					t.Errorf("ban of S (+%v..+%v ms) changed at +%v ms to until %d: want a renewal at its end for %v, "+
						"S being still over its limit", psAt(banStart), psAt(banStart+banFor), psAt(now), st.BannedUntilNS, banFor)
				}
			case renewedAt != 0 && releasedAt == 0 && st.BannedUntilNS == 0:
				releasedAt = now
			}
			// The phase after this packet's verdict: the packet that
			// releases S passes, and belongs to the release.
			phase := 0
			switch {
			case releasedAt != 0:
				phase = 3
			case renewedAt != 0:
				phase = 2
			case banStart != 0:
				phase = 1
			}
			sOffered[phase]++
			if pass {
				sAdmitted[phase]++
			}
		}
		// Q: 5/s.
		if i%10 == 5 {
			if pass, _ := h.run(t, fQ, now); !pass {
				qDrops++
			}
		}
		// R: 400 ms at 50/s, then 2/s from 500 ms after that run (when its
		// bucket is full again) to the end of a 3.4 s cycle.
		cyc := (now - psT0) % (3400 * psMS)
		if cyc < 400*psMS || (cyc >= 900*psMS && (cyc-900*psMS)%(500*psMS) == 0) {
			pass, _ := h.run(t, fR, now)
			if cyc >= 400*psMS && !pass {
				rQuietDrops++
			}
			if state(pR).BannedUntilNS != 0 {
				rBanned++
			}
		}
	}
	t.Logf("S: first drop at +%v ms, banned at +%v ms, renewed at +%v ms, under its limit from +%v ms, released at +%v ms",
		psAt(firstDrop), psAt(banStart), psAt(renewedAt), psAt(underAt), psAt(releasedAt))
	t.Logf("S admitted/offered: before the ban %d/%d, first ban %d/%d, renewed ban %d/%d, after release %d/%d",
		sAdmitted[0], sOffered[0], sAdmitted[1], sOffered[1], sAdmitted[2], sOffered[2], sAdmitted[3], sOffered[3])
	if firstDrop == 0 || banStart == 0 {
		t.Fatalf("S was never dropped (%v) or never banned (%v)", psAt(firstDrop), psAt(banStart))
	}
	if banStart != dueBan {
		t.Errorf("S banned at +%v ms, want at its first over-limit packet 1 s or more after its first one (+%v ms): +%v ms",
			psAt(banStart), psAt(firstDrop), psAt(dueBan))
	}
	if want := 5 + 10*float64(banStart-psT0)/1e9; float64(sAdmitted[0]) > want+1 || float64(sAdmitted[0]) < want-1 {
		t.Errorf("S admitted %d before its ban, want burst + rate·t = %.1f", sAdmitted[0], want)
	}
	if sAdmitted[1] != 0 || sAdmitted[2] != 0 {
		t.Errorf("banned S admitted %d in the first ban and %d in the renewed one, want 0", sAdmitted[1], sAdmitted[2])
	}
	if renewedAt == 0 {
		t.Errorf("the ban of S (still over its limit) was not renewed")
	}
	if releasedAt == 0 {
		t.Errorf("S (under its limit since +%v ms) was never released", psAt(underAt))
	} else if releasedAt < renewedAt+banFor || releasedAt >= renewedAt+banFor+10*tick {
		t.Errorf("S released at +%v ms, want at the end of its renewed ban (+%v ms): hysteresis",
			psAt(releasedAt), psAt(renewedAt+banFor))
	}
	if sAdmitted[3] != sOffered[3] || sOffered[3] == 0 {
		t.Errorf("S after its release admitted %d of %d, want all", sAdmitted[3], sOffered[3])
	}
	if qDrops != 0 {
		t.Errorf("Q (under its limit) had %d drops", qDrops)
	}
	if st := state(pQ); st.BannedUntilNS != 0 || st.Drops != 0 {
		t.Errorf("Q's entry: %+v", st)
	}
	if rBanned != 0 || rQuietDrops != 0 {
		t.Errorf("R (over in runs shorter than `after`): banned at %d reads, %d drops in its quiet phases", rBanned, rQuietDrops)
	}
	psCompareCounters(t, h)
	psCompareTable(t, h)

	// docs/config.md: ban `after` is ≥ 0, default 0: a source that exceeds
	// its limit "for 0 s" is banned at its first over-limit packet.
	t.Run("after 0", func(t *testing.T) {
		h := newPSHarness(t, 0)
		h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
			psRule("ban0", 53, 1e6, 1e6, dataplane.PerSourceSpec{Rate: 10, Burst: 5, PrefixV4: 32, PrefixV6: 64, BanDuration: time.Duration(banFor)}),
		}}, nil))
		slot := h.slot(t, "ban0")
		// 12.5/s: a little over the limit, most packets conform.
		var firstDrop, banned uint64
		var leaked int
		for now := uint64(psT0); now < psT0+5*second && banned == 0; now += 80 * psMS {
			pass, _ := h.run(t, fS, now)
			if !pass && firstDrop == 0 {
				firstDrop = now
			}
			if pass && firstDrop != 0 {
				leaked++
			}
			e, _ := psFind(psSources(t, h, slot), slot, pS)
			if e.BannedUntilNS != 0 {
				banned = now
			}
		}
		t.Logf("after 0: first over-limit packet at +%v ms, banned at +%v ms; %d packets passed in between",
			psAt(firstDrop), psAt(banned), leaked)
		if firstDrop == 0 || banned != firstDrop {
			t.Errorf("with ban after 0, S's first over-limit packet at +%v ms did not start the ban; it started at +%v ms "+
				"(the next over-limit packet), and %d packets passed in between", psAt(firstDrop), psAt(banned), leaked)
		}
		psCompareTable(t, h)
	})
}

// ms is a fake-clock time as milliseconds after psT0, for logs.
func psAt(ns uint64) string {
	if ns == 0 {
		return "never"
	}
	return fmt.Sprintf("%.0f", float64(ns-psT0)/1e6)
}

// TestSourceEpochReset: a reload that gives a slot to a rule with another
// name (another epoch) resets that slot's per-source state as the program
// meets each source again: the new rule starts every source with a full
// bucket, no ban and no drops of its own. A reload that keeps the name
// (a rate change) keeps it.
func TestSourceEpochReset(t *testing.T) {
	h := newPSHarness(t, 0)
	ps := dataplane.PerSourceSpec{Rate: 1, Burst: 3, PrefixV4: 32, PrefixV6: 64, BanAfter: 100 * time.Millisecond, BanDuration: time.Minute}
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{psRule("old", 53, 1e6, 1e6, ps)}}, nil))
	slot := h.slot(t, "old")
	S, T := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::2")
	fS, fT := build(udpTo(S, 53)), build(udpTo(T, 53))
	pS, pT := netip.PrefixFrom(S, 32), netip.PrefixFrom(T, 64).Masked()
	entry := func(p netip.Prefix) Source {
		e, ok := psFind(psSources(t, h, slot), slot, p)
		if !ok {
			t.Fatalf("%s: no table entry", p)
		}
		return e
	}

	// Under "old": S spends its burst, is over for 200 ms and is banned; T
	// spends its burst.
	if got := offer(t, h, slot, fS, psT0, 10); got != 3 {
		t.Fatalf("S admitted %d of 10, want its burst of 3", got)
	}
	offer(t, h, slot, fS, psT0+200*psMS, 1)
	if got := offer(t, h, slot, fT, psT0, 5); got != 3 {
		t.Fatalf("T admitted %d of 5, want 3", got)
	}
	old := entry(pS)
	if old.BannedUntilNS == 0 || old.Drops != 8 {
		t.Fatalf("S under the old rule: %+v, want banned with 8 drops", old.SourceState)
	}

	// The slot passes to "new" (same slot: compiled without a previous plan).
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{psRule("new", 53, 1e6, 1e6, ps)}}, nil))
	if h.slot(t, "new") != slot {
		t.Fatalf("new rule in slot %d, want %d", h.slot(t, "new"), slot)
	}
	now := psT0 + 300*psMS
	if got := offer(t, h, slot, fS, now, 4); got != 3 {
		t.Errorf("S under the new rule admitted %d of 4, want a fresh burst of 3 (no ban, full bucket)", got)
	}
	s := entry(pS)
	if s.Epoch != dataplane.Epoch("new") || s.BannedUntilNS != 0 || s.OverSinceNS != now {
		t.Errorf("S's entry under the new rule: %+v, want epoch %#x, no ban, over since %d", s.SourceState, dataplane.Epoch("new"), now)
	}
	// T has not been seen since: its entry is the old rule's until it is.
	if e := entry(pT); e.Epoch != dataplane.Epoch("old") {
		t.Errorf("T's entry (not seen since the reload): epoch %#x, want the old rule's %#x", e.Epoch, dataplane.Epoch("old"))
	}
	psCompareTable(t, h)
	psCompareCounters(t, h)

	// `xlimit status` lists a rule's top sources by their drops (entries
	// of its epoch): the new rule dropped one packet of S, so S must show
	// one drop, not the old rule's eight on top.
	t.Run("drops restart with the new rule", func(t *testing.T) {
		if s.Drops != 1 {
			t.Errorf("S's entry under the new rule counts %d drops: %d of them were dropped by the old rule in this slot "+
				"(the epoch reset in source.h keeps xl_source.drops, and the model does the same)", s.Drops, s.Drops-1)
		}
	})

	// A reload that keeps the name (a rate change) keeps the state: S is
	// still drained at the same instant.
	ps2 := ps
	ps2.Rate = 2
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{psRule("new", 53, 1e6, 1e6, ps2)}}, h.plan))
	if got := offer(t, h, slot, fS, now, 2); got != 0 {
		t.Errorf("after a rate change S admitted %d at the same instant, want 0 (state kept)", got)
	}
	if e := entry(pS); e.Epoch != dataplane.Epoch("new") || e.Drops != s.Drops+2 {
		t.Errorf("after a rate change S's entry is %+v, want epoch %#x and %d drops", e.SourceState, dataplane.Epoch("new"), s.Drops+2)
	}
	psCompareTable(t, h)
	psCompareCounters(t, h)
}

// TestSourceCredit checks the CPU's credit in front of a source's bucket
// (bpf/source.h, xl_src_credits) against what it promises: a source that
// comes again to the same CPU spends a batch without touching its shared
// entry, a mix of sources on one CPU loses nothing (what one source held
// goes back to its bucket when another takes the credit over), a source
// is held to its rate over time within one batch, and a rule with a ban
// keeps no credit. Every packet also runs through the Go model, which
// must agree, and the kernel's table must equal the model's.
func TestSourceCredit(t *testing.T) {
	// 1e6/s, burst 1000 (1 ms): a batch is 50 µs, 50 packets.
	const rate, burst, batch = 1e6, 1000, 50
	a, b := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8:1::10")
	fa, fb := build(udpTo(a, 53)), build(udpTo(b, 53))
	setup := func(t *testing.T, ban bool) (*harness, int) {
		ps := dataplane.PerSourceSpec{Rate: rate, Burst: burst, PrefixV4: 32, PrefixV6: 128}
		if ban {
			ps.BanAfter, ps.BanDuration = time.Second, time.Second
		}
		h := newPSHarness(t, 0)
		h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{psRule("r", 53, 1e9, 1e9, ps)}}, nil))
		return h, h.slot(t, "r")
	}
	tat := func(t *testing.T, h *harness, slot int, src netip.Addr) uint64 {
		t.Helper()
		s, ok := psFind(psSources(t, h, slot), slot, netip.PrefixFrom(src, src.BitLen()))
		if !ok {
			t.Fatalf("no entry for %s", src)
		}
		return s.TAT
	}
	inc := func(h *harness, slot int) uint64 { return h.plan.Rules[slot].Source.Inc(1) }

	t.Run("a hot source spends a batch", func(t *testing.T) {
		h, slot := setup(t, false)
		now := psT0
		for range 10 {
			if pass, _ := h.run(t, fa, now); !pass {
				t.Fatal("dropped within the burst")
			}
		}
		// The first packet took itself, the second a batch: eight more
		// spent it without moving the TAT.
		if got, want := tat(t, h, slot, a)-now<<dataplane.TimeShift, (1+batch)*inc(h, slot); got != want {
			t.Errorf("TAT %d units ahead after 10 packets, want %d (a packet and a batch)", got, want)
		}
		psCompareTable(t, h)
	})

	t.Run("a mix of sources loses nothing", func(t *testing.T) {
		h, _ := setup(t, false)
		admitted := map[netip.Addr]int{}
		// Three of each in turn, at one instant: each source gets exactly
		// its burst, whatever the other took over in between.
		for range 2 * burst {
			for _, f := range []struct {
				src   netip.Addr
				frame []byte
			}{{a, fa}, {a, fa}, {a, fa}, {b, fb}, {b, fb}, {b, fb}} {
				if pass, _ := h.run(t, f.frame, psT0); pass {
					admitted[f.src]++
				}
			}
		}
		for _, src := range []netip.Addr{a, b} {
			if admitted[src] != burst {
				t.Errorf("%s admitted %d, want its burst %d", src, admitted[src], burst)
			}
		}
		psCompareTable(t, h)
		psCompareCounters(t, h)
	})

	t.Run("held to its rate", func(t *testing.T) {
		h, _ := setup(t, false)
		// Twice the rate for 10 ms: rate·T + burst, within one batch.
		const step, n = 500, 20000
		admitted := 0
		for i := range n {
			if pass, _ := h.run(t, fa, psT0+uint64(i)*step); pass {
				admitted++
			}
		}
		want := rate*float64(n*step)/1e9 + burst
		if float64(admitted) < want-1 || float64(admitted) > want+batch {
			t.Errorf("admitted %d, want rate·T + burst = %.0f, within one batch above", admitted, want)
		}
		psCompareTable(t, h)
		psCompareCounters(t, h)
	})

	t.Run("none under a ban", func(t *testing.T) {
		h, slot := setup(t, true)
		for range 10 {
			h.run(t, fa, psT0)
		}
		if got, want := tat(t, h, slot, a)-psT0<<dataplane.TimeShift, 10*inc(h, slot); got != want {
			t.Errorf("TAT %d units ahead after 10 packets, want %d (each packet charged on its own)", got, want)
		}
		psCompareTable(t, h)
	})
}

// TestSourceKeepsAcrossReload: a reload that keeps the rule and its
// per-source settings (here: a new rule-wide rate, a generation flip) keeps
// every source's bucket: a source's next packet within its emission
// interval is refused, as without the reload. (The per-CPU front before
// the set-associative table had to be made to keep them: TestOracle, seed
// 1796220343419814782.)
func TestSourceKeepsAcrossReload(t *testing.T) {
	h := newPSHarness(t, 0)
	ps := dataplane.PerSourceSpec{Rate: 5, Burst: 1, PrefixV4: 32, PrefixV6: 64}
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{psRule("r", 53, 1e6, 1e6, ps)}}, nil))
	slot := h.slot(t, "r")
	for i, a := range []string{"192.0.2.7", "2001:db8::7"} {
		f := build(udpTo(netip.MustParseAddr(a), 53))
		at := psT0 + uint64(i)*1000*psMS
		if got := offer(t, h, slot, f, at, 1); got != 1 {
			t.Fatalf("%s: its first packet refused", a)
		}
		// The rule-wide rate changes: a new generation, the same rule.
		h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{psRule("r", 53, 2e6, 2e6, ps)}}, h.plan))
		if got := offer(t, h, slot, f, at+10*psMS, 1); got != 0 {
			t.Errorf("%s: its second packet 10 ms after the first (emission interval 200 ms), across a reload that kept the rule: admitted, want refused", a)
		}
		psCompareTable(t, h)
		psCompareCounters(t, h)
	}
}
