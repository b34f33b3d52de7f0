//go:build linux

package maps

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/tests/kit/xdppass"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// tcpInfo is what a test needs of a socket's struct tcp_info.
type tcpInfo struct {
	options          uint8 // TCPI_OPT_*
	sndWscale        uint8
	rcvWscale        uint8
	sndMSS, maxSeg   uint32 // tcpi_snd_mss, and TCP_MAXSEG
	timestamps, sack bool
	wscale, ecn      bool
}

func readTCPInfo(fd int) (tcpInfo, error) {
	var b [104]byte
	n := uint32(len(b))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&n)), 0); e != 0 {
		return tcpInfo{}, fmt.Errorf("getsockopt TCP_INFO: %w", e)
	}
	seg, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_MAXSEG)
	if err != nil {
		return tcpInfo{}, fmt.Errorf("getsockopt TCP_MAXSEG: %w", err)
	}
	i := tcpInfo{options: b[5], sndWscale: b[6] & 0xf, rcvWscale: b[6] >> 4,
		sndMSS: binary.NativeEndian.Uint32(b[16:]), maxSeg: uint32(seg)}
	i.timestamps, i.sack, i.wscale, i.ecn = i.options&1 != 0, i.options&2 != 0, i.options&4 != 0, i.options&8 != 0
	return i, nil
}

// TestCookieAttributesOnTheWire: connections opened through xlimit's SYN
// cookies on a veth of MTU 1460 carry the options their client offered,
// as the server's accepted socket reports them (TCP_INFO, TCP_MAXSEG):
// what bpf_sk_assign_tcp_reqsk was given. The cookie keeps the MSS to the
// kernel's table (IPv4 536/1300/1440/1460, IPv6 1220/1420/1440/8940: the
// client's 1420 and 1400 become 1300 and 1220), timestamps carry window
// scale, SACK and ECN, a client without timestamps gets none of them and
// MSS 536 (1220). A client on an MTU of 1500 is told the MSS of the
// server's interface, its MTU less 40 (IPv4) or 60 (IPv6), 1420 and 1400,
// and its socket sends no larger segments (before, cd7296b: 1460 and
// 1440, and 1448-byte segments into a 1460-byte MTU). The kernel tier's TestCookieSynAck counts an
// AssignFailed as a pass (BPF_PROG_TEST_RUN has no TC ingress); this is
// the real path.
func TestCookieAttributesOnTheWire(t *testing.T) {
	requireRoot(t)
	if err := CookieSupport(); err != nil {
		t.Skipf("no ACK side on this kernel: %v", err)
	}
	l, err := lab.New(lab.Options{Prefix: "xlca"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	const mtu, port = 1460, 8080
	if err := l.Server.Do(func() error {
		nl, err := netlink.LinkByName(l.ServerIf)
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(nl, mtu)
	}); err != nil {
		t.Fatal(err)
	}

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
	plan, err := dataplane.Compile(&dataplane.Spec{Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(port, port), SynOnly: true, Rate: 1000, Burst: 1000, SynCookies: "always",
	}}}, nil)
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
	var listen4, listen6 int
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
		if listen4, err = listenTCP(netip.AddrPortFrom(l.ServerIP4, port)); err != nil {
			return err
		}
		listen6, err = listenTCP(netip.AddrPortFrom(l.ServerIP6, port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(listen4); unix.Close(listen6) })
	if err := l.Client.Do(func() error {
		// A veth delivers its peer's XDP_TX frames only when it runs an
		// XDP program (xdppass.Attach).
		x, err := xdppass.Attach(l.ClientIf)
		if err == nil {
			t.Cleanup(func() { x.Close() })
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got, _ := tab.CookieLink(); got.MSS4 != mtu-40 || got.MSS6 != mtu-60 || got.Offset < CookieOffsetMin || got.Offset > CookieOffsetMax {
		t.Fatalf("cookie settings %+v, want MSS %d/%d and an offset in [%#x, %#x]", got, mtu-40, mtu-60, CookieOffsetMin, CookieOffsetMax)
	}

	for _, c := range []struct {
		name      string
		v6        bool
		sysctls   map[string]string // the client's
		clientMTU int               // 0: mtu, as the server's
		// What the server's socket must show.
		mss                   uint32 // the cookie's MSS (TCP_MAXSEG: less 12 with timestamps)
		ts, sack, wscale, ecn bool
	}{
		// A client on a larger MTU (1500) offers 1460 (1440): it is told
		// the server's path takes 1420 (1400), and sends no larger.
		{name: "IPv4, client MTU 1500", clientMTU: 1500, mss: 1420, ts: true, sack: true, wscale: true},
		{name: "IPv6, client MTU 1500", v6: true, clientMTU: 1500, mss: 1400, ts: true, sack: true, wscale: true},
		{name: "IPv4, Linux defaults", mss: 1300, ts: true, sack: true, wscale: true},
		{name: "IPv4, ECN", sysctls: map[string]string{"ipv4/tcp_ecn": "1"}, mss: 1300, ts: true, sack: true, wscale: true, ecn: true},
		{name: "IPv4, no SACK", sysctls: map[string]string{"ipv4/tcp_sack": "0"}, mss: 1300, ts: true, wscale: true},
		{name: "IPv4, no window scaling", sysctls: map[string]string{"ipv4/tcp_window_scaling": "0"}, mss: 1300, ts: true, sack: true},
		{name: "IPv4, no timestamps", sysctls: map[string]string{"ipv4/tcp_timestamps": "0"}, mss: 536},
		{name: "IPv6, Linux defaults", v6: true, mss: 1220, ts: true, sack: true, wscale: true},
		{name: "IPv6, no timestamps", v6: true, sysctls: map[string]string{"ipv4/tcp_timestamps": "0"}, mss: 1220},
	} {
		before, err := tab.CookieCounters(plan.Slot("web"))
		if err != nil {
			t.Fatal(err)
		}
		dst, lfd, announced := netip.AddrPortFrom(l.ServerIP4, port), listen4, uint32(mtu-40)
		if c.v6 {
			dst, lfd, announced = netip.AddrPortFrom(l.ServerIP6, port), listen6, mtu-60
		}
		var client tcpInfo
		var cfd int
		if err := l.Client.Do(func() error {
			nl, err := netlink.LinkByName(l.ClientIf)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetMTU(nl, cmp.Or(c.clientMTU, mtu)); err != nil {
				return err
			}
			defaults := map[string]string{"ipv4/tcp_ecn": "2", "ipv4/tcp_sack": "1", "ipv4/tcp_window_scaling": "1", "ipv4/tcp_timestamps": "1"}
			for k, v := range c.sysctls {
				defaults[k] = v
			}
			for k, v := range defaults {
				if err := os.WriteFile(filepath.Join("/proc/sys/net", k), []byte(v), 0o644); err != nil {
					return err
				}
			}
			if cfd, err = dialTCP(dst); err != nil {
				return err
			}
			client, err = readTCPInfo(cfd)
			return err
		}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		sfd, err := acceptTCP(lfd, 3*time.Second)
		if err != nil {
			unix.Close(cfd)
			t.Fatalf("%s: %v", c.name, err)
		}
		server, err := readTCPInfo(sfd)
		if err != nil {
			t.Fatal(err)
		}
		// One request and its answer over the connection.
		if _, err := unix.Write(cfd, []byte("ping")); err != nil {
			t.Errorf("%s: client write: %v", c.name, err)
		}
		buf := make([]byte, 16)
		_ = unix.SetsockoptTimeval(sfd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 3})
		if n, err := unix.Read(sfd, buf); err != nil || string(buf[:n]) != "ping" {
			t.Errorf("%s: server read %q, %v", c.name, buf[:max(n, 0)], err)
		}
		unix.Close(sfd)
		unix.Close(cfd)
		after, _ := tab.CookieCounters(plan.Slot("web"))
		t.Logf("%s: client %+v, server %+v", c.name, client, server)
		if after.Validated-before.Validated != 1 {
			t.Errorf("%s: cookie counters %+v -> %+v, want one connection validated and handed over", c.name, before, after)
		}
		if server.timestamps != c.ts || server.sack != c.sack || server.wscale != c.wscale || server.ecn != c.ecn {
			t.Errorf("%s: server socket ts=%v sack=%v wscale=%v ecn=%v, want %v %v %v %v", c.name,
				server.timestamps, server.sack, server.wscale, server.ecn, c.ts, c.sack, c.wscale, c.ecn)
		}
		tsLen := uint32(0)
		if c.ts {
			tsLen = 12
		}
		if server.maxSeg != c.mss-tsLen {
			t.Errorf("%s: server TCP_MAXSEG %d, want the cookie's MSS %d less %d", c.name, server.maxSeg, c.mss, tsLen)
		}
		if c.wscale && (server.sndWscale != client.rcvWscale || server.rcvWscale != 7) {
			t.Errorf("%s: window scales: server sends with %d, receives with %d; client receives with %d; want the client's and 7",
				c.name, server.sndWscale, server.rcvWscale, client.rcvWscale)
		}
		if !c.wscale && (server.sndWscale != 0 || server.rcvWscale != 0) {
			t.Errorf("%s: window scales %d/%d without window scaling", c.name, server.sndWscale, server.rcvWscale)
		}
		if client.maxSeg != announced-tsLen {
			t.Errorf("%s: client TCP_MAXSEG %d, want the SYN-ACK's MSS %d (MTU %d) less %d", c.name, client.maxSeg, announced, mtu, tsLen)
		}
	}
}

func sockaddr(a netip.AddrPort) (int, unix.Sockaddr) {
	if a.Addr().Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
}

func listenTCP(a netip.AddrPort) (int, error) {
	fam, sa := sockaddr(a)
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
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

// dialTCP connects to a within 3 s (the handshake goes through XDP and TC).
func dialTCP(a netip.AddrPort) (int, error) {
	fam, sa := sockaddr(a)
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 3})
	if err := unix.Connect(fd, sa); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("connect %s: %w", a, err)
	}
	return fd, nil
}

func acceptTCP(lfd int, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		pfd := []unix.PollFd{{Fd: int32(lfd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(pfd, 100); n > 0 {
			fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
			if err == nil || !errors.Is(err, unix.EAGAIN) {
				return fd, err
			}
		}
	}
	return -1, errors.New("no connection accepted")
}
