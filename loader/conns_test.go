//go:build linux

package loader

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/signal"
)

// The connection counter (sock_ops on the root cgroup) and the XDP
// concurrency gate on real TCP connections through a veth.
func TestConcurrencyLimitOnRealConnections(t *testing.T) {
	l, bpffs := setup(t)
	// Run-time statistics, to report what the counter costs per callback.
	if st, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err == nil {
		defer st.Close()
	}
	// Generic mode: its XDP_TX (the reset that refuses a connection) goes
	// out through the stack on every kernel, where native XDP on a veth
	// hands it to the peer's NAPI path, which Linux 6.1 drops unless the
	// peer runs an XDP program (docs/kernels.md). tests/ covers native.
	a, err := attachIn(t, l, bpffs, ModeGeneric)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.ConnCountErr != nil {
		t.Fatalf("connection counter not attached: %v", a.ConnCountErr)
	}
	const port = 8080
	var plan *dataplane.Plan
	err = l.Server.Do(func() error { // the namespace whose sockets count
		var err error
		plan, err = dataplane.Compile(&dataplane.Spec{Rules: []dataplane.RuleSpec{{
			Name: "web", Protocol: "tcp", Ports: []dataplane.PortRange{{Lo: port, Hi: port}},
			Rate: 1e6, Burst: 1e6, Concurrency: &dataplane.ConcurrencySpec{Soft: 3, Max: 3},
		}}}, nil)
		if err != nil {
			return err
		}
		return a.Tables().Apply(plan)
	})
	if err != nil {
		t.Fatal(err)
	}
	slot := plan.Slot("web")
	var diagCost time.Duration

	srv4, err := lab.ListenTCPEcho(l.Server, netip.AddrPortFrom(l.ServerIP4, port))
	if err != nil {
		t.Fatal(err)
	}
	defer srv4.Close()
	srv6, err := lab.ListenTCPEcho(l.Server, netip.AddrPortFrom(l.ServerIP6, port))
	if err != nil {
		t.Fatal(err)
	}
	defer srv6.Close()

	dial := func(to netip.Addr, timeout time.Duration) (net.Conn, error) {
		var c net.Conn
		err := l.Client.Do(func() error {
			var err error
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(to, port).String(), timeout)
			return err
		})
		return c, err
	}
	waitCount := func(want int64) {
		t.Helper()
		var got dataplane.Conns
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if got, err = a.Tables().Conns(slot); err != nil {
				t.Fatal(err)
			}
			if got.Count == want {
				return
			}
		}
		t.Fatalf("connections in flight: %d, want %d", got.Count, want)
	}

	var open []net.Conn
	defer func() {
		for _, c := range open {
			c.Close()
		}
	}()
	for i, to := range []netip.Addr{l.ServerIP4, l.ServerIP6, l.ServerIP4} {
		c, err := dial(to, 2*time.Second)
		if err != nil {
			t.Fatalf("connection %d (under the limit): %v", i+1, err)
		}
		open = append(open, c)
	}
	waitCount(3)

	// At the limit, new connections die at XDP; established ones flow.
	before, err := a.Tables().Counters(slot)
	if err != nil {
		t.Fatal(err)
	}
	// Refused with a reset from XDP: the client fails at once.
	if c, err := dial(l.ServerIP4, 1500*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("a fourth connection got through a limit of 3")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a fourth connection failed with %v, want connection refused (a reset)", err)
	}
	after, err := a.Tables().Counters(slot)
	if err != nil {
		t.Fatal(err)
	}
	if n := after.Reasons[dataplane.ReasonConcurrency] - before.Reasons[dataplane.ReasonConcurrency]; n < 1 {
		t.Errorf("SYNs dropped for concurrency: %d, want at least 1", n)
	}
	if _, err := open[0].Write([]byte("still here\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	_ = open[0].SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := open[0].Read(buf); err != nil || string(buf[:n]) != "still here\n" {
		t.Fatalf("established connection at the limit: read %q, %v", buf[:n], err)
	}

	// Closing one (the service closes its end) frees a place.
	open[1].Close()
	open = append(open[:1], open[2:]...)
	waitCount(2)
	c, err := dial(l.ServerIP6, 2*time.Second)
	if err != nil {
		t.Fatalf("connection after one closed: %v", err)
	}
	open = append(open, c)
	waitCount(3)

	// The alternative, measured here: a filtered sock_diag request per
	// control tick (what signal.Diag.Connections does) agrees with the
	// count but walks the whole established hash each time.
	var diag *signal.Diag
	if err := l.Server.Do(func() (err error) { diag, err = signal.NewDiag(); return err }); err != nil {
		t.Fatal(err)
	}
	defer diag.Close()
	const calls = 50
	t0 := time.Now()
	for range calls {
		cc, err := diag.Connections(context.Background(), []dataplane.PortRange{dataplane.Port(port)})
		if err != nil {
			t.Fatal(err)
		}
		if cc[0].Established != 3 {
			t.Errorf("sock_diag counts %d established, the sock_ops counter 3", cc[0].Established)
		}
	}
	diagCost = time.Since(t0) / calls

	// Sockets of another namespace do not count, even on the same port.
	other, err := lab.ListenTCPEcho(l.Client, netip.AddrPortFrom(l.ClientIP4, port))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	err = l.Server.Do(func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(l.ClientIP4, port).String(), 2*time.Second)
		if err == nil {
			defer c.Close()
			time.Sleep(100 * time.Millisecond)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitCount(3)

	for _, c := range open {
		c.Close()
	}
	open = nil
	waitCount(0)

	if st, err := a.objs.SockOps().Stats(); err == nil && st.RunCount > 0 {
		per := st.Runtime / time.Duration(st.RunCount)
		t.Logf("connection counting, same run: sock_ops %v per callback on average (%d callbacks, every TCP socket of the host's cgroups; two per counted connection); signal.Diag.Connections (one filtered sock_diag request per family) %v per call (%.0fx one callback), needed for every rule every 50 ms tick",
			per, st.RunCount, diagCost, float64(diagCost)/float64(per))
	}
}
