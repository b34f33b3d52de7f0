//go:build linux

package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/corpus"
	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/tests/kit/xdppass"
)

// What the host answers, end to end (issue 26; docs/robustness.md "What
// the host answers").

// clientXDPPass attaches an XDP pass program to the client's veth: a veth
// delivers the server's XDP_TX frames (SYN cookies, resets) only then
// (xdppass.Attach).
func (e *env) clientXDPPass(t testing.TB) io.Closer {
	t.Helper()
	var c io.Closer
	if err := e.lab.Client.Do(func() error {
		var err error
		c, err = xdppass.Attach(e.lab.ClientIf)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// answer is a TCP segment the server sent back, as the client's end of
// the wire received it.
type answer struct {
	dstPort uint16
	flags   uint8
	mss     uint16 // the MSS option of a SYN-ACK, 0 when none
}

// wireCapture records every TCP segment arriving at the client's veth from
// the server's MAC (packet socket, ETH_P_ALL; tags skipped), until stop.
type wireCapture struct {
	mu      sync.Mutex
	answers []answer
	stop    func()
}

func captureAnswers(t *testing.T, e *env) *wireCapture {
	t.Helper()
	var fd int
	if err := e.lab.Client.Do(func() error {
		ifi, err := net.InterfaceByName(e.lab.ClientIf)
		if err != nil {
			return err
		}
		proto := int(uint16(unix.ETH_P_ALL)<<8 | uint16(unix.ETH_P_ALL)>>8)
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: ifi.Index})
	}); err != nil {
		t.Fatal(err)
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
	w := &wireCapture{}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		buf := make([]byte, 4096)
		for {
			select {
			case <-done:
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			if a, ok := parseAnswer(buf[:n], e.lab.ServerMAC); ok {
				w.mu.Lock()
				w.answers = append(w.answers, a)
				w.mu.Unlock()
			}
		}
	}()
	var once sync.Once
	w.stop = func() {
		once.Do(func() {
			close(done)
			<-stopped
			unix.Close(fd)
		})
	}
	t.Cleanup(w.stop)
	return w
}

func (w *wireCapture) got() []answer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]answer(nil), w.answers...)
}

// parseAnswer decodes a TCP segment of a frame from mac.
func parseAnswer(f []byte, mac net.HardwareAddr) (answer, bool) {
	if len(f) < 14 || !strings.EqualFold(net.HardwareAddr(f[6:12]).String(), mac.String()) {
		return answer{}, false
	}
	off, et := 14, binary.BigEndian.Uint16(f[12:])
	for (et == 0x8100 || et == 0x88a8) && len(f) >= off+4 {
		et, off = binary.BigEndian.Uint16(f[off+2:]), off+4
	}
	switch {
	case et == 0x0800 && len(f) >= off+20 && f[off+9] == 6:
		off += int(f[off]&0xf) * 4
	case et == 0x86dd && len(f) >= off+40 && f[off+6] == 6:
		off += 40
	default:
		return answer{}, false
	}
	if len(f) < off+20 {
		return answer{}, false
	}
	tcp := f[off:]
	a := answer{dstPort: binary.BigEndian.Uint16(tcp[2:]), flags: tcp[13]}
	hl := min(int(tcp[12]>>4)*4, len(tcp))
	for i := 20; i+1 < hl; {
		if tcp[i] == 0 {
			break
		}
		if tcp[i] == 1 {
			i++
			continue
		}
		if tcp[i] == 2 && tcp[i+1] == 4 && i+4 <= hl {
			a.mss = binary.BigEndian.Uint16(tcp[i+2:])
		}
		i += max(int(tcp[i+1]), 2)
	}
	return a, true
}

func (a answer) synAck() bool { return a.flags&0x12 == 0x12 }
func (a answer) reset() bool  { return a.flags&0x04 != 0 }

const answerPort = 8081

// TestSpoofedSYNsUnanswered: the crafted SYNs of issue 26, sent on the
// wire to a `syn_cookies: always` port of the real daemon, IPv4 and IPv6
// (corpus.AnswerCases, cookie path: broadcast and multicast source MACs, a
// foreign destination MAC, 255.255.255.255, 224.0.0.1, 0.0.0.0, 127.0.0.1
// and the other martians, the host's own address, ff02::1, SYN|RST,
// SYN|FIN, ...): no SYN-ACK and no reset reaches the client's end, while
// each SYN the policy allows (a control from the client's unicast
// address, link-local sources, SYN|PSH, ...) is answered exactly once.
// The client's veth runs an XDP program: without one the server's XDP_TX
// frames would not arrive, and the test could not fail. Before (cd7296b)
// every one of them was answered.
func TestSpoofedSYNsUnanswered(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(e.writeRules("rules.yaml", fmt.Sprintf(`rules:
  - name: web
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: 1000
    syn_cookies: always
`, answerPort)))
	e.clientXDPPass(t)
	h := corpus.AnswerHost{
		MAC: e.lab.ServerMAC, PeerMAC: e.lab.ClientMAC,
		IP4: e.lab.ServerIP4, IP6: e.lab.ServerIP6, Own4: e.lab.ServerIP4, Own6: e.lab.ServerIP6,
		Peer4: e.lab.ClientIP4, Peer6: e.lab.ClientIP6, PortBase: 42000,
	}
	w := captureAnswers(t, e)
	s, err := lab.NewSender(e.lab.Client, e.lab.ClientIf)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := map[uint16]int{} // answers expected, by the SYN's source port
	names := map[uint16]string{}
	sent := 0
	for _, c := range corpus.AnswerCases(h) {
		if c.Path != corpus.PathCookie || c.Ret == corpus.XDPPass || len(c.Pre) > 0 {
			continue // what the kernel answers itself, or a budget's case
		}
		f := append([]byte(nil), c.Frame...)
		setDstPort(f, answerPort)
		if err := s.Send(f); err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		sent++
		names[c.SrcPort] = c.Name
		if c.Ret == corpus.XDPTx {
			want[c.SrcPort] = 1
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second)
	w.stop()
	got := map[uint16]int{}
	for _, a := range w.got() {
		if a.synAck() || a.reset() {
			got[a.dstPort]++
		}
	}
	t.Logf("e2e answers: %d crafted SYNs sent, %d answers on the wire, %d expected", sent, sum(got), sum(want))
	for port, name := range names {
		if got[port] != want[port] {
			t.Errorf("%s: %d SYN-ACKs/resets on the wire, want %d", name, got[port], want[port])
		}
	}
	for port, n := range got {
		if names[port] == "" {
			t.Errorf("%d answers to port %d, which no crafted SYN came from", n, port)
		}
	}
}

func sum(m map[uint16]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// setDstPort rewrites the TCP destination port of a corpus SYN (tags,
// IPv4 options and IPv6 extension headers skipped; checksum fixed up).
func setDstPort(f []byte, port uint16) {
	off, et := 14, binary.BigEndian.Uint16(f[12:])
	for et == 0x8100 || et == 0x88a8 {
		et, off = binary.BigEndian.Uint16(f[off+2:]), off+4
	}
	if et == 0x0800 {
		off += int(f[off]&0xf) * 4
	} else {
		nh, p := f[off+6], off+40
		for nh == 0 || nh == 43 || nh == 60 {
			nh, p = f[p], p+(int(f[p+1])+1)*8
		}
		off = p
	}
	old := binary.BigEndian.Uint16(f[off+2:])
	binary.BigEndian.PutUint16(f[off+2:], port)
	// RFC 1624: HC' = ~(~HC + ~m + m').
	sum := uint32(^binary.BigEndian.Uint16(f[off+16:])) + uint32(^old) + uint32(port)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(f[off+16:], ^uint16(sum))
}

// setMTU sets the MTU of a veth end inside its namespace.
func setMTU(t *testing.T, ns *lab.NS, ifname string, mtu int) {
	t.Helper()
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(l, mtu)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestCookieMSSFollowsMTU: the MSS that a cookie SYN-ACK announces is the
// server interface's MTU less 40 (IPv4) and 60 (IPv6), read at attach and
// followed when the MTU changes while the daemon runs: a client on an MTU
// of 1500 facing a 1460-byte server link is told 1420 (1400), and after
// the server's MTU drops to 1400, 1360 (1340), within the daemon's
// reaction to the link event. Before (cd7296b) every SYN-ACK said 1460
// (1440): the client sent segments the server's link cannot carry.
func TestCookieMSSFollowsMTU(t *testing.T) {
	e := newEnv(t)
	setMTU(t, e.lab.Server, e.lab.ServerIf, 1460)
	e.startDaemon(e.writeRules("rules.yaml", fmt.Sprintf(`rules:
  - name: web
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: 1000
    syn_cookies: always
`, answerPort)))
	e.clientXDPPass(t)
	w := captureAnswers(t, e)
	var listeners []io.Closer
	if err := e.lab.Server.Do(func() error {
		for _, a := range []netip.Addr{e.lab.ServerIP4, e.lab.ServerIP6} {
			// A plain TCP listener: Go's default is MPTCP where the kernel
			// has it, and bpf_sk_assign_tcp_reqsk refuses MPTCP listeners
			// (docs/dataplane.md, "SYN cookies").
			var lc net.ListenConfig
			lc.SetMultipathTCP(false)
			l, err := lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(a, answerPort).String())
			if err != nil {
				return err
			}
			listeners = append(listeners, l)
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	// The MSS of the SYN-ACK answering a connection from the client.
	synAckMSS := func(dst netip.Addr) uint16 {
		t.Helper()
		var port uint16
		if err := e.lab.Client.Do(func() error {
			d := net.Dialer{Timeout: 3 * time.Second}
			c, err := d.Dial("tcp", netip.AddrPortFrom(dst, answerPort).String())
			if err != nil {
				return err
			}
			port = uint16(c.LocalAddr().(*net.TCPAddr).Port)
			return c.Close()
		}); err != nil {
			out, _ := e.xlimit("status", "--iface", e.lab.ServerIf)
			t.Fatalf("connect to %s: %v\n%s", dst, err, out)
		}
		for range 50 {
			for _, a := range w.got() {
				if a.dstPort == port && a.synAck() {
					return a.mss
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no SYN-ACK to port %d captured", port)
		return 0
	}
	if m4, m6 := synAckMSS(e.lab.ServerIP4), synAckMSS(e.lab.ServerIP6); m4 != 1420 || m6 != 1400 {
		t.Errorf("server MTU 1460: SYN-ACKs announce MSS %d (IPv4) and %d (IPv6), want 1420 and 1400", m4, m6)
	}
	setMTU(t, e.lab.Server, e.lab.ServerIf, 1400)
	start := time.Now()
	var m4, m6 uint16
	for time.Since(start) < 5*time.Second {
		if m4, m6 = synAckMSS(e.lab.ServerIP4), synAckMSS(e.lab.ServerIP6); m4 == 1360 && m6 == 1340 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("e2e mss: MTU 1460 -> 1400: SYN-ACKs announce %d/%d after %v", m4, m6, time.Since(start).Round(time.Millisecond))
	if m4 != 1360 || m6 != 1340 {
		t.Errorf("server MTU 1400: SYN-ACKs announce MSS %d (IPv4) and %d (IPv6) after 5 s, want 1360 and 1340", m4, m6)
	}
}

// TestVethPeerWarning: `xlimit check` and `xlimit run` warn when a rule
// answers from XDP (syn_cookies, refuse: reset) on a veth whose peer runs
// no XDP program, where those answers do not arrive; not once the peer
// runs one, nor for rules that answer nothing. Before (cd7296b) nothing
// warned.
func TestVethPeerWarning(t *testing.T) {
	e := newEnv(t)
	rules := func(extra string) string {
		return e.writeRules("rules.yaml", fmt.Sprintf(`interfaces: [%s]
rules:
  - name: web
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: 1000%s
`, e.lab.ServerIf, answerPort, extra))
	}
	check := func(file string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := e.lab.Server.Command(ctx, xlimitBin, "check", file).CombinedOutput()
		if err != nil {
			t.Fatalf("xlimit check: %v: %s", err, out)
		}
		return string(out)
	}
	const warning = "runs no XDP program"
	for _, c := range []struct {
		name, extra string
		warn        bool
	}{
		{"syn_cookies", "\n    syn_cookies: always", true},
		{"refuse: reset", "\n    refuse: reset", true},
		{"no answers", "", false},
	} {
		out := check(rules(c.extra))
		t.Logf("xlimit check, %s, peer without XDP: %s", c.name, strings.TrimSpace(out))
		if strings.Contains(out, warning) != c.warn {
			t.Errorf("xlimit check, %s, peer without XDP: output %q, want a warning: %v", c.name, out, c.warn)
		}
	}
	d := e.startDaemon(rules("\n    syn_cookies: always"))
	d.waitLog(warning, 5*time.Second)
	if err := d.signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	e.clientXDPPass(t)
	if out := check(rules("\n    syn_cookies: always")); strings.Contains(out, warning) {
		t.Errorf("xlimit check with an XDP program on the peer: %q, want no warning", out)
	}
}
