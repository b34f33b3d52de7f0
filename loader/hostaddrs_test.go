//go:build linux

package loader

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// TestHostAddrsFailureKeepsEnforcing: the host's addresses cannot be read
// (netlink fails) when the daemon attaches and later when it refreshes
// them. Attach succeeds all the same, the program is attached and enforces
// the rules (a 100-packet burst of 2000 frames passes, the rest is
// dropped), and the map, marked incomplete, keeps the addresses it held;
// once they can be read again the mark goes.
func TestHostAddrsFailureKeepsEnforcing(t *testing.T) {
	l, bpffs := setup(t)
	plan, err := dataplane.Compile(&dataplane.Spec{
		Rules: []dataplane.RuleSpec{{Name: "udp", Protocol: "udp", Ports: []dataplane.PortRange{dataplane.Port(9000)}, Rate: 1, Burst: 100}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	slot := plan.Slot("udp")
	broken := errors.New("netlink: injected failure")
	fail := func() ([]netlink.Addr, error) { return nil, broken }
	real := listAddrs
	t.Cleanup(func() { listAddrs = real })

	listAddrs = fail
	var a *Attachment
	err = l.Server.Do(func() error {
		var err error
		a, err = Attach(l.ServerIf, Options{BPFFS: bpffs, Mode: ModeGeneric, Fill: func(tb *maps.Tables) error { return tb.Apply(plan) }})
		return err
	})
	if err != nil {
		t.Fatalf("attach with the host's addresses unreadable: %v (want attached and enforcing)", err)
	}
	defer a.Close()
	if !errors.Is(a.HostAddrs.Err, broken) {
		t.Errorf("the attachment's host-address error is %v, want the injected one", a.HostAddrs.Err)
	}

	pkt := frame.MustBuild(frame.Spec{Src: l.ClientIP4, Dst: l.ServerIP4, Proto: 17, DstPort: 9000})
	enforced := func(when string) {
		t.Helper()
		if st, err := Inspect(bpffs, l.ServerIf); err != nil || !st.Attached {
			t.Fatalf("%s: not attached: %+v, %v", when, st, err)
		}
		before, err := a.Tables().Counters(slot)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.objs.Program().Run(&ebpf.RunOptions{Data: pkt, Repeat: 2000}); err != nil {
			t.Fatal(err)
		}
		after, err := a.Tables().Counters(slot)
		if err != nil {
			t.Fatal(err)
		}
		pass := after.Packets[dataplane.VerdictPass] - before.Packets[dataplane.VerdictPass]
		drop := after.Packets[dataplane.VerdictDrop] - before.Packets[dataplane.VerdictDrop]
		t.Logf("%s: of 2000 frames %d passed, %d dropped", when, pass, drop)
		if pass+drop != 2000 || pass > 110 {
			t.Errorf("%s: of 2000 frames %d passed, %d dropped: want at most the burst of 100 (and a little) through", when, pass, drop)
		}
	}
	enforced("after an attach that could not read the addresses")
	host, err := a.Tables().HostAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if !host.Incomplete() {
		t.Errorf("after an attach that could not read the addresses the map is not marked incomplete: %v", host)
	}

	listAddrs = real
	if err := l.Server.Do(func() error { _, err := a.RefreshHostAddrs(); return err }); err != nil {
		t.Fatal(err)
	}
	server := dataplane.IPKey(l.ServerIP4)
	host, _ = a.Tables().HostAddrs()
	if !host.Has(server) || host.Incomplete() || !host.Has(dataplane.LeaseKey) || a.HostAddrs.Listed != len(host)-1 {
		t.Errorf("after a refresh that worked: server address listed %v, incomplete %v, %d listed of %d: want listed, complete, leased (the lease no address)", host.Has(server), host.Incomplete(), a.HostAddrs.Listed, len(host))
	}

	listAddrs = fail
	if err := l.Server.Do(func() error { _, err := a.RefreshHostAddrs(); return err }); !errors.Is(err, broken) {
		t.Errorf("a refresh that cannot read the addresses returned %v", err)
	}
	host, _ = a.Tables().HostAddrs()
	if !host.Has(server) || !host.Incomplete() {
		t.Errorf("after a refresh that failed: server address listed %v (want kept), incomplete %v (want marked)", host.Has(server), host.Incomplete())
	}
	enforced("after a refresh that could not read the addresses")
}
