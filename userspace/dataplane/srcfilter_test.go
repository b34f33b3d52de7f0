package dataplane

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/frame"
)

// TestSrcFilterKeepsVerdicts checks the filter's promise: it refuses only
// packets that the table would refuse, so a model with it and one without
// give every packet the same verdict, and every source the same drops
// (counting what its entries hold; those of entries written under the
// settings before a change are lost, so after one it may count fewer).
// Sources over and under their limits,
// IPv4 and IPv6, a ban rule (whose filter entries end where a ban starts
// or ends), a rate high enough for the CPU's credit, and rate changes
// mid-run (entries of the old units match nothing). A table and a filter
// large enough that neither forgets anything: forgetting is the one
// place they may differ.
func TestSrcFilterKeepsVerdicts(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { srcFilterRun(t, seed) })
	}
}

func srcFilterRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 28))
	spec := func(slow, fast float64) *Spec {
		return &Spec{Rules: []RuleSpec{
			{Name: "plain", Protocol: "udp", Ports: []PortRange{{53, 53}}, Rate: 1e6, Burst: 1e6,
				PerSource: &PerSourceSpec{Rate: slow, Burst: 3, PrefixV4: 32, PrefixV6: 64}},
			{Name: "ban", Protocol: "udp", Ports: []PortRange{{54, 54}}, Rate: 1e6, Burst: 1e6,
				PerSource: &PerSourceSpec{Rate: slow, Burst: 2, PrefixV4: 24, PrefixV6: 48,
					BanAfter: 300 * time.Millisecond, BanDuration: 700 * time.Millisecond}},
			{Name: "fast", Protocol: "udp", Ports: []PortRange{{55, 55}}, Rate: 1e7, Burst: 1e7,
				PerSource: &PerSourceSpec{Rate: fast, Burst: 40, PrefixV4: 32, PrefixV6: 64}},
		}}
	}
	plan, err := Compile(spec(10, 40000), nil)
	if err != nil {
		t.Fatal(err)
	}
	with := &Model{Plan: plan, SrcSets: SrcSets(1 << 14), SrcSeed: uint32(rng.Uint64()) | 1}
	without := &Model{Plan: plan, SrcSets: with.SrcSets, SrcSeed: with.SrcSeed, noSrcFilter: true}

	// Sources: each sends to one port at its own mean rate, in bursts.
	type source struct {
		frame []byte
		gap   float64 // mean ns between packets
		burst int
		next  uint64
	}
	var srcs []*source
	for i := range 24 {
		addr := netip.AddrFrom4([4]byte{198, 51, byte(100 + i%3), byte(i)})
		if i%4 == 3 {
			addr = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, byte(i % 5), 0, 0, 0, byte(i)})
		}
		port := uint16(53 + i%3)
		rate := []float64{2, 8, 30, 200}[rng.IntN(4)]
		if port == 55 {
			rate = []float64{2e4, 5e4}[rng.IntN(2)]
		}
		f, err := frame.Build(frame.Spec{Src: addr, Proto: frame.ProtoUDP, SrcPort: 4000, DstPort: port, PayloadLen: 20})
		if err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, &source{frame: f, gap: 1e9 / rate, burst: 1 + rng.IntN(4), next: 1e12 + uint64(rng.IntN(1e9))})
	}
	const end = 1e12 + 8e9 // 8 s
	changed := false
	packets, differ := 0, 0
	for {
		s := srcs[0]
		for _, c := range srcs[1:] {
			if c.next < s.next {
				s = c
			}
		}
		now := s.next
		if now >= end {
			break
		}
		if !changed && now >= 1e12+4e9 {
			// Till here, every source's drops agree.
			compareSources(t, with, without, false)
			// A change of the per-source rates: the ways change units, and
			// the filter's entries written under the old ones match nothing.
			if plan, err = Compile(spec(4, 90000), plan); err != nil {
				t.Fatal(err)
			}
			with.Plan, without.Plan = plan, plan
			with.Reload()
			without.Reload()
			changed = true
		}
		for range s.burst {
			a, b := with.Eval(s.frame, now), without.Eval(s.frame, now)
			packets++
			if a.Verdict != b.Verdict && differ < 5 {
				differ++
				t.Errorf("at %d ns, packet %d: with the filter %v, without %v", now, packets, a.Verdict, b.Verdict)
			}
			now += 1000
		}
		s.next = now + uint64(rng.ExpFloat64()*s.gap)
	}
	if with.Counters != without.Counters {
		t.Errorf("counters differ: with the filter %+v, without %+v", with.Counters[GlobalSlot], without.Counters[GlobalSlot])
	}
	compareSources(t, with, without, true)
	// Not vacuous: the filter answers most refusals of the slow rules
	// (the fast rule's sources wait less than the filter's unit of time,
	// about a millisecond, and it answers few of theirs).
	for _, name := range []string{"plain", "ban"} {
		slot := plan.Slot(name)
		dropped, by := without.Counters[slot].Packets[VerdictDrop], with.srcFilterDrops[slot]
		t.Logf("rule %s: %d of %d packets dropped, %d by the filter", name, dropped, without.Counters[slot].Packets[VerdictPass]+dropped, by)
		if by < dropped/2 {
			t.Errorf("rule %s: the filter refused %d of %d drops, want at least half", name, by, dropped)
		}
	}
	t.Logf("%d packets in all", packets)
}

// compareSources checks that models with and without the filter hold the
// same sources, buckets and drops (with, after a change of settings,
// fewer drops allowed).
func compareSources(t *testing.T, with, without *Model, changed bool) {
	t.Helper()
	ws, wos := with.Sources(), without.Sources()
	if len(ws) != len(wos) {
		t.Errorf("%d sources with the filter, %d without", len(ws), len(wos))
	}
	for k, s := range wos {
		w := ws[k]
		if w == nil || w.TAT != s.TAT || w.OverSinceNS != s.OverSinceNS || w.BannedUntilNS != s.BannedUntilNS ||
			w.Drops > s.Drops || (!changed && w.Drops != s.Drops) {
			t.Errorf("source %v: with the filter %+v, without %+v", k.Prefix(), w, s)
		}
	}
}

// TestSrcFilterStaleEntry: an entry refuses nothing once its till has
// passed, however long its source stays away and however long the host
// has been up. Before (f45e2e7):
//   - after 2^52 ns of uptime (52 days), the wait was computed from now
//     cut to 32 bits of the filter's units, so every entry was written
//     with the longest wait (73 minutes): a source refused once was
//     dropped by the filter for 73 minutes with its bucket full. Found by
//     TestOracle in CI (seed 1796523973804950772; its fake clock starts a
//     year after boot);
//   - a lapsed entry came back to life for the 73 minutes before each wrap
//     of its till's 24 bits (every 4.9 hours) and refused its source.
func TestSrcFilterStaleEntry(t *testing.T) {
	plan, err := Compile(&Spec{Rules: []RuleSpec{
		{Name: "src", Protocol: "udp", Ports: []PortRange{{53, 53}}, Rate: 1e6, Burst: 1e6,
			PerSource: &PerSourceSpec{Rate: 1, Burst: 1, PrefixV4: 32, PrefixV6: 64}},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := frame.Build(frame.Spec{Src: netip.MustParseAddr("198.51.100.7"), Proto: frame.ProtoUDP, SrcPort: 4000, DstPort: 53, PayloadLen: 20})
	if err != nil {
		t.Fatal(err)
	}
	const unit = uint64(1) << SrcFilterShift
	for _, c := range []struct{ start, away uint64 }{
		{1e12, 1 << 24 * unit},                      // one whole wrap after the first packet
		{1e12, (1<<24 - SrcFilterMaxWait/2) * unit}, // inside the window that came back to life
		{1e12, (1<<24 - 2) * unit},
		{1e12, 3 * (1 << 24) * unit}, // three wraps
		// After 2^52 ns (52 days) of uptime, now in the filter's units
		// passes 32 bits: every wait was taken as the longest, 73 minutes.
		{60 * 24 * 3600e9, 2e9},
		{1 << 52, 2e9},
	} {
		start, away := c.start, c.away
		m := &Model{Plan: plan, SrcSets: SrcSets(1 << 10), SrcSeed: 0x5eed}
		if v := m.Eval(f, start).Verdict; v != VerdictPass {
			t.Fatalf("first packet: %v", v)
		}
		// Refused at the table (burst 1, 1/s): the filter has its entry,
		// till about a second later, and refuses the next one itself.
		if v := m.Eval(f, start+1000).Verdict; v != VerdictDrop {
			t.Fatalf("second packet: %v, want a drop", v)
		}
		if v := m.Eval(f, start+2000).Verdict; v != VerdictDrop || m.srcFilterDrops[plan.Slot("src")] != 1 {
			t.Fatalf("third packet: %v, the filter's drops %d: want the filter's drop", v, m.srcFilterDrops[plan.Slot("src")])
		}
		if v := m.Eval(f, start+away).Verdict; v != VerdictPass {
			t.Errorf("uptime %.1f days, back after %.4f h: %v, want a pass (its bucket is full)", float64(start)/86400e9, float64(away)/3.6e12, v)
		}
	}
}
