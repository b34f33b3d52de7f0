//go:build linux

package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/tests/kit/xdppass"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// ipprotoMPTCP is IPPROTO_MPTCP (include/uapi/linux/in.h).
const ipprotoMPTCP = 262

// cookieLab is a veth pair with the XDP program and the cookie TC program
// on the server's end, the client's end running xdppass (a veth delivers
// its peer's XDP_TX frames only then), and the given rules applied.
type cookieLab struct {
	l    *lab.Lab
	tab  *Tables
	plan *dataplane.Plan
}

func newCookieLab(t *testing.T, prefix string, rules []dataplane.RuleSpec) *cookieLab {
	t.Helper()
	requireRoot(t)
	if err := CookieSupport(); err != nil {
		t.Skipf("no ACK side on this kernel: %v", err)
	}
	l, err := lab.New(lab.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	o, err := Load(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	tab := o.Tables()
	host := dataplane.HostAddrs{dataplane.MACKey(l.ServerMAC): uint32(l.ServerIndex),
		dataplane.IPKey(l.ServerIP4): uint32(l.ServerIndex), dataplane.IPKey(l.ServerIP6): uint32(l.ServerIndex)}
	if err := tab.SetHostAddrs(host); err != nil {
		t.Fatal(err)
	}
	keepLease(t, tab)
	plan, err := dataplane.Compile(&dataplane.Spec{Rules: rules}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tab.Apply(plan); err != nil {
		t.Fatal(err)
	}
	tc, err := o.LoadCookieProgram(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	if err := l.Server.Do(func() error {
		nl, err := netlink.LinkByName(l.ServerIf)
		if err != nil {
			return err
		}
		if err := tab.SetCookieMTU(nl.Attrs().MTU); err != nil {
			return err
		}
		x, err := link.AttachXDP(link.XDPOptions{Program: o.Program(), Interface: nl.Attrs().Index})
		if err != nil {
			return fmt.Errorf("attach XDP: %w", err)
		}
		t.Cleanup(func() { x.Close() })
		c, err := link.AttachTCX(link.TCXOptions{Interface: nl.Attrs().Index, Program: tc.Program(), Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return fmt.Errorf("attach TC: %w", err)
		}
		t.Cleanup(func() { c.Close() })
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.Client.Do(func() error {
		x, err := xdppass.Attach(l.ClientIf)
		if err == nil {
			t.Cleanup(func() { x.Close() })
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return &cookieLab{l: l, tab: tab, plan: plan}
}

// listenProto is listenTCP with the socket's protocol: 0 (TCP) or
// ipprotoMPTCP.
func listenProto(a netip.AddrPort, proto int) (int, error) {
	fam, sa := sockaddr(a)
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return -1, fmt.Errorf("socket(%d): %w", proto, err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind %s: %w", a, err)
	}
	if err := unix.Listen(fd, 64); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// dialProto connects to a within 3 s with a socket of protocol proto.
func dialProto(a netip.AddrPort, proto int) (int, error) {
	fam, sa := sockaddr(a)
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return -1, fmt.Errorf("socket(%d): %w", proto, err)
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 3})
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 3})
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect %s: %w", a, err)
	}
	return fd, nil
}

// TestCookieMPTCPListener: a `syn_cookies: always` rule in front of an
// MPTCP listener (socket(..., IPPROTO_MPTCP), what Go's net.Listen makes
// since Go 1.24 where the kernel has MPTCP) lets every client connect and
// exchange data, plain TCP and MPTCP clients, IPv4 and IPv6; no valid
// cookie is refused by the kernel (assign_failed stays 0). The kernel
// refuses to hand a BPF-made request to an MPTCP listener
// (bpf_sk_assign_tcp_reqsk: -EINVAL for sk_is_mptcp): before, every such
// connection was reset.
func TestCookieMPTCPListener(t *testing.T) {
	const port = 8080
	cl := newCookieLab(t, "xlmp", []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(port, port), SynOnly: true, Rate: 1000, Burst: 1000, SynCookies: "always",
	}})
	l, tab := cl.l, cl.tab
	var listen4, listen6 int
	if err := l.Server.Do(func() error {
		var err error
		if listen4, err = listenProto(netip.AddrPortFrom(l.ServerIP4, port), ipprotoMPTCP); err != nil {
			return err
		}
		listen6, err = listenProto(netip.AddrPortFrom(l.ServerIP6, port), ipprotoMPTCP)
		return err
	}); err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ENOPROTOOPT) {
			t.Skipf("no MPTCP on this kernel: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(listen4); unix.Close(listen6) })
	slot := cl.plan.Slot("web")
	for _, c := range []struct {
		name  string
		v6    bool
		proto int
	}{
		{"IPv4, TCP client", false, 0},
		{"IPv4, MPTCP client", false, ipprotoMPTCP},
		{"IPv6, TCP client", true, 0},
		{"IPv6, MPTCP client", true, ipprotoMPTCP},
	} {
		before, err := tab.CookieCounters(slot)
		if err != nil {
			t.Fatal(err)
		}
		dst, lfd := netip.AddrPortFrom(l.ServerIP4, port), listen4
		if c.v6 {
			dst, lfd = netip.AddrPortFrom(l.ServerIP6, port), listen6
		}
		var cfd int
		if err := l.Client.Do(func() error {
			var err error
			cfd, err = dialProto(dst, c.proto)
			return err
		}); err != nil {
			after, _ := tab.CookieCounters(slot)
			t.Errorf("%s: %v; cookies %+v -> %+v", c.name, err, before, after)
			continue
		}
		// A request and its echo: a connection the kernel reset fails
		// here (the client's read: ECONNRESET), or is never accepted.
		_, werr := unix.Write(cfd, []byte("ping"))
		sfd, aerr := acceptTCP(lfd, 3*time.Second)
		echo := ""
		var rerr error
		if aerr == nil {
			buf := make([]byte, 16)
			_ = unix.SetsockoptTimeval(sfd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 3})
			if n, err := unix.Read(sfd, buf); err == nil && n > 0 {
				_, _ = unix.Write(sfd, buf[:n])
			}
			cbuf := make([]byte, 16)
			n, err := unix.Read(cfd, cbuf)
			rerr = err
			echo = string(cbuf[:max(n, 0)])
			unix.Close(sfd)
		}
		unix.Close(cfd)
		after, _ := tab.CookieCounters(slot)
		t.Logf("%s: write %v, accept %v, echo %q (%v); cookies %+v -> %+v", c.name, werr, aerr, echo, rerr, before, after)
		if aerr != nil || echo != "ping" {
			t.Errorf("%s: accept %v, client read %q, %v: want the connection accepted and its request echoed", c.name, aerr, echo, rerr)
		}
		if after.AssignFailed != before.AssignFailed {
			t.Errorf("%s: assign_failed %d -> %d: a valid cookie for an MPTCP listener, which the kernel refuses",
				c.name, before.AssignFailed, after.AssignFailed)
		}
	}
}

// TestCookieMPTCPShare: the SYNs for an MPTCP listener, which the cookie
// path leaves to the kernel (counted to_socket), go through the rule's
// share for the SYNs XDP cannot answer before its bucket: a flood of them
// from spoofed sources takes at most a quarter of the rule's burst, and
// the rest of the bucket stays for the validated cookies of the rule's
// other listeners (issue 41's H1). Here 12 SYNs at one instant against a
// burst of 8: 2 (8/4) pass, the others are dropped with reason rule.
func TestCookieMPTCPShare(t *testing.T) {
	if !KernelMPTCP() {
		t.Skip("no MPTCP on this kernel")
	}
	h := newHarness(t)
	spec := &dataplane.Spec{CookieRate: 100, Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 10, Burst: 8, SynCookies: "always",
	}}}
	h.apply(t, compile(t, spec, nil))
	slot := h.slot(t, "web")
	cookieListenerProto(t, ipprotoMPTCP) // this thread's own network namespace from here on
	server := netip.MustParseAddr("192.0.2.1")
	loWith(t, server)
	now := uint64(1000 * second)
	before := h.cookieCounters(t, slot)
	pass := 0
	for i := range 12 {
		s := frame.Spec{Src: netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i)}), Dst: server, Proto: frame.ProtoTCP,
			SrcPort: uint16(40000 + i), DstPort: 80, TCPFlags: frame.TCPSyn, TCPSeq: 5000}
		ret, _ := h.kernelRunOut(t, withTCPOptions(t, frame.MustBuild(s), 14, linuxSYNOptions(12345)), now, 1)
		switch ret {
		case xdpPass:
			pass++
		case xdpDrop:
		default:
			t.Errorf("SYN %d for the MPTCP listener: XDP return code %d, want XDP_PASS or XDP_DROP (never answered)", i, ret)
		}
	}
	got := h.cookieCounters(t, slot)
	if pass != 2 {
		t.Errorf("%d of 12 SYNs for the MPTCP listener passed, want 2 (the share: a quarter of the burst of 8)", pass)
	}
	if got.ToSocket-before.ToSocket != 12 || got.Sent != before.Sent {
		t.Errorf("cookie counters %+v -> %+v, want 12 to_socket and none sent", before, got)
	}
}

// cookieListenerProto is cookieListener with the listeners' protocol (0:
// TCP, or ipprotoMPTCP).
func cookieListenerProto(tb testing.TB, proto int) {
	tb.Helper()
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		tb.Fatalf("unshare the network namespace: %v", err)
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			tb.Fatalf("socket: %v", err)
		}
		tb.Cleanup(func() { unix.Close(fd) })
		var sa unix.Sockaddr = &unix.SockaddrInet4{Port: 80}
		if fam == unix.AF_INET6 {
			_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
			sa = &unix.SockaddrInet6{Port: 80}
		}
		if err := unix.Bind(fd, sa); err != nil {
			tb.Fatalf("bind: %v", err)
		}
		if err := unix.Listen(fd, 16); err != nil {
			tb.Fatalf("listen: %v", err)
		}
	}
}

// TestCookieRefuseResetOnTheWire: under syn_cookies: always and
// refuse: reset, a client whose valid cookie ACK the rule refuses over its
// rate gets a reset at once: its connect (the cookie SYN-ACK) or its
// request fails with ECONNRESET well within a second, where before its
// ACK was dropped at TC and it waited, believing it was connected, until
// its own timeout (here the 3 s SO_RCVTIMEO: EAGAIN). The first client,
// within the burst, is served.
func TestCookieRefuseResetOnTheWire(t *testing.T) {
	const port = 8080
	cl := newCookieLab(t, "xlrr", []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(port, port), SynOnly: true, Rate: 1, Burst: 1, SynCookies: "always", Refuse: "reset",
	}})
	l, tab := cl.l, cl.tab
	var lfd int
	if err := l.Server.Do(func() error {
		var err error
		lfd, err = listenProto(netip.AddrPortFrom(l.ServerIP4, port), 0)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(lfd) })
	slot := cl.plan.Slot("web")
	dst := netip.AddrPortFrom(l.ServerIP4, port)
	for i, want := range []string{"served", "reset", "reset"} {
		before, _ := tab.CookieCounters(slot)
		var cfd int
		start := time.Now()
		if err := l.Client.Do(func() error {
			var err error
			cfd, err = dialProto(dst, 0)
			return err
		}); err != nil {
			// On a veth the reset can come back before connect returns
			// (its ACK and the answer run in the same softirq).
			took := time.Since(start)
			after, _ := tab.CookieCounters(slot)
			t.Logf("client %d: connect %v after %v; cookies %+v -> %+v", i, err, took.Round(time.Millisecond), before, after)
			if want != "reset" || !errors.Is(err, unix.ECONNRESET) || took > time.Second {
				t.Errorf("client %d: connect %v after %v", i, err, took.Round(time.Millisecond))
			}
			if after.RefusedReset-before.RefusedReset < 1 {
				t.Errorf("client %d: refused_reset %d -> %d, want counted", i, before.RefusedReset, after.RefusedReset)
			}
			continue
		}
		_, werr := unix.Write(cfd, []byte("ping"))
		if want == "served" {
			sfd, err := acceptTCP(lfd, 3*time.Second)
			if err != nil {
				t.Fatalf("client %d: %v", i, err)
			}
			buf := make([]byte, 16)
			_ = unix.SetsockoptTimeval(sfd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 3})
			if n, err := unix.Read(sfd, buf); err == nil && n > 0 {
				_, _ = unix.Write(sfd, buf[:n])
			}
			unix.Close(sfd)
		}
		buf := make([]byte, 16)
		n, rerr := unix.Read(cfd, buf)
		took := time.Since(start)
		unix.Close(cfd)
		after, _ := tab.CookieCounters(slot)
		t.Logf("client %d: write %v, read %q %v after %v; cookies %+v -> %+v", i, werr, buf[:max(n, 0)], rerr, took.Round(time.Millisecond), before, after)
		switch want {
		case "served":
			if rerr != nil || string(buf[:max(n, 0)]) != "ping" {
				t.Errorf("client %d (within the burst): read %q, %v, want its echo", i, buf[:max(n, 0)], rerr)
			}
		case "reset":
			if !errors.Is(werr, unix.ECONNRESET) && !errors.Is(rerr, unix.ECONNRESET) || took > time.Second {
				t.Errorf("client %d (over the rate): write %v, read %v after %v, want ECONNRESET within 1 s", i, werr, rerr, took.Round(time.Millisecond))
			}
			if after.RefusedReset-before.RefusedReset < 1 {
				t.Errorf("client %d: refused_reset %d -> %d, want counted", i, before.RefusedReset, after.RefusedReset)
			}
		}
	}
}

// TestCookieTimeWaitThroughMPTCPFlood: a flood of spoofed SYNs to an MPTCP
// listener (left to the kernel, class socket) takes the rule's share of
// the SYNs XDP cannot answer, not the share of the SYNs for the host's
// sockets: a client reusing a TIME_WAIT 4-tuple of the same rule still
// gets through after 50 of them, 3 times of 3, as after a flood of
// unanswerable SYNs (TestCookieTimeWaitThroughUnanswerableFlood). With
// both in one share (class socket alone), the flood would spend it.
func TestCookieTimeWaitThroughMPTCPFlood(t *testing.T) {
	if !KernelMPTCP() {
		t.Skip("no MPTCP on this kernel")
	}
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{CookieRate: 100, Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: ports(80, 81), SynOnly: true, Rate: 10, Burst: 10, SynCookies: "always"},
	}}, nil))
	slot := h.slot(t, "web")
	fds := cookieListener(t) // this thread's own network namespace from here on
	mp, err := listenProto(netip.AddrPortFrom(netip.IPv4Unspecified(), 81), ipprotoMPTCP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(mp) })
	server, client := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.20")
	loWith(t, server, client)
	timeWait(t, fds[0], client, server, 40001)
	syn := withTCPOptions(t, frame.MustBuild(frame.Spec{Src: client, Dst: server, Proto: frame.ProtoTCP, SrcPort: 40001, DstPort: 80,
		TCPFlags: frame.TCPSyn, TCPSeq: 5000}), 14, linuxSYNOptions(12345))
	before := h.cookieCounters(t, slot)
	passed, floodPassed := 0, 0
	for _, at := range []uint64{0, 1, 3} {
		now := uint64(1000*second) + at*second
		for i := range 50 {
			in := withTCPOptions(t, frame.MustBuild(frame.Spec{Src: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Dst: server,
				Proto: frame.ProtoTCP, SrcPort: uint16(1024 + i), DstPort: 81, TCPFlags: frame.TCPSyn}), 14, linuxSYNOptions(777))
			switch ret, _ := h.kernelRunOut(t, in, now, 1); ret {
			case xdpTx:
				t.Fatalf("flood SYN %d to the MPTCP listener answered", i)
			case xdpPass:
				floodPassed++
			}
		}
		if ret, _ := h.kernelRunOut(t, syn, now, 1); ret == xdpPass {
			passed++
		}
	}
	got := h.cookieCounters(t, slot)
	t.Logf("each after 50 SYNs to the MPTCP listener: the TIME_WAIT SYN passed %d of 3; flood passed %d of 150; to_socket %d -> %d",
		passed, floodPassed, before.ToSocket, got.ToSocket)
	if passed != 3 {
		t.Errorf("SYN for a TIME_WAIT 4-tuple after a flood to an MPTCP listener: passed %d of 3, want 3", passed)
	}
	if floodPassed == 0 || floodPassed > 10 {
		t.Errorf("flood to the MPTCP listener: %d of 150 passed, want some, within a quarter of the rule's 10/s and burst 10", floodPassed)
	}
}
