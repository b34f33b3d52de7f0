//go:build linux

package maps

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The gates on new connections (conns.h), in the kernel with the fake
// clock and the Go model side by side: the concurrency limit on the
// sock_ops count, and the circuit breaker's gate from the control loop.

func tcpFrame(flags uint8, src string) []byte {
	return frame.MustBuild(tcpSpec(flags, src))
}

func tcpSpec(flags uint8, src string) frame.Spec {
	return frame.Spec{
		Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr("10.9.0.1"),
		Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80, TCPFlags: flags,
	}
}

// unresettable is a SYN that a gate drops without a reset (IPv4 options):
// the statistical runs repeat it on one buffer, which a reset would rewrite.
func unresettable() []byte {
	s := tcpSpec(synFlags, "192.0.2.1")
	s.IPv4OptionWords = 1
	return frame.MustBuild(s)
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
		h.setConns(t, slot, c.conns)
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
	h.setConns(t, slot, dataplane.Conns{Count: 15, Epoch: epoch})
	h.expectDrops(t, "count 15 of soft 10, max 20", slot, dataplane.ReasonConcurrency, now, 2000, 160)
}

// expectDrops runs 4000 SYNs at now and checks that about want of them
// (within tol, 5 sigma of the binomial) were dropped for reason.
func (h *harness) expectDrops(t *testing.T, what string, slot int, reason dataplane.Reason, now uint64, want, tol uint64) {
	t.Helper()
	before := h.slotCounters(t, slot)
	h.kernelRun(t, unresettable(), now, 4000)
	after := h.slotCounters(t, slot)
	dropped := after.Reasons[reason] - before.Reasons[reason]
	t.Logf("%s: %d of 4000 SYNs dropped", what, dropped)
	if dropped < want-tol || dropped > want+tol {
		t.Errorf("%s: %d of 4000 SYNs dropped, want about %d", what, dropped, want)
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

	// A stale limit (dead daemon) fails open: the gate goes with it. The
	// deadline is checked against the CPU's last clock read of the slot
	// while the tick is the same (bucket.h, xl_limit_for): within this
	// tick the limit still holds, from the next it is stale.
	limit(dataplane.Gate{Drop: dataplane.GateAll}, now-1)
	expect("stale gate, same tick: SYN", syn, false)
	now += 1 << dataplane.FakeTickShift
	expect("stale gate: SYN", syn, true)

	// Closed.
	limit(dataplane.Gate{}, now+second)
	expect("closed: SYN", syn, true)

	// A probability: a quarter of the SYNs drop. 4000 draws: 1000 ± 5 sigma (137).
	limit(dataplane.Gate{Drop: 1 << 30}, now+second)
	h.expectDrops(t, "gate 1/4", slot, dataplane.ReasonBreaker, now, 1000, 137)

	// Another rule in the slot, its breaker half-open in round 8 too: the
	// probes the old rule spent in its round 8 are not the new one's.
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{{
		Name: "api", Protocol: "tcp", Ports: ports(80, 80), Rate: 1e6, Burst: 1e6,
	}}}, nil))
	if s := h.slot(t, "api"); s != slot {
		t.Fatalf("the new rule took slot %d, not the old rule's %d", s, slot)
	}
	epoch = h.plan.Rules[slot].Epoch
	limit(dataplane.Gate{Drop: dataplane.GateAll, Probes: 3, Round: 8}, now+second)
	for range 3 {
		expect("new rule, half-open round 8: probe", syn, true)
	}
	expect("new rule, half-open round 8: fourth SYN", syn, false)
}

// TestResetReply: a SYN refused by a gate comes back as the reset its
// sender expects (XDP_TX), for IPv4 and IPv6, tagged or not, with and
// without payload; resets beyond the rule's rate are plain drops.
func TestResetReply(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(80, 80), Rate: 10, Burst: 3,
	}}}, nil))
	slot := h.slot(t, "web")
	b, err := dataplane.NewBucket(10, 3, false)
	if err != nil {
		t.Fatal(err)
	}
	now := uint64(1000 * second)
	h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: now + 100*second, Epoch: h.plan.Rules[slot].Epoch,
		Gate: dataplane.Gate{Drop: dataplane.GateAll}})

	for _, c := range []struct {
		name    string
		src     string
		vlans   []uint16
		payload int
	}{
		// Sources that are not the host's own (192.0.2.1 and 2001:db8::1
		// are: answer.h answers no frame from them).
		{"IPv4", "198.51.100.1", nil, 0},
		{"IPv4 in QinQ", "198.51.100.2", []uint16{frame.EtherType8021AD, frame.EtherType8021Q}, 0},
		{"IPv4 SYN with data", "198.51.100.3", nil, 17},
		{"IPv6", "2001:db8:1::1", nil, 0},
		{"IPv6 tagged, with data", "2001:db8:1::2", []uint16{frame.EtherType8021Q}, 5},
	} {
		now += second // the reset bucket refills between cases
		s := tcpSpec(synFlags, c.src)
		if s.Src.Is6() {
			s.Dst = netip.MustParseAddr("2001:db8::80")
		}
		s.VLANs, s.PayloadLen = frame.Tags(c.vlans...), c.payload
		in := frame.MustBuild(s)
		h.model.Eval(in, now) // keep the model's buckets in step
		ret, out := h.kernelRunOut(t, in, now, 1)
		if ret != xdpTx {
			t.Errorf("%s: XDP return code %d, want XDP_TX", c.name, ret)
			continue
		}
		l3 := 14 + 4*len(c.vlans)
		l4 := l3 + 20
		if s.Src.Is6() {
			l4 = l3 + 40
		}
		if len(out) != l4+20 {
			t.Errorf("%s: reset is %d bytes, want %d", c.name, len(out), l4+20)
			continue
		}
		if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) || !bytes.Equal(out[12:l3], in[12:l3]) {
			t.Errorf("%s: Ethernet header %x, want the addresses swapped and the tags kept", c.name, out[:l3])
		}
		var pseudo uint32
		if s.Src.Is4() {
			ip, orig := out[l3:l4], in[l3:l3+20]
			if ip[0] != 0x45 || binary.BigEndian.Uint16(ip[2:]) != 40 || ip[8] != 64 || ip[9] != 6 ||
				!bytes.Equal(ip[12:16], orig[16:20]) || !bytes.Equal(ip[16:20], orig[12:16]) {
				t.Errorf("%s: IPv4 header %x", c.name, ip)
			}
			if frame.OnesSum(0, ip) != 0xffff {
				t.Errorf("%s: IPv4 header checksum wrong: %x", c.name, ip)
			}
			pseudo = frame.OnesSum(0, ip[12:20]) + 6 + 20
		} else {
			ip, orig := out[l3:l4], in[l3:l3+40]
			if ip[0]>>4 != 6 || binary.BigEndian.Uint16(ip[4:]) != 20 || ip[6] != 6 || ip[7] != 64 ||
				!bytes.Equal(ip[8:24], orig[24:40]) || !bytes.Equal(ip[24:40], orig[8:24]) {
				t.Errorf("%s: IPv6 header %x", c.name, ip)
			}
			pseudo = frame.OnesSum(0, ip[8:40]) + 6 + 20
		}
		tcp, orig := out[l4:], in[l4:l4+20]
		seq := binary.BigEndian.Uint32(orig[4:])
		if !bytes.Equal(tcp[0:2], orig[2:4]) || !bytes.Equal(tcp[2:4], orig[0:2]) ||
			binary.BigEndian.Uint32(tcp[4:]) != 0 || binary.BigEndian.Uint32(tcp[8:]) != seq+1+uint32(c.payload) ||
			tcp[12] != 5<<4 || tcp[13] != 0x14 {
			t.Errorf("%s: TCP header %x, want ports swapped, seq 0, ack %d, RST|ACK", c.name, tcp, seq+1+uint32(c.payload))
		}
		if frame.OnesSum(pseudo, tcp) != 0xffff {
			t.Errorf("%s: TCP checksum wrong: %x", c.name, tcp)
		}
	}

	// Resets stay within the rule's rate: a burst of refused SYNs gets
	// the burst's worth of resets, the rest are dropped silently.
	now += second
	resets := 0
	for range 10 {
		ret, _ := h.kernelRunOut(t, tcpFrame(synFlags, "192.0.2.9"), now, 1)
		if ret == xdpTx {
			resets++
		} else if ret != xdpDrop {
			t.Fatalf("refused SYN: XDP return code %d", ret)
		}
	}
	if resets != 3 {
		t.Errorf("10 refused SYNs at once under a burst of 3: %d resets, want 3", resets)
	}
}
