//go:build linux

package maps

import (
	"net/netip"
	"testing"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The gates on new connections (conns.h), in the kernel with the fake
// clock and the Go model side by side: the concurrency limit on the
// sock_ops count, and the circuit breaker's gate from the control loop.

func tcpFrame(flags uint8, src string) []byte {
	return dataplane.BuildFrame(dataplane.FrameSpec{
		Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("10.9.0.1"),
		Proto: dataplane.ProtoNumTCP, SrcPort: 40000, DstPort: 80, TCPFlags: flags,
	})
}

func TestConcurrencyGate(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(80, 80), Rate: 1e6, Burst: 1e6,
		Concurrency: &dataplane.ConcurrencySpec{Soft: 10, Max: 20},
	}}}, nil))
	slot := h.slot(t, "web")
	epoch := h.plan.Rules[slot].Epoch
	syn, ack := tcpFrame(synFlags, "192.0.2.1"), tcpFrame(ackFlags, "192.0.2.1")
	now := uint64(1000 * second)

	setConns := func(c dataplane.Conns) {
		t.Helper()
		if err := h.tab.SetConns(slot, c); err != nil {
			t.Fatal(err)
		}
		h.model.Conns[slot] = c
	}
	for _, c := range []struct {
		name  string
		conns dataplane.Conns
		pass  bool
	}{
		{"no count yet", dataplane.Conns{}, true},
		{"below soft", dataplane.Conns{Count: 9, Epoch: epoch}, true},
		{"at max", dataplane.Conns{Count: 20, Epoch: epoch}, false},
		{"above max", dataplane.Conns{Count: 1 << 40, Epoch: epoch}, false},
		{"another rule's count", dataplane.Conns{Count: 20, Epoch: epoch + 2}, true},
		{"negative (lost increments)", dataplane.Conns{Count: -3, Epoch: epoch}, true},
	} {
		setConns(c.conns)
		before := h.slotCounters(t, slot)
		if pass, res := h.run(t, syn, now); pass != c.pass {
			t.Errorf("%s: SYN pass=%v (%v/%v), want %v", c.name, pass, res.Verdict, res.Reason, c.pass)
		}
		after := h.slotCounters(t, slot)
		if !c.pass && after.Reasons[dataplane.ReasonConcurrency]-before.Reasons[dataplane.ReasonConcurrency] != 1 {
			t.Errorf("%s: drop not counted as concurrency", c.name)
		}
		// Established traffic is never gated.
		if pass, _ := h.run(t, ack, now); !pass {
			t.Errorf("%s: ACK dropped", c.name)
		}
		now += second / 1000
	}

	// Between soft and max the drop probability rises linearly: at 15 of
	// 10..20 half the SYNs drop. 4000 draws: 2000 ± 5 sigma (158).
	setConns(dataplane.Conns{Count: 15, Epoch: epoch})
	before := h.slotCounters(t, slot)
	h.kernelRun(t, syn, now, 4000)
	after := h.slotCounters(t, slot)
	dropped := after.Reasons[dataplane.ReasonConcurrency] - before.Reasons[dataplane.ReasonConcurrency]
	t.Logf("count 15 of soft 10, max 20: %d of 4000 SYNs dropped", dropped)
	if dropped < 2000-160 || dropped > 2000+160 {
		t.Errorf("count 15 of soft 10, max 20: %d of 4000 SYNs dropped, want about 2000", dropped)
	}
}

func TestBreakerGate(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(80, 80), Rate: 1e6, Burst: 1e6,
	}}}, nil))
	slot := h.slot(t, "web")
	epoch := h.plan.Rules[slot].Epoch
	syn, ack := tcpFrame(synFlags, "192.0.2.1"), tcpFrame(ackFlags, "192.0.2.1")
	now := uint64(1000 * second)
	b, err := dataplane.NewBucket(1e6, 1e6, false)
	if err != nil {
		t.Fatal(err)
	}
	limit := func(g dataplane.Gate, deadline uint64) {
		h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: deadline, Epoch: epoch, Gate: g})
	}
	expect := func(what string, frame []byte, want bool) {
		t.Helper()
		if pass, res := h.run(t, frame, now); pass != want {
			t.Errorf("%s: pass=%v (%v/%v), want %v", what, pass, res.Verdict, res.Reason, want)
		}
		now += second / 1000
	}

	limit(dataplane.Gate{Drop: dataplane.GateAll}, now+second)
	expect("open: SYN", syn, false)
	expect("open: ACK", ack, true)
	c := h.slotCounters(t, slot)
	if c.Reasons[dataplane.ReasonBreaker] != 1 {
		t.Errorf("breaker drops counted %d, want 1", c.Reasons[dataplane.ReasonBreaker])
	}

	// Half-open: 3 probes in round 7, then none; round 8 lets 3 more.
	limit(dataplane.Gate{Drop: dataplane.GateAll, Probes: 3, Round: 7}, now+second)
	for i := range 3 {
		expect("half-open round 7: probe "+string(rune('1'+i)), syn, true)
	}
	expect("half-open round 7: fourth SYN", syn, false)
	limit(dataplane.Gate{Drop: dataplane.GateAll, Probes: 3, Round: 8}, now+second)
	for range 3 {
		expect("half-open round 8: probe", syn, true)
	}
	expect("half-open round 8: fourth SYN", syn, false)

	// A stale limit (dead daemon) fails open: the gate goes with it.
	limit(dataplane.Gate{Drop: dataplane.GateAll}, now-1)
	expect("stale gate: SYN", syn, true)

	// Closed.
	limit(dataplane.Gate{}, now+second)
	expect("closed: SYN", syn, true)

	// A probability: a quarter of the SYNs drop. 4000 draws: 1000 ± 5 sigma (137).
	limit(dataplane.Gate{Drop: 1 << 30}, now+second)
	before := h.slotCounters(t, slot)
	h.kernelRun(t, syn, now, 4000)
	after := h.slotCounters(t, slot)
	dropped := after.Reasons[dataplane.ReasonBreaker] - before.Reasons[dataplane.ReasonBreaker]
	t.Logf("gate 1/4: %d of 4000 SYNs dropped", dropped)
	if dropped < 1000-137 || dropped > 1000+137 {
		t.Errorf("gate 1/4: %d of 4000 SYNs dropped, want about 1000", dropped)
	}
}
