//go:build linux

package tcqueue

import (
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// newLab makes two namespaces joined by a veth pair and a manager in the
// server's; everything goes with the namespaces.
func newLab(t *testing.T) (*lab.Lab, *Manager) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, IFB devices and qdiscs (CI runs it as root)")
	}
	l, err := lab.New(lab.Options{Prefix: "xlq"})
	if err != nil {
		t.Fatalf("create lab: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	ns, err := netns.GetFromPath(l.Server.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	m, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return l, m
}

func (m *Manager) writeCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.writes
}

// burst sends n datagrams back to back to port and returns what arrived
// once nothing more did for quiet.
func burst(t *testing.T, l *lab.Lab, port uint16, n int, quiet time.Duration) []lab.Stamp {
	t.Helper()
	rcv, err := lab.ListenStamped(l.Server, netip.AddrPortFrom(l.ServerIP4, port))
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	if _, err := lab.SendStamped(l.Client, netip.AddrPortFrom(l.ServerIP4, port), n, 0, 64); err != nil {
		t.Fatal(err)
	}
	last, at := -1, time.Now()
	for time.Since(at) < quiet {
		if c := rcv.Count(); c != last {
			last, at = c, time.Now()
		}
		time.Sleep(5 * time.Millisecond)
	}
	return rcv.Stamps()
}

func TestQueuePacesBurst(t *testing.T) {
	l, m := newLab(t)
	const port = 7000
	spec := Spec{Queues: []Queue{{Rule: "paced", Protocol: UDP, Ports: []dataplane.PortRange{{Lo: port, Hi: port}},
		Rate: 100, MaxQueue: 300 * time.Millisecond}}}
	if err := m.Apply(l.ServerIf, spec); err != nil {
		t.Fatalf("apply: %v", err)
	}
	got := burst(t, l, port, 100, 500*time.Millisecond)
	// Two pass at once (the bucket), 30 wait (100/s × 300 ms); the other 68
	// are dropped.
	if len(got) < 31 || len(got) > 33 {
		t.Errorf("received %d of a burst of 100, want 32 (2 + 100/s × 300ms) within a packet", len(got))
	}
	var waits []time.Duration
	for _, s := range got {
		waits = append(waits, s.Wait())
	}
	slices.Sort(waits)
	// The first PacketBurst leave at once; the rest 1/rate apart.
	span := got[len(got)-1].Recv.Sub(got[PacketBurst-1].Recv)
	rate := float64(len(got)-PacketBurst) / span.Seconds()
	t.Logf("received %d, span %v, rate %.1f/s, wait min %v max %v", len(got), span, rate, waits[0], waits[len(waits)-1])
	if rate < 95 || rate > 105 {
		t.Errorf("paced at %.1f/s, want 100/s ± 5%%", rate)
	}
	if max := waits[len(waits)-1]; max > 300*time.Millisecond+20*time.Millisecond {
		t.Errorf("longest wait %v, want at most max_queueing_time 300ms (+20ms slack)", max)
	}
	stats, err := m.Stats()
	if err != nil || len(stats) != 1 {
		t.Fatalf("stats: %v %v", stats, err)
	}
	// Now and then one more packet is counted than was sent (seen: 101).
	if st := stats[0]; st.Drops+st.Sent < 100 || st.Drops+st.Sent > 101 || int(st.Sent) < len(got) || st.Backlog != 0 {
		t.Errorf("stats %+v: want sent ≥ %d, sent + drops 100, nothing left", st, len(got))
	}
	// A port the rule does not name passes unqueued.
	if other := burst(t, l, port+1, 100, 200*time.Millisecond); len(other) != 100 {
		t.Errorf("port %d: received %d of 100, want all", port+1, len(other))
	}
}

func TestQueueReconcile(t *testing.T) {
	l, m := newLab(t)
	spec := Spec{
		Allow: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")},
		Queues: []Queue{
			{Rule: "a", Protocol: Any, Ports: []dataplane.PortRange{{Lo: 80, Hi: 80}, {Lo: 8000, Hi: 8100}},
				Rate: 1000, MaxQueue: 800 * time.Millisecond},
			{Rule: "b", Protocol: UDP, Sources: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
				Bytes: true, Rate: 1e6, MaxQueue: 100 * time.Millisecond},
		},
	}
	if err := m.Apply(l.ServerIf, spec); err != nil {
		t.Fatalf("apply: %v", err)
	}
	w := m.writeCount()
	if err := m.Apply(l.ServerIf, spec); err != nil {
		t.Fatalf("apply again: %v", err)
	}
	if d := m.writeCount() - w; d != 0 {
		t.Errorf("applying the same spec again made %d netlink changes, want 0", d)
	}
	// A new daemon (a new manager) adopts everything as it is.
	ns, err := netns.GetFromPath(l.Server.Path)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := Open(ns)
	ns.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if err := m2.Apply(l.ServerIf, spec); err != nil {
		t.Fatalf("adopt: %v", err)
	}
	if n := m2.writeCount(); n != 0 {
		t.Errorf("adopting made %d netlink changes, want 0", n)
	}
	ifbA, err := m.h.LinkByName(IFBName(l.ServerIf, "a"))
	if err != nil {
		t.Fatal(err)
	}
	checkTBF := func(rate uint64, limit uint32) {
		t.Helper()
		st, err := m.qdiscState(ifbA.Attrs().Index)
		if err != nil {
			t.Fatal(err)
		}
		if !st.RootTBF || st.RateBytes != rate || st.Limit != limit || st.ChildKind != "pfifo" {
			t.Errorf("queue of a: %+v, want tbf rate %d limit %d over pfifo", st, rate, limit)
		}
	}
	checkTBF(1000*PacketMPU, 800)
	// The control loop's rate: written when it changed, not otherwise.
	if wrote, err := m.SetRate(l.ServerIf, "a", 500); err != nil || !wrote {
		t.Fatalf("set rate 500: wrote %v, %v", wrote, err)
	}
	checkTBF(500*PacketMPU, 400)
	if wrote, err := m.SetRate(l.ServerIf, "a", 501); err != nil || wrote {
		t.Errorf("set rate 501 after 500: wrote %v, %v; want no write", wrote, err)
	}
	// Rule b goes, a's ports change.
	spec.Queues = spec.Queues[:1]
	spec.Queues[0].Ports = []dataplane.PortRange{{Lo: 443, Hi: 443}}
	if err := m.Apply(l.ServerIf, spec); err != nil {
		t.Fatalf("apply without b: %v", err)
	}
	if _, err := m.h.LinkByName(IFBName(l.ServerIf, "b")); err == nil {
		t.Errorf("IFB of removed rule b still exists")
	}
	link, err := m.h.LinkByName(l.ServerIf)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := m.h.FilterList(link, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		t.Fatal(err)
	}
	// 2 allow prefixes + a: {v4, v6} × {tcp, udp} × port 443.
	if len(fs) != 6 {
		t.Errorf("%d filters after the change, want 6", len(fs))
	}
	// A filter of somebody else's at another pref survives, and keeps the
	// clsact qdisc after xlimit's queues go.
	foreign := &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
		Priority: 100, Protocol: ethIPv4}}
	if err := m.h.FilterAdd(foreign); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(l.ServerIf); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := m.h.LinkByName(IFBName(l.ServerIf, "a")); err == nil {
		t.Errorf("IFB of a still exists after Remove")
	}
	fs, _ = m.h.FilterList(link, netlink.HANDLE_MIN_INGRESS)
	if len(fs) != 1 || fs[0].Attrs().Priority != 100 {
		t.Errorf("filters after Remove: %d, want only the foreign one", len(fs))
	}
	if q, _ := m.ingressQdisc(link.Attrs().Index); q == nil {
		t.Errorf("clsact removed although a foreign filter uses it")
	}
	if err := m.h.FilterDel(foreign); err != nil {
		t.Fatal(err)
	}
	// Nothing of tcqueue's left: Remove leaves the interface alone.
	if err := m.Remove(l.ServerIf); err != nil {
		t.Fatalf("remove again: %v", err)
	}
	if q, _ := m.ingressQdisc(link.Attrs().Index); q == nil {
		t.Errorf("Remove with nothing of tcqueue's on the interface deleted its clsact")
	}
	// Queues again, then gone: the clsact goes with them.
	if err := m.Apply(l.ServerIf, spec); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if err := m.Remove(l.ServerIf); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if q, _ := m.ingressQdisc(link.Attrs().Index); q != nil {
		t.Errorf("clsact left after Remove with no filter on it")
	}

	// The interface deleted under its queues: its filters went with it,
	// its IFB devices did not; Remove (xlimit detach) takes them.
	if err := m.Apply(l.ServerIf, spec); err != nil {
		t.Fatalf("apply: %v", err)
	}
	if err := m.h.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	if _, err := m.h.LinkByName(IFBName(l.ServerIf, "a")); err != nil {
		t.Fatalf("IFB of a gone with the interface: %v", err)
	}
	if err := m.Remove(l.ServerIf); err != nil {
		t.Fatalf("remove from a deleted interface: %v", err)
	}
	if _, err := m.h.LinkByName(IFBName(l.ServerIf, "a")); err == nil {
		t.Errorf("IFB of a still exists after Remove of a deleted interface")
	}
}
