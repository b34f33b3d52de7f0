//go:build linux

package maps

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

const tcxNext = 0xffffffff

func htonsB(v uint16) uint16 { return v<<8 | v>>8 }

// kernelCookieSynAck makes the kernel's own listener answer a SYN from
// src with its own SYN cookie (tcp_syncookies=2 in the test's namespace)
// and returns that SYN-ACK as it left the host. The SYN arrives over a
// veth pair of the test's own namespace (created here): sent on one end,
// received by the stack on the other, which holds dst.
func kernelCookieSynAck(t *testing.T, s frame.Spec, opts []byte) []byte {
	t.Helper()
	if err := os.WriteFile("/proc/sys/net/ipv4/tcp_syncookies", []byte("2"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv, cli := kernelCookieVeth(t)
	s.SrcMAC, s.DstMAC = cli.Attrs().HardwareAddr, srv.Attrs().HardwareAddr
	bits := s.Dst.BitLen()
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: s.Dst.AsSlice(), Mask: net.CIDRMask(bits, bits)}, Flags: unix.IFA_F_NODAD}
	if err := netlink.AddrAdd(srv, addr); err != nil && !os.IsExist(err) {
		t.Fatalf("add %s: %v", s.Dst, err)
	}
	rt := &netlink.Route{LinkIndex: srv.Attrs().Index, Dst: &net.IPNet{IP: s.Src.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if err := netlink.RouteAdd(rt); err != nil && !os.IsExist(err) {
		t.Fatalf("route %s: %v", s.Src, err)
	}
	fam := netlink.FAMILY_V4
	if s.Src.Is6() {
		fam = netlink.FAMILY_V6
	}
	n := &netlink.Neigh{LinkIndex: srv.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT,
		IP: s.Src.AsSlice(), HardwareAddr: cli.Attrs().HardwareAddr}
	if err := netlink.NeighSet(n); err != nil {
		t.Fatalf("neighbour %s: %v", s.Src, err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htonsB(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	sa := &unix.SockaddrLinklayer{Protocol: htonsB(unix.ETH_P_ALL), Ifindex: cli.Attrs().Index}
	if err := unix.Bind(fd, sa); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval(int64(200 * time.Millisecond))
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	l3, l4 := 14, 34
	if s.Src.Is6() {
		l4 = 54
	}
	syn := withTCPOptions(t, frame.MustBuild(s), l3, opts)
	// The SYN goes again, as a client's would, while no SYN-ACK came
	// back: under tcp_syncookies=2 the listener keeps no state, so each
	// answer is as good as the first. (A lone SYN went unanswered once in
	// a loaded run; the frames seen are reported should it happen again.)
	buf := make([]byte, 2048)
	sent, seen := 0, 0
	var last time.Time
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		if time.Since(last) >= 500*time.Millisecond {
			if err := unix.Sendto(fd, syn, 0, sa); err != nil {
				t.Fatal(err)
			}
			sent++
			last = time.Now()
		}
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			continue
		}
		seen++
		f := buf[:n]
		if n < l4+20 || binary.BigEndian.Uint16(f[12:]) != binary.BigEndian.Uint16(syn[12:]) ||
			binary.BigEndian.Uint16(f[l4:]) != 80 || f[l4+13] != 0x12 {
			continue
		}
		return append([]byte(nil), f...)
	}
	t.Fatalf("%s: no SYN-ACK from the kernel's listener to %d SYNs (%d frames seen on %s, the SYNs among them)",
		s.Src, sent, seen, cli.Attrs().Name)
	return nil
}

// kernelCookieVeth creates (once per namespace) a veth pair in the test's
// namespace, both ends up: the server end and the client end.
func kernelCookieVeth(t *testing.T) (srv, cli netlink.Link) {
	t.Helper()
	if l, err := netlink.LinkByName("xlks"); err == nil {
		c, err := netlink.LinkByName("xlkc")
		if err != nil {
			t.Fatal(err)
		}
		return l, c
	}
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "xlks"}, PeerName: "xlkc"}
	if err := netlink.LinkAdd(v); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	for _, name := range []string{"xlks", "xlkc"} {
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/accept_dad", []byte("0"), 0o644)
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	srv, _ = netlink.LinkByName("xlks")
	cli, _ = netlink.LinkByName("xlkc")
	return srv, cli
}

// TestKernelCookieGoesToKernel: an ACK carrying a cookie that the kernel
// made (its own listener answered the SYN, tcp_syncookies=2) is left to
// the kernel at TC (TCX_NEXT), neither validated as xlimit's nor charged
// to the rule, and counted kernel_cookie, for IPv4 and IPv6. Before
// (cd7296b) both validated and were charged: xlimit's cookies were the
// kernel's own, and the TC program then decoded the kernel's timestamp
// bits in its own layout.
func TestKernelCookieGoesToKernel(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1000, Burst: 1000, SynCookies: "always"},
	}}, nil))
	slot := h.slot(t, "web")
	tc := loadTC(t, h)
	cookieListener(t)
	for _, fam := range []struct{ src, dst string }{{"198.51.100.7", "192.0.2.1"}, {"2001:db8:1::7", "2001:db8::1"}} {
		src, dst := netip.MustParseAddr(fam.src), netip.MustParseAddr(fam.dst)
		s := frame.Spec{Src: src, Dst: dst, Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80,
			TCPFlags: frame.TCPSyn, TCPSeq: 777000}
		l4 := 34
		if src.Is6() {
			l4 = 54
		}
		synack := kernelCookieSynAck(t, s, linuxSYNOptions(99999))
		ack := cookieACK(t, s, synack, l4, 777000)
		before, cb, ab := h.slotCounters(t, slot), h.cookieCounters(t, slot), h.answerCounters(t, slot)
		ret := tcRun(t, tc, ack)
		after, ca, aa := h.slotCounters(t, slot), h.cookieCounters(t, slot), h.answerCounters(t, slot)
		if ret != tcxNext {
			t.Errorf("%s: the kernel's own cookie: TC returned %d, want TCX_NEXT (left to the kernel)", fam.src, int32(ret))
		}
		if d := after.Sub(before); d != (dataplane.Counters{}) {
			t.Errorf("%s: the kernel's own cookie charged the rule: %s", fam.src, fmtCounters(d))
		}
		if ca != cb {
			t.Errorf("%s: the kernel's own cookie counted as xlimit's: %+v -> %+v", fam.src, cb, ca)
		}
		if d := aa.Sub(ab); d != (dataplane.AnswerCounters{KernelCookie: 1}) {
			t.Errorf("%s: answer counters %+v, want one kernel_cookie", fam.src, d)
		}
	}
}

// TestXlimitCookieFailsInKernel: an ACK for a cookie xlimit made, should
// it reach the kernel (no TC program here), fails the kernel's own cookie
// check even while the kernel is answering with cookies (its listener's
// SYN queue "overflowed", tcp_syncookies=2): counted SyncookiesFailed, no
// connection. Before (cd7296b) the kernel took it for its own
// (SyncookiesRecv) and opened the connection with options decoded from
// xlimit's timestamp layout as if they were its own.
func TestXlimitCookieFailsInKernel(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1000, Burst: 1000, SynCookies: "always"},
	}}, nil))
	fds := cookieListener(t)
	for i, fam := range []struct{ src, dst string }{{"198.51.100.7", "192.0.2.1"}, {"2001:db8:1::7", "2001:db8::1"}} {
		src, dst := netip.MustParseAddr(fam.src), netip.MustParseAddr(fam.dst)
		l4 := 34
		if src.Is6() {
			l4 = 54
		}
		// The kernel answers one SYN with its own cookie: its listener
		// now checks cookies, and the route and neighbour exist.
		kernelCookieSynAck(t, frame.Spec{Src: src, Dst: dst, Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80,
			TCPFlags: frame.TCPSyn, TCPSeq: 777000}, linuxSYNOptions(99999))
		// xlimit answers another SYN of the same client.
		s := frame.Spec{Src: src, Dst: dst, Proto: frame.ProtoTCP, SrcPort: 40001, DstPort: 80,
			TCPFlags: frame.TCPSyn, TCPSeq: 888000}
		ret, synack := h.kernelRunOut(t, withTCPOptions(t, frame.MustBuild(s), 14, linuxSYNOptions(99999)), uint64(1000+i)*second, 1)
		if ret != xdpTx {
			t.Fatalf("%s: XDP return code %d, want a cookie", fam.src, ret)
		}
		srv, cli := kernelCookieVeth(t)
		s.SrcMAC, s.DstMAC = cli.Attrs().HardwareAddr, srv.Attrs().HardwareAddr
		ack := cookieACK(t, s, synack, l4, 888000)
		n0 := tcpExt(t)
		sendOn(t, cli, ack)
		time.Sleep(100 * time.Millisecond)
		n1 := tcpExt(t)
		if d := n1["SyncookiesRecv"] - n0["SyncookiesRecv"]; d != 0 {
			t.Errorf("%s: the kernel validated xlimit's cookie (SyncookiesRecv +%d)", fam.src, d)
		}
		if d := n1["SyncookiesFailed"] - n0["SyncookiesFailed"]; d != 1 {
			t.Errorf("%s: SyncookiesFailed +%d, want +1", fam.src, d)
		}
		fd := fds[0]
		if src.Is6() {
			fd = fds[1]
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			t.Fatal(err)
		}
		if nfd, _, err := unix.Accept(fd); err == nil {
			unix.Close(nfd)
			t.Errorf("%s: the kernel opened a connection from xlimit's cookie", fam.src)
		}
	}
}

// tcpExt reads the TcpExt counters of the calling thread's namespace.
func tcpExt(t *testing.T) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/net/netstat")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	m := map[string]int64{}
	for i := 0; i+1 < len(lines); i += 2 {
		k, v := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(k) == 0 || k[0] != "TcpExt:" || len(k) != len(v) {
			continue
		}
		for j := 1; j < len(k); j++ {
			n, _ := strconv.ParseInt(v[j], 10, 64)
			m[k[j]] = n
		}
	}
	return m
}

// sendOn sends a frame out of link through a packet socket.
func sendOn(t *testing.T, l netlink.Link, f []byte) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, f, 0, &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}); err != nil {
		t.Fatal(err)
	}
}

// loadTC loads the cookie program over the harness's maps, skipping the
// test on a kernel without bpf_sk_assign_tcp_reqsk.
func loadTC(t *testing.T, h *harness) *CookieProgram {
	t.Helper()
	tc, err := h.obj.LoadCookieProgram(true)
	if errors.Is(err, ErrCookieKernel) {
		t.Skipf("no ACK check on this kernel: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tc.Close() })
	return tc
}

// cookieAck answers a SYN from src at XDP (kernel and model) and returns
// the ACK a client would send back.
func (h *harness) cookieAck(t *testing.T, src string, port uint16, now uint64) []byte {
	t.Helper()
	s := frame.Spec{Src: netip.MustParseAddr(src), Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: port,
		TCPFlags: frame.TCPSyn, TCPSeq: 777000}
	in := withTCPOptions(t, frame.MustBuild(s), 14, linuxSYNOptions(99999))
	ret, out := h.kernelRunOut(t, in, now, 1)
	h.model.Eval(in, now)
	if ret != xdpTx {
		t.Fatalf("SYN from %s: XDP return code %d, want a cookie", src, ret)
	}
	return cookieACK(t, s, out, 34, 777000)
}

// TestCookieTCShadow: a shadow rule never drops at TC: a validated
// connection that it would refuse is counted would_drop and handed over;
// kernel and model in step. Before (cd7296b) the TC program dropped it
// (TC_ACT_SHOT) and counted drop.
func TestCookieTCShadow(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1000, Burst: 1000, SynCookies: "always"},
		{Name: "shadow", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1, Burst: 1, Shadow: true},
	}}, nil))
	tc := loadTC(t, h)
	cookieListener(t)
	web, shadow := h.slot(t, "web"), h.slot(t, "shadow")
	now := uint64(1000 * second)
	for i, src := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
		ack := h.cookieAck(t, src, 80, now)
		ret := tcRun(t, tc, ack)
		if refused := h.model.CookieACK(ack, web, now); refused || ret == tcShot {
			t.Errorf("ACK %d: TC returned %d (model refused: %v): a shadow rule dropped a validated connection", i, int32(ret), refused)
		}
	}
	c := h.slotCounters(t, shadow)
	if c.Packets[dataplane.VerdictPass] != 1 || c.Packets[dataplane.VerdictWouldDrop] != 2 || c.Packets[dataplane.VerdictDrop] != 0 {
		t.Errorf("shadow rule: %s, want 1 pass and 2 would_drop", fmtCounters(c))
	}
	h.checkCounters(t)
}

const tcShot = 2

// TestCookieTCChargesOnce: each connection is charged once per rule. A
// lower-slot rule that the SYN charged at XDP (it admitted it before the
// cookie rule answered) is not charged again by the ACK at TC; the cookie
// rule and the rules after it are, once; kernel and model in step. Before
// (cd7296b) the ACK charged every matching rule, the lower one a second
// time.
func TestCookieTCChargesOnce(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "plain", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1000, Burst: 1000},
		{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1000, Burst: 1000, SynCookies: "always"},
		{Name: "after", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1000, Burst: 1000},
	}}, nil))
	tc := loadTC(t, h)
	cookieListener(t)
	plain, web, after := h.slot(t, "plain"), h.slot(t, "web"), h.slot(t, "after")
	now := uint64(1000 * second)
	p0, w0, a0 := h.slotCounters(t, plain), h.slotCounters(t, web), h.slotCounters(t, after)
	ack := h.cookieAck(t, "198.51.100.1", 80, now)
	tcRun(t, tc, ack)
	h.model.CookieACK(ack, web, now)
	if d := h.slotCounters(t, plain).Sub(p0); d.Packets[dataplane.VerdictPass] != 1 || d.Reasons[dataplane.ReasonAdmit] != 1 {
		t.Errorf("plain (slot %d, before the cookie rule): SYN and ACK of one connection counted %s, want one admit", plain, fmtCounters(d))
	}
	if d := h.slotCounters(t, web).Sub(w0); d.Reasons[dataplane.ReasonCookie] != 1 || d.Reasons[dataplane.ReasonAdmit] != 1 {
		t.Errorf("web (slot %d): %s, want one cookie (the SYN) and one admit (the ACK)", web, fmtCounters(d))
	}
	if d := h.slotCounters(t, after).Sub(a0); d.Packets[dataplane.VerdictPass] != 1 || d.Reasons[dataplane.ReasonAdmit] != 1 {
		t.Errorf("after (slot %d, past the cookie rule): %s, want one admit (the ACK)", after, fmtCounters(d))
	}
	h.checkCounters(t)
}

// TestCookieTCRefuseReset: a valid cookie ACK that a rule with
// refuse: reset refuses over its rate is left to the kernel's listener
// (TCX_NEXT), which has no request for it and answers it with a reset: its
// client learns at once, where a dropped ACK (TC_ACT_SHOT) left it
// believing it was connected. Its source is proven by the cookie, so the
// reset is bounded by no reset budget: here 5 refused ACKs at one instant
// are all answered, past the host's and the rule's reset budgets. Under
// refuse: drop the ACK is still dropped. Kernel and model in step;
// counted refused and refused_reset.
func TestCookieTCRefuseReset(t *testing.T) {
	for _, c := range []struct {
		refuse string
		want   uint32
	}{{"reset", tcxNext}, {"drop", tcShot}} {
		t.Run(c.refuse, func(t *testing.T) {
			h := newHarness(t)
			h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
				{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1, Burst: 1, SynCookies: "always", Refuse: c.refuse},
			}}, nil))
			tc := loadTC(t, h)
			cookieListener(t)
			web := h.slot(t, "web")
			now := uint64(1000 * second)
			before := h.cookieCounters(t, web)
			for i := range 6 {
				ack := h.cookieAck(t, fmt.Sprintf("198.51.100.%d", 10+i), 80, now)
				ret := tcRun(t, tc, ack)
				refused, reset := h.model.CookieACKRefusal(ack, web, now)
				if i == 0 {
					// Admitted: BPF_PROG_TEST_RUN has no TC ingress, so
					// the assignment fails and the ACK goes on.
					if refused || ret == tcShot {
						t.Errorf("ACK 0: TC returned %d (model refused: %v), want it admitted", int32(ret), refused)
					}
					continue
				}
				if ret != c.want || !refused || reset != (c.refuse == "reset") {
					t.Errorf("ACK %d over the rate: TC returned %d, want %d; model refused %v reset %v", i, int32(ret), int32(c.want), refused, reset)
				}
			}
			got := h.cookieCounters(t, web)
			wantReset := uint64(0)
			if c.refuse == "reset" {
				wantReset = 5
			}
			if got.Refused-before.Refused != 5 || got.RefusedReset-before.RefusedReset != wantReset {
				t.Errorf("cookie counters %+v -> %+v, want 5 refused, %d of them answered with a reset", before, got, wantReset)
			}
			h.checkCounters(t)
		})
	}
}
