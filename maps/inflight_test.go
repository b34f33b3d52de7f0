//go:build linux

package maps

import (
	"testing"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// TestInFlightCap: the control loop's cap on an adaptive rule's
// connections in flight (xl_limit.conc_cap, conns.h's xl_cap_admit), in
// the kernel and the Go model side by side. The compiler counts the
// rule's connections (Globals.Concurrent) without a static concurrency
// limit; SYNs are refused at the cap as concurrency, established traffic
// never; another rule's count and a stale limit cap nothing.
func TestInFlightCap(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1e6, Burst: 1e6, InFlight: true,
	}}}, nil))
	slot := h.slot(t, "web")
	if h.plan.Globals.Concurrent>>slot&1 == 0 || h.plan.Rules[slot].Flags&dataplane.RuleConcurrency != 0 {
		t.Fatalf("plan: concurrent %#x, flags %#x: want the rule counted, without a static limit", h.plan.Globals.Concurrent, h.plan.Rules[slot].Flags)
	}
	epoch := h.plan.Rules[slot].Epoch
	syn, ack := tcpFrame(synFlags, "192.0.2.1"), tcpFrame(ackFlags, "192.0.2.1")
	now := uint64(1000 * second)
	b, err := dataplane.NewBucket(1e6, 1e6, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		cap      uint32
		deadline uint64
		conns    dataplane.Conns
		pass     bool
	}{
		{"no cap", 0, now + second, dataplane.Conns{Count: 1 << 20, Epoch: epoch}, true},
		{"below the cap", 23, now + second, dataplane.Conns{Count: 22, Epoch: epoch}, true},
		{"at the cap", 23, now + second, dataplane.Conns{Count: 23, Epoch: epoch}, false},
		{"above the cap", 23, now + second, dataplane.Conns{Count: 40, Epoch: epoch}, false},
		{"another rule's count", 23, now + second, dataplane.Conns{Count: 40, Epoch: epoch + 2}, true},
		{"no count yet", 23, now + second, dataplane.Conns{}, true},
		{"negative (lost increments)", 1, now + second, dataplane.Conns{Count: -2, Epoch: epoch}, true},
		// The limit's deadline is checked against the CPU's last clock
		// read within the tick: the next tick sees it stale.
		{"stale limit", 23, now - 1, dataplane.Conns{Count: 40, Epoch: epoch}, true},
	} {
		if c.name == "stale limit" {
			now += 1 << dataplane.FakeTickShift
		}
		h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: c.deadline, Epoch: epoch, ConcCap: c.cap})
		h.setConns(t, slot, c.conns)
		before := h.slotCounters(t, slot)
		if pass, res := h.run(t, syn, now); pass != c.pass {
			t.Errorf("%s: SYN pass=%v (%v/%v), want %v", c.name, pass, res.Verdict, res.Reason, c.pass)
		}
		after := h.slotCounters(t, slot)
		if got := after.Reasons[dataplane.ReasonConcurrency] - before.Reasons[dataplane.ReasonConcurrency]; got != map[bool]uint64{true: 0, false: 1}[c.pass] {
			t.Errorf("%s: %d drops counted as concurrency", c.name, got)
		}
		if pass, _ := h.run(t, ack, now); !pass {
			t.Errorf("%s: ACK dropped", c.name)
		}
		now += second / 1000
	}
}

// TestInFlightCapRefusal: a SYN refused by the in-flight cap is answered as
// the rate's refusals are, with a reset only under `refuse: reset` (the
// default drop answers a spoofable source nothing), and never by a shadow
// rule.
func TestInFlightCapRefusal(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "reset", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1e6, Burst: 1e6, InFlight: true, Refuse: dataplane.RefuseReset},
		{Name: "drop", Protocol: "tcp", Ports: ports(81, 81), SynOnly: true, Rate: 1e6, Burst: 1e6, InFlight: true},
		{Name: "shadow", Protocol: "tcp", Ports: ports(82, 82), SynOnly: true, Rate: 1e6, Burst: 1e6, InFlight: true, Refuse: dataplane.RefuseReset, Shadow: true},
	}}, nil))
	now := uint64(1000 * second)
	b, err := dataplane.NewBucket(1e6, 1e6, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		rule  string
		port  uint16
		reset bool
	}{{"reset", 80, true}, {"drop", 81, false}, {"shadow", 82, false}} {
		slot := h.slot(t, c.rule)
		epoch := h.plan.Rules[slot].Epoch
		h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: now + second, Epoch: epoch, ConcCap: 5})
		h.setConns(t, slot, dataplane.Conns{Count: 5, Epoch: epoch})
		s := tcpSpec(synFlags, "192.0.2.7")
		s.DstPort = c.port
		pass, res := h.run(t, frame.MustBuild(s), now)
		if c.rule == "shadow" {
			// The packet goes on; the rule counts a would_drop for
			// concurrency, and no reset.
			cnt := h.slotCounters(t, slot)
			if !pass || res.Reset || cnt.Packets[dataplane.VerdictWouldDrop] != 1 || cnt.Reasons[dataplane.ReasonConcurrency] != 1 {
				t.Errorf("%s: pass=%v reset=%v, counters %v would_drop, %v concurrency: want the packet on, 1 and 1",
					c.rule, pass, res.Reset, cnt.Packets[dataplane.VerdictWouldDrop], cnt.Reasons[dataplane.ReasonConcurrency])
			}
			continue
		}
		if pass || res.Reason != dataplane.ReasonConcurrency || res.Reset != c.reset {
			t.Errorf("%s: pass=%v %v/%v reset=%v, want a concurrency drop, reset=%v", c.rule, pass, res.Verdict, res.Reason, res.Reset, c.reset)
		}
		now += second / 1000
	}
}
