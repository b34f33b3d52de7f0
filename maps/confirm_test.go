//go:build linux

package maps

import (
	"errors"
	"testing"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// TestConfirmDeadlineInKernel: a change applied with a confirmation
// deadline (ApplyConfirm) is undone by the program itself at the deadline,
// with nothing written to the maps meanwhile (no daemon): from then on
// the previous generation's rules decide, a flood memo made before the
// deadline in the same tick included, and the tables read the previous
// plan back. Confirm keeps the change; a later change, plain or with a
// deadline of its own, returns to the rules of before the first.
func TestConfirmDeadlineInKernel(t *testing.T) {
	requireRoot(t)
	const tick = uint64(1) << dataplane.FakeTickShift
	t0 := 1000 * second / tick * tick // tick-aligned
	frame := build(udpTo(srcA4, 53))
	// The previous rules limit nothing on port 53; the change allows one
	// packet in 1000 s.
	cut := dataplane.RuleSpec{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 0.001, Burst: 1}
	setup := func(t *testing.T) (*harness, *dataplane.Plan, *dataplane.Plan) {
		h := newHarness(t)
		prev := compile(t, &dataplane.Spec{}, nil)
		h.apply(t, prev)
		return h, prev, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{cut}}, prev)
	}
	passes := func(t *testing.T, h *harness, now uint64, n uint32) bool {
		t.Helper()
		return h.kernelRun(t, frame, now, n)
	}
	inForce := func(t *testing.T, h *harness) int {
		t.Helper()
		p, err := h.tab.ReadPlan()
		if err != nil {
			t.Fatal(err)
		}
		return len(p.ActiveSlots())
	}

	t.Run("the kernel reverts at the deadline", func(t *testing.T) {
		h, prev, change := setup(t)
		prevGen, _ := h.tab.ActiveGeneration()
		// The deadline is in t0's tick: the memo of the drops before it
		// must not outlive it.
		deadline := t0 + 1000
		if err := h.tab.ApplyConfirm(change, deadline); err != nil {
			t.Fatal(err)
		}
		if !passes(t, h, t0, 1) {
			t.Fatal("the change's burst did not admit its one packet")
		}
		if passes(t, h, t0+10, 50) {
			t.Fatal("the change waiting for its confirmation does not limit")
		}
		if p, ok, err := h.tab.Pending(); err != nil || !ok || p.Expired || p.Gen != prevGen {
			t.Fatalf("before the deadline: pending %+v %v %v, want the return to generation %d", p, ok, err, prevGen)
		}
		if n := inForce(t, h); n != 1 {
			t.Fatalf("before the deadline the tables read %d rules, want the change's 1", n)
		}
		before := h.counters(t)[dataplane.GlobalSlot]
		if !passes(t, h, deadline, 1) {
			t.Fatal("at the deadline, in the same tick as the drops, the packet dropped: the previous rules limit nothing")
		}
		if !passes(t, h, deadline+5*second, 100) {
			t.Fatal("past the deadline the change still limits")
		}
		d := h.counters(t)[dataplane.GlobalSlot].Sub(before)
		if d.Reasons[dataplane.ReasonNoRule] != 101 {
			t.Errorf("past the deadline %d packets passed with no rule, want 101: %s", d.Reasons[dataplane.ReasonNoRule], fmtCounters(d))
		}
		if g, _ := h.tab.ActiveGeneration(); g != prevGen {
			t.Errorf("past the deadline the active generation reads %d, want %d", g, prevGen)
		}
		if n := inForce(t, h); n != len(prev.ActiveSlots()) {
			t.Errorf("past the deadline the tables read %d rules, want the previous %d", n, len(prev.ActiveSlots()))
		}
		if err := h.tab.Confirm(); !errors.Is(err, ErrConfirmExpired) {
			t.Errorf("confirm past the deadline: %v, want ErrConfirmExpired", err)
		}
		// The daemon's revert makes it explicit; nothing changes.
		if was, err := h.tab.Revert(); err != nil || !was {
			t.Fatalf("revert: %v, %v", was, err)
		}
		if _, ok, _ := h.tab.Pending(); ok {
			t.Error("still pending after the revert")
		}
		if !passes(t, h, deadline+6*second, 10) {
			t.Error("after the revert the change limits again")
		}
	})

	t.Run("a confirmed change stays", func(t *testing.T) {
		h, _, change := setup(t)
		if err := h.tab.ApplyConfirm(change, t0+second); err != nil {
			t.Fatal(err)
		}
		passes(t, h, t0, 1)
		if err := h.tab.Confirm(); err != nil {
			t.Fatal(err)
		}
		if passes(t, h, t0+2*second, 1) {
			t.Error("a confirmed change was undone at its deadline")
		}
	})

	t.Run("a second change with a deadline returns to the first's previous rules", func(t *testing.T) {
		h, _, change := setup(t)
		if err := h.tab.ApplyConfirm(change, t0+second); err != nil {
			t.Fatal(err)
		}
		passes(t, h, t0, 1)
		other := compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{{Name: "dns2", Protocol: "udp", Ports: ports(53, 53), Rate: 0.001, Burst: 1}}}, h.plan)
		if err := h.tab.ApplyConfirm(other, t0+3*second); err != nil {
			t.Fatal(err)
		}
		passes(t, h, t0+second/2, 1)
		if passes(t, h, t0+2*second, 1) {
			t.Error("the second change did not limit past the first's deadline")
		}
		if !passes(t, h, t0+3*second, 1) {
			t.Error("past the second deadline: dropped, want the rules of before the first change")
		}
	})

	t.Run("a plain change ends the wait", func(t *testing.T) {
		h, prev, change := setup(t)
		if err := h.tab.ApplyConfirm(change, t0+second); err != nil {
			t.Fatal(err)
		}
		if err := h.tab.Apply(compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{cut}}, prev)); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := h.tab.Pending(); ok {
			t.Error("still pending after a plain change")
		}
		passes(t, h, t0, 1)
		if passes(t, h, t0+2*second, 1) {
			t.Error("the plain change was undone at the first's deadline")
		}
	})
}
