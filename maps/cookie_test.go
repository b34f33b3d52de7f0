//go:build linux

package maps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// withTCPOptions rewrites a built TCP frame to carry opts (a multiple of 4
// bytes) after its 20-byte TCP header, fixing lengths and checksums.
func withTCPOptions(tb testing.TB, in []byte, l3 int, opts []byte) []byte {
	tb.Helper()
	v6 := in[l3]>>4 == 6
	l4 := l3 + 20
	if v6 {
		l4 = l3 + 40
	}
	out := append(append(append([]byte{}, in[:l4+20]...), opts...), in[l4+20:]...)
	tcpLen := len(out) - l4
	if v6 {
		binary.BigEndian.PutUint16(out[l3+4:], uint16(tcpLen))
	} else {
		binary.BigEndian.PutUint16(out[l3+2:], uint16(len(out)-l3))
		out[l3+10], out[l3+11] = 0, 0
		binary.BigEndian.PutUint16(out[l3+10:], ^uint16(frame.OnesSum(0, out[l3:l4])))
	}
	out[l4+12] = byte((20+len(opts))/4) << 4
	out[l4+16], out[l4+17] = 0, 0
	binary.BigEndian.PutUint16(out[l4+16:], ^uint16(frame.OnesSum(pseudoSum(out, l3, l4), out[l4:])))
	return out
}

func pseudoSum(b []byte, l3, l4 int) uint32 {
	n := uint32(len(b) - l4)
	if b[l3]>>4 == 6 {
		return frame.OnesSum(0, b[l3+8:l3+40]) + 6 + n
	}
	return frame.OnesSum(0, b[l3+12:l3+20]) + 6 + n
}

// Linux's SYN options: MSS 1460, SACK permitted, timestamps, NOP, window
// scale 7.
func linuxSYNOptions(tsval uint32) []byte {
	o := []byte{2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 3, 7}
	binary.BigEndian.PutUint32(o[8:], tsval)
	return o
}

// cookieACK builds the client's ACK to a SYN-ACK: the SYN's addresses and
// ports, seq = isn+1, ack = cookie+1, and timestamps echoing the
// SYN-ACK's (when it had them).
func cookieACK(tb testing.TB, syn frame.Spec, synack []byte, l4 int, isn uint32) []byte {
	s := syn
	s.TCPFlags = frame.TCPAck
	s.TCPSeq = isn + 1
	s.TCPAck = binary.BigEndian.Uint32(synack[l4+4:]) + 1
	in := frame.MustBuild(s)
	tsval, _, ok := tcpTimestamps(synack[l4:])
	if !ok {
		return in
	}
	o := []byte{1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(o[4:], 123457)
	binary.BigEndian.PutUint32(o[8:], tsval)
	return withTCPOptions(tb, in, l4-map[bool]int{true: 40, false: 20}[syn.Src.Is6()], o)
}

// tcpOption returns the body of the first TCP option of kind in the TCP
// header tcp.
func tcpOption(tcp []byte, kind byte) ([]byte, bool) {
	hl := int(tcp[12]>>4) * 4
	for i := 20; i < hl; {
		switch tcp[i] {
		case 0:
			return nil, false
		case 1:
			i++
			continue
		}
		n := int(tcp[i+1])
		if n < 2 || i+n > hl {
			return nil, false
		}
		if tcp[i] == kind {
			return tcp[i+2 : i+n], true
		}
		i += n
	}
	return nil, false
}

func tcpTimestamps(tcp []byte) (tsval, tsecr uint32, ok bool) {
	b, ok := tcpOption(tcp, 8)
	if !ok || len(b) != 8 {
		return 0, 0, false
	}
	return binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:]), true
}

// TestCookieSynAck: a SYN of an `always` rule comes back as a SYN-ACK with
// the kernel's SYN cookie, checked field by field (addresses, lengths,
// flags, options, both checksums), for IPv4 and IPv6, tagged or not, with
// and without options; a SYN to an address that is not the host's and one
// over the budget are dropped, not answered. The ACK built from each
// SYN-ACK passes the kernel's own cookie check in the TC program (when the
// kernel has it), and an ACK with a wrong cookie does not.
func TestCookieSynAck(t *testing.T) {
	h := newHarness(t)
	spec := &dataplane.Spec{CookieRate: 100, MSS4: 1400, MSS6: 1380, Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 10, Burst: 3, SynCookies: "always",
	}}}
	h.apply(t, compile(t, spec, nil))
	slot := h.slot(t, "web")
	now := uint64(1000 * second)

	tc, tcErr := h.obj.LoadCookieProgram(true)
	if tcErr == nil {
		t.Cleanup(func() { tc.Close() })
	} else if !errors.Is(tcErr, ErrCookieKernel) {
		t.Fatalf("load the cookie program: %v", tcErr)
	} else {
		t.Logf("no ACK check on this kernel: %v", tcErr)
	}
	listener := cookieListener(t)

	for _, c := range []struct {
		name  string
		src   string
		vlans []uint16
		opts  bool
	}{
		{"IPv4 with options", "198.51.100.1", nil, true},
		{"IPv4 without options", "198.51.100.2", nil, false},
		{"IPv4 in QinQ, options", "198.51.100.3", []uint16{frame.EtherType8021AD, frame.EtherType8021Q}, true},
		{"IPv6 with options", "2001:db8:1::1", nil, true},
		{"IPv6 tagged, no options", "2001:db8:1::2", []uint16{frame.EtherType8021Q}, false},
	} {
		now += second
		s := frame.Spec{Src: netip.MustParseAddr(c.src), Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80,
			TCPFlags: frame.TCPSyn, TCPSeq: 777000}
		s.VLANs = frame.Tags(c.vlans...)
		l3 := 14 + 4*len(c.vlans)
		l4 := l3 + 20
		v6 := s.Src.Is6()
		if v6 {
			l4 = l3 + 40
		}
		in := frame.MustBuild(s)
		if c.opts {
			in = withTCPOptions(t, in, l3, linuxSYNOptions(99999))
		}
		res := h.model.Eval(in, now)
		if !res.Cookie || res.Reason != dataplane.ReasonCookie {
			t.Fatalf("%s: model %+v, want a cookie", c.name, res)
		}
		ret, out := h.kernelRunOut(t, in, now, 1)
		if ret != xdpTx {
			t.Errorf("%s: XDP return code %d, want XDP_TX", c.name, ret)
			continue
		}
		// The options: 20 bytes to a SYN with timestamps, the MSS alone
		// (4) to one without.
		tcpLen := 24
		if c.opts {
			tcpLen = 40
		}
		if len(out) != l4+tcpLen {
			t.Errorf("%s: SYN-ACK is %d bytes, want %d", c.name, len(out), l4+tcpLen)
			continue
		}
		if !bytes.Equal(out[0:6], in[6:12]) || !bytes.Equal(out[6:12], in[0:6]) || !bytes.Equal(out[12:l3], in[12:l3]) {
			t.Errorf("%s: Ethernet header %x, want the addresses swapped and the tags kept", c.name, out[:l3])
		}
		if !v6 {
			ip, orig := out[l3:l4], in[l3:l3+20]
			if ip[0] != 0x45 || int(binary.BigEndian.Uint16(ip[2:])) != 20+tcpLen || ip[8] != 64 || ip[9] != 6 ||
				!bytes.Equal(ip[12:16], orig[16:20]) || !bytes.Equal(ip[16:20], orig[12:16]) {
				t.Errorf("%s: IPv4 header %x", c.name, ip)
			}
			if frame.OnesSum(0, ip) != 0xffff {
				t.Errorf("%s: IPv4 header checksum wrong: %x", c.name, ip)
			}
		} else {
			ip, orig := out[l3:l4], in[l3:l3+40]
			if ip[0]>>4 != 6 || int(binary.BigEndian.Uint16(ip[4:])) != tcpLen || ip[6] != 6 || ip[7] != 64 ||
				!bytes.Equal(ip[8:24], orig[24:40]) || !bytes.Equal(ip[24:40], orig[8:24]) {
				t.Errorf("%s: IPv6 header %x", c.name, ip)
			}
		}
		tcp, orig := out[l4:], in[l4:]
		if !bytes.Equal(tcp[0:2], orig[2:4]) || !bytes.Equal(tcp[2:4], orig[0:2]) ||
			binary.BigEndian.Uint32(tcp[8:]) != 777001 || int(tcp[12]) != tcpLen/4<<4 || tcp[13] != 0x12 ||
			binary.BigEndian.Uint16(tcp[14:]) != 65535 {
			t.Errorf("%s: TCP header %x, want ports swapped, ack 777001, %d bytes, SYN|ACK, window 65535", c.name, tcp, tcpLen)
		}
		if frame.OnesSum(pseudoSum(out, l3, l4), tcp) != 0xffff {
			t.Errorf("%s: TCP checksum wrong: %x", c.name, tcp)
		}
		wantMSS := uint16(1400)
		if v6 {
			wantMSS = 1380
		}
		if m, ok := tcpOption(tcp, 2); !ok || binary.BigEndian.Uint16(m) != wantMSS {
			t.Errorf("%s: MSS option %x, want %d", c.name, m, wantMSS)
		}
		tsval, tsecr, ts := tcpTimestamps(tcp)
		_, sack := tcpOption(tcp, 4)
		ws, wsok := tcpOption(tcp, 3)
		if ts != c.opts || sack != c.opts || wsok != c.opts {
			t.Errorf("%s: options ts=%v sack=%v wscale=%v, want all %v", c.name, ts, sack, wsok, c.opts)
		}
		if c.opts {
			// The low byte: wscale 7, SACK, no ECN, the MSS index of 1460
			// (IPv4: 3) or of 1440 (IPv6: 2).
			idx := uint32(3)
			if v6 {
				idx = 2
			}
			if tsecr != 99999 || tsval&0xff != 7|0x10|idx<<6 || ws[0] != 7 {
				t.Errorf("%s: tsval %#x tsecr %d wscale %d, want low byte %#x, echo 99999, 7", c.name, tsval, tsecr, ws[0], 7|0x10|idx<<6)
			}
		}

		if tc == nil {
			continue
		}
		ack := cookieACK(t, s, out, l4, 777000)
		before := h.cookieCounters(t, slot)
		tcRun(t, tc, ack)
		bad := append([]byte{}, ack...)
		// Another cookie counter (the top byte): outside the cookie's age.
		// (A cookie off by one in its low bits may still pass: they carry
		// the MSS index, which the kernel checks only for range.)
		binary.BigEndian.PutUint32(bad[l4+8:], binary.BigEndian.Uint32(bad[l4+8:])+1<<24)
		bad = withTCPOptions(t, bad[:l4+20], l3, nil) // recompute checksums
		tcRun(t, tc, bad)
		got := h.cookieCounters(t, slot)
		if got.Failed-before.Failed != 1 || (got.Validated+got.AssignFailed+got.Refused)-(before.Validated+before.AssignFailed+before.Refused) != 1 {
			t.Errorf("%s: ACK check: %+v -> %+v; want the good ACK past the kernel's check and the bad one failed", c.name, before, got)
		}
	}
	_ = listener

	// Not a host address: dropped, not answered.
	now += second
	s := frame.Spec{Src: netip.MustParseAddr("198.51.100.9"), Dst: netip.MustParseAddr("203.0.113.1"),
		Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80, TCPFlags: frame.TCPSyn}
	h.model.Eval(frame.MustBuild(s), now)
	if ret, _ := h.kernelRunOut(t, frame.MustBuild(s), now, 1); ret != xdpDrop {
		t.Errorf("SYN to a foreign address: XDP return code %d, want XDP_DROP", ret)
	}
	// The budget: 100/s with a burst of 10 answers 10 SYNs at once.
	now += second
	answered := 0
	for i := range 30 {
		s := frame.Spec{Src: netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i)}), Proto: frame.ProtoTCP,
			SrcPort: 40000, DstPort: 80, TCPFlags: frame.TCPSyn}
		in := frame.MustBuild(s)
		res := h.model.Eval(in, now)
		ret, _ := h.kernelRunOut(t, in, now, 1)
		if (ret == xdpTx) != res.Cookie {
			t.Fatalf("SYN %d: kernel %d, model cookie=%v", i, ret, res.Cookie)
		}
		if ret == xdpTx {
			answered++
		}
	}
	if answered != 10 {
		t.Errorf("30 SYNs at once under a budget burst of 10: %d answered, want 10", answered)
	}
	got := h.cookieCounters(t, slot)
	xdpSide := func(c dataplane.CookieCounters) dataplane.CookieCounters {
		return dataplane.CookieCounters{Sent: c.Sent, OverBudget: c.OverBudget, NotLocal: c.NotLocal, Unanswerable: c.Unanswerable}
	}
	if got.NotLocal != 1 || got.OverBudget != 20 || xdpSide(got) != h.model.CookieCounters[slot] {
		t.Errorf("cookie counters: kernel %+v, model %+v; want 1 not local and 20 over budget", got, h.model.CookieCounters[slot])
	}
}

// TestCookieAuto: an `auto` rule passes SYNs within its rate, answers with
// cookies once they are over it and for a second after, kernel and model
// in step.
func TestCookieAuto(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 10, Burst: 2, SynCookies: "auto",
	}}}, nil))
	now := uint64(1000 * second)
	cookies, passes := 0, 0
	for i := range 400 {
		// 40 SYNs per second for 5 s, then 2 per second for 5 s.
		step := uint64(second / 40)
		if i >= 200 {
			step = second / 2
		}
		now += step
		s := frame.Spec{Src: netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), Proto: frame.ProtoTCP,
			SrcPort: 40000, DstPort: 80, TCPFlags: frame.TCPSyn}
		in := frame.MustBuild(s)
		pass, res := h.run(t, in, now)
		if res.Cookie {
			cookies++
		}
		if pass {
			passes++
		}
		if i >= 380 && !pass {
			t.Errorf("SYN %d at 2/s, long after the flood: %v, want a pass", i, res.Reason)
		}
	}
	if cookies < 150 || passes < 20 {
		t.Errorf("%d cookies and %d passes; want most of the flood answered and the calm passed", cookies, passes)
	}
}

func (h *harness) cookieCounters(tb testing.TB, slot int) dataplane.CookieCounters {
	tb.Helper()
	c, err := h.tab.CookieCounters(slot)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// tcRun runs the TC program once on frame.
func tcRun(tb testing.TB, p *CookieProgram, frame []byte) uint32 {
	tb.Helper()
	ret, err := p.Program().Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		tb.Fatalf("run the cookie program: %v", err)
	}
	return ret
}

// cookieListener listens on TCP port 80 of every address in a network
// namespace of the test's own, which the test's (locked) thread enters: the
// TC program's socket lookup under BPF_PROG_TEST_RUN searches the caller's
// namespace.
func cookieListener(tb testing.TB) []int {
	tb.Helper()
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		tb.Fatalf("unshare the network namespace: %v", err)
	}
	// The thread stays in its namespace until it exits: never unlocked,
	// Go ends it with the test's goroutine.
	var fds []int
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			tb.Fatalf("socket: %v", err)
		}
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
		fds = append(fds, fd)
	}
	tb.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	return fds
}

// TestCookieLeavesTimeWait: a SYN for a 4-tuple the host holds in
// TIME_WAIT is passed to the kernel, which recycles the socket into the
// next connection, instead of answered with a cookie: the cookie's ACK
// would meet the TIME_WAIT socket at TC, never the listener, and the
// client would retransmit its request into it until it gave up (as a
// client reusing its port within a minute did in
// TestSynCookiesThroughSpoofedFlood). The same SYN from another port is
// answered.
func TestCookieLeavesTimeWait(t *testing.T) {
	h := newHarness(t)
	spec := &dataplane.Spec{CookieRate: 100, Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 10, Burst: 3, SynCookies: "always",
	}}}
	h.apply(t, compile(t, spec, nil))
	slot := h.slot(t, "web")
	fds := cookieListener(t) // this thread's own network namespace from here on

	server, client := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.20")
	loWith(t, server, client)
	timeWait(t, fds[0], client, server, 40001)

	syn := func(port uint16) []byte {
		s := frame.Spec{Src: client, Dst: server, Proto: frame.ProtoTCP, SrcPort: port, DstPort: 80,
			TCPFlags: frame.TCPSyn, TCPSeq: 5000}
		return withTCPOptions(t, frame.MustBuild(s), 14, linuxSYNOptions(12345))
	}
	now := uint64(1000 * second)
	before := h.cookieCounters(t, slot)
	if ret, _ := h.kernelRunOut(t, syn(40001), now, 1); ret != xdpPass {
		t.Errorf("SYN for the TIME_WAIT socket's 4-tuple: XDP return code %d, want XDP_PASS", ret)
	}
	if ret, _ := h.kernelRunOut(t, syn(40002), now, 1); ret != xdpTx {
		t.Errorf("SYN from another port: XDP return code %d, want XDP_TX", ret)
	}
	got := h.cookieCounters(t, slot)
	if got.ToSocket-before.ToSocket != 1 || got.Sent-before.Sent != 1 {
		t.Errorf("cookie counters %+v -> %+v, want one SYN to the socket and one answered", before, got)
	}
}

// timeWait opens a connection from client:port to server:80 on the
// namespace's loopback (cookieListener, loWith), accepted on listener, and
// closes it from the server first: the server's end stays in TIME_WAIT.
func timeWait(tb testing.TB, listener int, client, server netip.Addr, port int) {
	tb.Helper()
	c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	defer unix.Close(c)
	if err := unix.Bind(c, &unix.SockaddrInet4{Port: port, Addr: client.As4()}); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Connect(c, &unix.SockaddrInet4{Port: 80, Addr: server.As4()}); err != nil {
		tb.Fatal(err)
	}
	a, _, err := unix.Accept(listener)
	if err != nil {
		tb.Fatal(err)
	}
	unix.Close(a)
	time.Sleep(20 * time.Millisecond) // the server's FIN, acknowledged
	unix.Close(c)
	time.Sleep(20 * time.Millisecond) // the client's FIN: the server's end in TIME_WAIT
}

// TestCookieLeavesQueuedHandshake: a SYN for a 4-tuple whose handshake
// the kernel holds in its SYN queue (a request socket: the kernel answered
// an earlier SYN and waits for the ACK) is dropped, neither answered with
// a cookie (whose ACK the request socket would refuse) nor handed to the
// kernel through the rule's bucket, and counted in its class (socket),
// not as to_socket. A spoofer that repeats the 4-tuples of the handshakes
// it opened would otherwise drain the bucket that the clients' validated
// cookies are charged to (TestSynCookiesThroughSpoofedFlood's p99); the
// kernel retransmits its SYN-ACK on its own timer. The same SYN from
// another port is answered.
func TestCookieLeavesQueuedHandshake(t *testing.T) {
	h := newHarness(t)
	spec := &dataplane.Spec{CookieRate: 100, Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 10, Burst: 3, SynCookies: "always",
	}}}
	h.apply(t, compile(t, spec, nil))
	slot := h.slot(t, "web")
	cookieListener(t) // this thread's own network namespace from here on

	// The server on the namespace's loopback; the client's address is not
	// the namespace's, but routed to lo, so that the kernel's SYN-ACK is
	// sent (a handshake without a route is not kept) and then dropped on
	// input as not its own: no RST ends the handshake.
	server, client := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.30")
	lo := loWith(t, server)
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: client.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatalf("route %s to lo: %v", client, err)
	}
	syn := func(port uint16) []byte {
		s := frame.Spec{Src: client, Dst: server, Proto: frame.ProtoTCP, SrcPort: port, DstPort: 80,
			TCPFlags: frame.TCPSyn, TCPSeq: 5000}
		return withTCPOptions(t, frame.MustBuild(s), 14, linuxSYNOptions(12345))
	}
	// The client's SYN, sent to the kernel from a raw socket: the
	// listener answers it and keeps the handshake in its SYN queue.
	raw, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(raw)
	if err := unix.Sendto(raw, syn(40001)[14:], 0, &unix.SockaddrInet4{Addr: server.As4()}); err != nil {
		t.Fatalf("send the SYN: %v", err)
	}
	time.Sleep(20 * time.Millisecond)

	now := uint64(1000 * second)
	before := h.cookieCounters(t, slot)
	beforeClass := h.answerCounters(t, slot)
	if ret, _ := h.kernelRunOut(t, syn(40001), now, 1); ret != xdpDrop {
		t.Errorf("SYN for the queued handshake's 4-tuple: XDP return code %d, want XDP_DROP", ret)
	}
	if ret, _ := h.kernelRunOut(t, syn(40002), now, 1); ret != xdpTx {
		t.Errorf("SYN from another port: XDP return code %d, want XDP_TX", ret)
	}
	got := h.cookieCounters(t, slot)
	if got.ToSocket != before.ToSocket || got.Sent-before.Sent != 1 || got.Unanswerable != before.Unanswerable {
		t.Errorf("cookie counters %+v -> %+v, want one answered and nothing to the socket or unanswerable", before, got)
	}
	if n := h.answerCounters(t, slot).Sub(beforeClass).Cookie[dataplane.AnswerSocket]; n != 1 {
		t.Errorf("class socket counted %d SYNs, want 1", n)
	}
}

// loWith brings up the loopback of the test's network namespace
// (cookieListener) with addrs as /32s on it, and returns it.
func loWith(tb testing.TB, addrs ...netip.Addr) netlink.Link {
	tb.Helper()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		tb.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		tb.Fatal(err)
	}
	for _, a := range addrs {
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			tb.Fatalf("add %s to lo: %v", a, err)
		}
	}
	return lo
}
