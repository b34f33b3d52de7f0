//go:build linux

package signal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

func needRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: creates network namespaces")
	}
}

func newLab(tb testing.TB) *lab.Lab {
	tb.Helper()
	needRoot(tb)
	l, err := lab.New(lab.Options{Prefix: "xlsig"})
	if err != nil {
		tb.Fatalf("lab.New: %v", err)
	}
	tb.Cleanup(func() {
		if err := l.Close(); err != nil {
			tb.Errorf("close lab: %v", err)
		}
	})
	return l
}

// listenBacklog opens a TCP listener on ap with the given backlog (which
// net.Listen does not expose) in the calling thread's namespace.
func listenBacklog(ap netip.AddrPort, backlog int) (int, error) {
	var family int
	var sa unix.Sockaddr
	if ap.Addr().Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	} else {
		family, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", ap, err)
	}
	if err := unix.Listen(fd, backlog); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("listen %s: %w", ap, err)
	}
	return fd, nil
}

// listeners opens listeners in ns and closes them when the test ends.
func listeners(tb testing.TB, ns *lab.NS, backlog int, aps ...netip.AddrPort) {
	tb.Helper()
	err := ns.Do(func() error {
		for _, ap := range aps {
			fd, err := listenBacklog(ap, backlog)
			if err != nil {
				return err
			}
			tb.Cleanup(func() { unix.Close(fd) })
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// dial connects from ns to ap with a timeout; the connection is closed when
// the test ends.
func dial(tb testing.TB, ns *lab.NS, ap netip.AddrPort, timeout time.Duration) error {
	var c net.Conn
	err := ns.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", ap.String(), timeout)
		return err
	})
	if err == nil {
		tb.Cleanup(func() { c.Close() })
	}
	return err
}

// openIn opens a Diag and a NetStat inside ns.
func openIn(tb testing.TB, ns *lab.NS) (*Diag, *NetStat) {
	tb.Helper()
	var d *Diag
	var n *NetStat
	err := ns.Do(func() error {
		var err error
		if d, err = NewDiag(); err != nil {
			return err
		}
		n, err = OpenNetStat()
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := errors.Join(d.Close(), n.Close()); err != nil {
			tb.Error(err)
		}
	})
	return d, n
}

// waitQueues polls AcceptQueue until it returns want or the time is up.
func waitQueues(t *testing.T, d *Diag, ranges []dataplane.PortRange, want []ListenQueue) {
	t.Helper()
	var got []ListenQueue
	var err error
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		got, err = d.AcceptQueue(context.Background(), ranges)
		if err == nil && fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
	}
	t.Fatalf("AcceptQueue(%v) = %+v, %v; want %+v", ranges, got, err, want)
}

func TestAcceptQueueLab(t *testing.T) {
	l := newLab(t)
	d, ns := openIn(t, l.Server)
	before, err := ns.Read()
	if err != nil {
		t.Fatal(err)
	}

	const backlog = 3
	v4 := netip.AddrPortFrom(l.ServerIP4, 8080)
	v6 := netip.AddrPortFrom(l.ServerIP6, 8080)
	other := netip.AddrPortFrom(l.ServerIP4, 8081)
	listeners(t, l.Server, backlog, v4, v6)
	listeners(t, l.Server, 16, other)

	// A dual-stack listener ([::], IPv6 socket taking IPv4 clients too).
	dual := netip.AddrPortFrom(netip.IPv6Unspecified(), 8090)
	listeners(t, l.Server, backlog, dual)
	if err := dial(t, l.Client, netip.AddrPortFrom(l.ServerIP4, 8090), 2*time.Second); err != nil {
		t.Fatalf("dial dual-stack listener over IPv4: %v", err)
	}
	waitQueues(t, d, []dataplane.PortRange{dataplane.Port(8090)}, []ListenQueue{{dataplane.Port(8090), 1, 1, backlog}})

	p8080, p8081, both, none := dataplane.Port(8080), dataplane.Port(8081), dataplane.PortRange{Lo: 8000, Hi: 8089}, dataplane.PortRange{Lo: 1, Hi: 8079}
	ranges := []dataplane.PortRange{p8080, p8081, both, none}
	waitQueues(t, d, ranges, []ListenQueue{
		{p8080, 2, 0, 2 * backlog}, {p8081, 1, 0, 16}, {both, 3, 0, 2*backlog + 16}, {none, 0, 0, 0},
	})

	// The kernel applies the filter: only matching sockets come back.
	for _, tc := range []struct {
		ranges []dataplane.PortRange
		want   int
	}{{[]dataplane.PortRange{p8081}, 1}, {[]dataplane.PortRange{none}, 0}, {[]dataplane.PortRange{none, p8080}, 2}, {[]dataplane.PortRange{both}, 3}} {
		var ports []uint16
		err := d.query(context.Background(), tc.ranges, 1<<tcpListen, func(_ uint8, port uint16, _, _ uint32) {
			ports = append(ports, port)
		})
		if err != nil || len(ports) != tc.want {
			t.Errorf("dump filtered by %v returned ports %v, %v; want %d sockets", tc.ranges, ports, err, tc.want)
		}
	}

	// Three clients over IPv4 and two over IPv6 to 8080, five to 8081;
	// nobody accepts.
	for i := range 5 {
		ap := v4
		if i >= 3 {
			ap = v6
		}
		if err := dial(t, l.Client, ap, 2*time.Second); err != nil {
			t.Fatalf("dial %s: %v", ap, err)
		}
		if err := dial(t, l.Client, other, 2*time.Second); err != nil {
			t.Fatalf("dial %s: %v", other, err)
		}
	}
	waitQueues(t, d, ranges, []ListenQueue{
		{p8080, 2, 5, 2 * backlog}, {p8081, 1, 5, 16}, {both, 3, 10, 2*backlog + 16}, {none, 0, 0, 0},
	})

	// The IPv4 queue takes one more than its backlog (the kernel declares it
	// full only above the limit); the connection after that overflows.
	if err := dial(t, l.Client, v4, 2*time.Second); err != nil {
		t.Fatalf("dial %s: %v", v4, err)
	}
	waitQueues(t, d, []dataplane.PortRange{p8080}, []ListenQueue{{p8080, 2, 6, 2 * backlog}})
	if err := dial(t, l.Client, v4, 300*time.Millisecond); err == nil {
		t.Fatalf("dial %s succeeded with its accept queue full", v4)
	}
	waitQueues(t, d, []dataplane.PortRange{p8080}, []ListenQueue{{p8080, 2, 6, 2 * backlog}})

	after, err := ns.Read()
	if err != nil {
		t.Fatal(err)
	}
	delta, ok := after.Sub(before)
	if !ok || delta.ListenOverflows == 0 || delta.ListenDrops < delta.ListenOverflows || delta.PassiveOpens != 12 {
		t.Errorf("server namespace counters: before %+v, after %+v; want overflows, drops ≥ overflows, 12 passive opens", before, after)
	}
	if before.ListenOverflows != 0 || before.PassiveOpens != 0 {
		t.Errorf("a fresh namespace's counters start at %+v: not the server namespace's?", before)
	}

	// Established counts: the queued connections are ESTABLISHED server
	// sockets with the listener's port; the client ends are elsewhere.
	cc, err := d.Connections(context.Background(), []dataplane.PortRange{p8080, p8081, none})
	if err != nil {
		t.Fatal(err)
	}
	if want := []ConnCount{{p8080, 0, 6}, {p8081, 0, 5}, {none, 0, 0}}; fmt.Sprint(cc) != fmt.Sprint(want) {
		t.Errorf("Connections = %+v, want %+v", cc, want)
	}

	// The cost of one call.
	const calls = 1000
	start := time.Now()
	for range calls {
		if _, err := d.AcceptQueue(context.Background(), []dataplane.PortRange{p8080}); err != nil {
			t.Fatal(err)
		}
	}
	aq := time.Since(start) / calls
	start = time.Now()
	for range calls / 10 {
		if _, err := d.Connections(context.Background(), []dataplane.PortRange{p8080}); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("one AcceptQueue call: %v; one Connections call: %v", aq, time.Since(start)/(calls/10))
}

// TestConnectionsSynRecv makes half-open connections: SYNs from addresses
// nobody owns, routed out of the server so that it answers and keeps a
// request socket (SYN_RECV) for each, over IPv4 and IPv6.
func TestConnectionsSynRecv(t *testing.T) {
	l := newLab(t)
	d, _ := openIn(t, l.Server)
	src4 := netip.MustParsePrefix("10.99.0.0/16")
	src6 := netip.MustParsePrefix("2001:db8:99::/64")
	addRoutes(t, l, src4, src6)
	listeners(t, l.Server, 128,
		netip.AddrPortFrom(l.ServerIP4, 9000), netip.AddrPortFrom(l.ServerIP6, 9000),
		netip.AddrPortFrom(l.ServerIP4, 9001))

	const n = 20
	for _, v6 := range []bool{false, true} {
		spec := l.ClientFlood(v6)
		spec.Proto, spec.DstPort, spec.Count = lab.ProtoTCPSYN, 9000, n
		spec.RandomSources = src4
		if v6 {
			spec.RandomSources = src6
		}
		if res, err := lab.Flood(context.Background(), spec); err != nil || res.Sent != n {
			t.Fatalf("flood: %+v, %v", res, err)
		}
	}
	// Random sources may repeat (same 4-tuple, one request socket).
	p9000, p9001 := dataplane.Port(9000), dataplane.Port(9001)
	var cc []ConnCount
	var err error
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		cc, err = d.Connections(context.Background(), []dataplane.PortRange{p9000, p9001})
		if err == nil && cc[0].SynRecv >= 2*n-2 {
			break
		}
	}
	if err != nil || cc[0].SynRecv < 2*n-2 || cc[0].SynRecv > 2*n || cc[0].Established != 0 || cc[1] != (ConnCount{p9001, 0, 0}) {
		t.Fatalf("Connections = %+v, %v; want about %d SYN_RECV on 9000 and nothing on 9001", cc, err, 2*n)
	}
	q, err := d.AcceptQueue(context.Background(), []dataplane.PortRange{p9000})
	if err != nil || q[0] != (ListenQueue{p9000, 2, 0, 256}) {
		t.Errorf("AcceptQueue = %+v, %v; want 2 listeners with empty queues", q, err)
	}
}

// addRoutes routes prefixes out of the server veth, inside the lab's server
// namespace.
func addRoutes(t *testing.T, l *lab.Lab, prefixes ...netip.Prefix) {
	t.Helper()
	h, err := netns.GetFromPath(l.Server.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	for _, p := range prefixes {
		bits := 32
		if p.Addr().Is6() {
			bits = 128
		}
		dst := &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
		r := &netlink.Route{LinkIndex: l.ServerIndex, Dst: dst, Scope: netlink.SCOPE_LINK}
		if err := nh.RouteAdd(r); err != nil {
			t.Fatalf("add route %s: %v", p, err)
		}
	}
}

// busyNS is a lab whose server namespace holds 2000 established TCP
// sockets (1000 loopback connections to port 7000) and a listener on 8080
// with 3 queued connections, shared by the benchmarks.
type busyNS struct {
	once sync.Once
	lab  *lab.Lab
	diag *Diag
	nl   *netlink.Handle
	fds  []int
	err  error
}

var busy busyNS

func (b *busyNS) setup() error {
	b.once.Do(func() { b.err = b.build() })
	return b.err
}

func (b *busyNS) build() error {
	l, err := lab.New(lab.Options{Prefix: "xlsigb"})
	if err != nil {
		return err
	}
	b.lab = l
	return l.Server.Do(func() error {
		var err error
		if b.diag, err = NewDiag(); err != nil {
			return err
		}
		h, err := netns.Get()
		if err != nil {
			return err
		}
		defer h.Close()
		if b.nl, err = netlink.NewHandleAt(h, unix.NETLINK_SOCK_DIAG); err != nil {
			return err
		}
		lfd, err := listenBacklog(netip.AddrPortFrom(l.ServerIP4, 8080), 16)
		if err != nil {
			return err
		}
		bfd, err := listenBacklog(netip.AddrPortFrom(l.ServerIP4, 7000), 4096)
		if err != nil {
			return err
		}
		b.fds = append(b.fds, lfd, bfd)
		connect := func(port int) error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			b.fds = append(b.fds, fd)
			return unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: l.ServerIP4.As4()})
		}
		for range 3 {
			if err := connect(8080); err != nil {
				return err
			}
		}
		for range 1000 {
			if err := connect(7000); err != nil {
				return err
			}
			afd, _, err := unix.Accept4(bfd, unix.SOCK_CLOEXEC)
			if err != nil {
				return err
			}
			b.fds = append(b.fds, afd)
		}
		return nil
	})
}

func (b *busyNS) close() {
	for _, fd := range b.fds {
		unix.Close(fd)
	}
	if b.diag != nil {
		b.diag.Close()
	}
	if b.nl != nil {
		b.nl.Close()
	}
	if b.lab != nil {
		if err := b.lab.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "close benchmark lab:", err)
		}
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	busy.close()
	os.Exit(code)
}

func busyDiag(b *testing.B) *Diag {
	needRoot(b)
	if err := busy.setup(); err != nil {
		b.Fatal(err)
	}
	return busy.diag
}

// BenchmarkAcceptQueue: LISTEN sockets of one port, with 2000 established
// sockets on other ports in the namespace.
func BenchmarkAcceptQueue(b *testing.B) {
	d := busyDiag(b)
	ranges := []dataplane.PortRange{dataplane.Port(8080)}
	for b.Loop() {
		q, err := d.AcceptQueue(context.Background(), ranges)
		if err != nil || q[0].Queued != 3 {
			b.Fatalf("AcceptQueue = %+v, %v", q, err)
		}
	}
}

// TestDiagAbandonedDump leaves a multi-datagram dump unread (as a timeout
// or a cancelled context would) and checks that the next request drains it
// and answers correctly.
func TestDiagAbandonedDump(t *testing.T) {
	needRoot(t)
	if err := busy.setup(); err != nil {
		t.Fatal(err)
	}
	d := busy.diag
	d.mu.Lock()
	d.seq++
	seq := d.seq
	d.req = buildDiagRequest(d.req[:0], seq, unix.AF_INET, tcpAllStates, nil)
	if _, err := unix.Write(d.fd, d.req); err != nil {
		d.mu.Unlock()
		t.Fatal(err)
	}
	n, err := d.recv(time.Now().Add(time.Second))
	if err != nil {
		d.mu.Unlock()
		t.Fatal(err)
	}
	done, _, err := parseDiagMessages(d.buf[:n], seq, func(uint8, uint16, uint32, uint32) {})
	d.pending = seq
	d.mu.Unlock()
	if err != nil || done {
		t.Fatalf("first datagram of a 2000-socket dump: done %v, %v", done, err)
	}
	for range 3 {
		q, err := d.AcceptQueue(context.Background(), []dataplane.PortRange{dataplane.Port(8080)})
		if err != nil || q[0] != (ListenQueue{dataplane.Port(8080), 1, 3, 16}) {
			t.Fatalf("AcceptQueue after an abandoned dump = %+v, %v", q, err)
		}
	}
	if d.pending != 0 {
		t.Errorf("pending dump %d left", d.pending)
	}
}

// BenchmarkConnections: SYN_RECV and ESTABLISHED of one port, same host.
func BenchmarkConnections(b *testing.B) {
	d := busyDiag(b)
	ranges := []dataplane.PortRange{dataplane.Port(8080)}
	for b.Loop() {
		c, err := d.Connections(context.Background(), ranges)
		if err != nil || c[0].Established != 3 {
			b.Fatalf("Connections = %+v, %v", c, err)
		}
	}
}

// BenchmarkFullDump: every TCP socket of the namespace, both families, the
// way a dump without a filter finds the listener: with this package's
// plumbing (no filter, all states) and with netlink.SocketDiagTCPInfo.
func BenchmarkFullDump(b *testing.B) {
	d := busyDiag(b)
	b.Run("sockdiag", func(b *testing.B) {
		for b.Loop() {
			var socks int
			var queued uint32
			for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
				err := d.dump(context.Background(), requestDeadline(context.Background()), family, tcpAllStates, nil, func(state uint8, port uint16, rq, _ uint32) {
					socks++
					if state == tcpListen && port == 8080 {
						queued += rq
					}
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			if socks < 2000 || queued != 3 {
				b.Fatalf("%d sockets, queue %d", socks, queued)
			}
		}
	})
	b.Run("netlink.SocketDiagTCPInfo", func(b *testing.B) {
		for b.Loop() {
			var socks int
			for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
				res, err := busy.nl.SocketDiagTCPInfo(family)
				if err != nil {
					b.Fatal(err)
				}
				socks += len(res)
			}
			if socks < 2000 {
				b.Fatalf("%d sockets", socks)
			}
		}
	})
}
