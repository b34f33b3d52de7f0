//go:build linux

package maps

import (
	"testing"

	"github.com/xlimit/xlimit/tests/kit/corpus"
	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

const tcpSyn = frame.TCPSyn

// floodMemo returns the memo of the CPU that ran the harness's packets
// (bpf/flood.h; the harness pins its thread): the one entry that names a
// rule, or the zero value when no CPU has one.
func floodMemo(tb testing.TB, h *harness) xdpXlFlood {
	tb.Helper()
	var per []xdpXlFlood
	if err := h.obj.objs.XlFlood.Lookup(uint32(0), &per); err != nil {
		tb.Fatalf("read xl_flood: %v", err)
	}
	var got xdpXlFlood
	for _, f := range per {
		if f.Mask != 0 {
			got = f
		}
	}
	return got
}

// rawGeneration is xl_gen's raw value, the reload count the memo holds.
func rawGeneration(tb testing.TB, h *harness) uint32 {
	tb.Helper()
	g, err := h.tab.reloads()
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// TestFloodMemo checks the flood memo against what it promises
// (docs/dataplane.md, "The flood memo"): it answers a run's drops with the
// counts the rule makes, a reload voids it before the next packet (also
// when two reloads bring the same generation back), the run's bound holds
// through it, and it is not made where more than the run decides a drop.
// Every packet also runs through the Go model, which must agree.
func TestFloodMemo(t *testing.T) {
	requireRoot(t)
	const tick = uint64(1) << dataplane.FakeTickShift
	t0 := 1000 * second / tick * tick // tick-aligned
	frame := build(udpTo(srcA4, 53))
	drained := func(t *testing.T, rs ...dataplane.RuleSpec) *harness {
		h := newHarness(t)
		h.apply(t, compile(t, &dataplane.Spec{Rules: rs}, nil))
		return h
	}
	// One token per 1000 s and a burst whose tolerance leaves more than
	// 20 ms beyond a packet: the drops after the burst run.
	dns := dataplane.RuleSpec{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 0.001, Burst: 2}

	t.Run("answers a run with the rule's counts", func(t *testing.T) {
		h := drained(t, dns)
		slot := h.slot(t, "dns")
		before := h.slotCounters(t, slot)
		const n = 40
		admitted := offer(t, h, slot, frame, t0, n)
		if admitted != 2 {
			t.Fatalf("admitted %d of %d, want the burst of 2", admitted, n)
		}
		m := floodMemo(t, h)
		if m.Mask != 1<<slot || int(m.Slot) != slot || m.Gen != rawGeneration(t, h) || m.Syn != 0 {
			t.Fatalf("memo %+v, want rule %d's mask, slot and generation %d", m, slot, rawGeneration(t, h))
		}
		d := h.slotCounters(t, slot).Sub(before)
		if d.Packets[dataplane.VerdictDrop] != n-2 || d.Reasons[dataplane.ReasonRule] != n-2 ||
			d.Bytes[dataplane.VerdictDrop] != uint64((n-2)*len(frame)) {
			t.Errorf("slot counted %d drops, %d for the rule, %d bytes; want %d, %d, %d",
				d.Packets[dataplane.VerdictDrop], d.Reasons[dataplane.ReasonRule], d.Bytes[dataplane.VerdictDrop],
				n-2, n-2, (n-2)*len(frame))
		}
		g := h.counters(t)[dataplane.GlobalSlot]
		if g.Reasons[dataplane.ReasonRule] != n-2 {
			t.Errorf("global slot counted %d drops for a rule, want %d", g.Reasons[dataplane.ReasonRule], n-2)
		}
	})

	// A reload that keeps the packet's rules (the same rule in the same
	// slot, now a shadow) takes effect on the next packet, in the same
	// tick, with the memo's run not over, even after two reloads that
	// bring the memo's generation back (generation 1, 0, 1).
	t.Run("a reload voids it", func(t *testing.T) {
		h := drained(t, dns)
		slot := h.slot(t, "dns")
		offer(t, h, slot, frame, t0, 10)
		if floodMemo(t, h).Mask == 0 {
			t.Fatal("no memo after a run of drops")
		}
		shadow := dns
		shadow.Shadow = true
		same := compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{dns}}, h.plan)
		h.apply(t, same)
		h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{shadow}}, same))
		if pass, _ := h.run(t, frame, t0); !pass {
			t.Fatal("dropped by a memo made two reloads ago: the shadow rule must pass the packet")
		}
	})

	// The run's bound holds through the memo: a generous limit from the
	// control loop reaches the memo's packets at the next tick at the
	// latest, within the run's SkipDrops packets.
	t.Run("a new limit by the next tick", func(t *testing.T) {
		// 10/s, burst 2: drained, the TAT is 200 ms ahead, within the
		// new limit's tolerance of a second.
		h := drained(t, dataplane.RuleSpec{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 10, Burst: 2})
		slot := h.slot(t, "dns")
		offer(t, h, slot, frame, t0, 3)
		b, err := dataplane.NewBucket(1e6, 1e6, false)
		if err != nil {
			t.Fatal(err)
		}
		h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: t0 + 3600*second, Epoch: h.plan.Rules[slot].Epoch})
		late := 0
		for ; late <= dataplane.SkipDrops; late++ {
			if pass, _ := h.run(t, frame, t0+tick/2); pass {
				break
			}
		}
		if late > dataplane.SkipDrops {
			t.Fatalf("still dropped %d packets after the new limit, within the tick: more than the run's %d", late, dataplane.SkipDrops)
		}
		if pass, _ := h.run(t, frame, t0+tick); !pass {
			t.Fatal("dropped at the next tick under a limit of 1e6/s")
		}
	})

	// No memo where more than the run decides the drop.
	syn := build(corpus.TCPTo(srcA4, 80, tcpSyn))
	for _, c := range []struct {
		name  string
		rules []dataplane.RuleSpec
		frame []byte
	}{
		{"a rule before it charged the packet", []dataplane.RuleSpec{
			{Name: "wide", Protocol: "udp", Ports: ports(1, 1000), Rate: 1e9, Burst: 1e9}, dns}, frame},
		{"a shadow rule", []dataplane.RuleSpec{{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 0.001, Burst: 2, Shadow: true}}, frame},
		{"a byte rule", []dataplane.RuleSpec{{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 100, Burst: 200, Bytes: true}}, frame},
		{"a SYN of a rule with refuse: reset", []dataplane.RuleSpec{
			{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 0.001, Burst: 2, Refuse: "reset"}}, syn},
	} {
		t.Run("none for "+c.name, func(t *testing.T) {
			h := drained(t, c.rules...)
			for range 20 {
				h.run(t, c.frame, t0)
			}
			if m := floodMemo(t, h); m.Mask != 0 {
				t.Errorf("memo %+v made", m)
			}
		})
	}
	// ... and a SYN of a plain rule gets one, marked as a SYN.
	t.Run("a plain rule's SYN", func(t *testing.T) {
		h := drained(t, dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 0.001, Burst: 2})
		for range 20 {
			h.run(t, syn, t0)
		}
		if m := floodMemo(t, h); m.Mask == 0 || m.Syn != 1 {
			t.Errorf("memo %+v, want one for the SYN", m)
		}
	})
}

// TestFloodCountsOutliveTheProgram checks that the drops the memo counted
// in its own entry stay part of the counters when the program is loaded
// anew over the same pins (a daemon's restart or upgrade): xl_flood is
// pinned, so no counter goes back.
func TestFloodCountsOutliveTheProgram(t *testing.T) {
	requireRoot(t)
	pinToOneCPU(t)
	pins := privatePinDir(t)
	load := func() *harness { return loadHarness(t, pins) }
	const tick = uint64(1) << dataplane.FakeTickShift
	t0 := 1000 * second / tick * tick
	h := load()
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 0.001, Burst: 2}}}, nil))
	slot := h.slot(t, "dns")
	offer(t, h, slot, build(udpTo(srcA4, 53)), t0, 40)
	var per []xdpXlFlood
	if err := h.obj.objs.XlFlood.Lookup(uint32(0), &per); err != nil {
		t.Fatalf("read xl_flood: %v", err)
	}
	var memo uint64
	for _, f := range per {
		memo += f.Counts[slot].Packets
	}
	if memo == 0 {
		t.Fatal("the memo counted no drop: nothing to carry over")
	}
	before, global := h.slotCounters(t, slot), h.counters(t)[dataplane.GlobalSlot]
	if err := h.obj.Close(); err != nil {
		t.Fatal(err)
	}
	h = load()
	if after := h.slotCounters(t, slot); after != before {
		t.Errorf("slot %d's counters after a new load: %+v, want %+v (the memo's %d drops)", slot, after, before, memo)
	}
	if after := h.counters(t)[dataplane.GlobalSlot]; after != global {
		t.Errorf("the global counters after a new load: %+v, want %+v", after, global)
	}
}
