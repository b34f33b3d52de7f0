//go:build linux

package maps

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Requests in flight (bpf/request.h) on crafted frames with the fake
// clock: a request is in flight from its first byte (XDP) to its
// response's first byte (TC egress); an idle keep-alive connection is
// not; a FIN or a RST of either side counts a request in flight out.

func (h *respHarness) requests(t *testing.T, slot int) dataplane.Requests {
	t.Helper()
	r, err := h.tab.Requests(slot)
	if err != nil {
		t.Fatalf("read requests in flight: %v", err)
	}
	return r
}

func TestRequestsInFlight(t *testing.T) {
	h := newRespHarness(t,
		dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1e6, Burst: 1e6, ResponseTime: true})
	slot := h.slot(t, "web")
	now := uint64(1000 * second)
	step := func() uint64 { now += 1_000_000; return now }
	pass := func(f []byte) {
		t.Helper()
		if ok, _ := h.run(t, f, step()); !ok {
			t.Fatalf("frame dropped at %d", now)
		}
	}
	want := func(n int64, what string) {
		t.Helper()
		if got := h.requests(t, slot).InFlight; got != n {
			t.Errorf("%s: %d requests in flight, want %d", what, got, n)
		}
	}
	client := func(i int) exchange {
		return exchange{netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), netip.MustParseAddr("10.9.0.1"), uint16(40000 + i), 80}
	}
	a, b, c := client(1), client(2), client(3)
	v6 := exchange{netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("2001:db8::80"), 40004, 80}

	want(0, "before any frame")
	// Handshakes carry no request.
	for _, x := range []exchange{a, b, c, v6} {
		pass(x.request(synFlags, 0))
		h.egress(t, x.response(synAckFlags, 0), step())
		pass(x.request(ackFlags, 0))
	}
	want(0, "after four handshakes")

	// Four requests; a's comes in two segments (one request).
	for _, x := range []exchange{a, b, c, v6} {
		pass(x.request(ackFlags|tcpPsh, 300))
	}
	pass(a.request(ackFlags|tcpPsh, 200))
	want(4, "four requests, one in two segments")

	// The server's pure ACK answers nothing; a's first response byte
	// answers a's request, the rest of the response nothing more.
	h.egress(t, a.response(ackFlags, 0), step())
	want(4, "after a pure ACK")
	h.egress(t, a.response(ackFlags|tcpPsh, 1000), step())
	h.egress(t, a.response(ackFlags|tcpPsh, 1000), step())
	want(3, "a answered")
	h.egress(t, v6.response(ackFlags|tcpPsh, 100), step())
	want(2, "a and the IPv6 client answered")

	// a is now an idle keep-alive connection: not in flight. Its next
	// request is.
	pass(a.request(ackFlags, 0))
	want(2, "a's ACK on its idle connection")
	pass(a.request(ackFlags|tcpPsh, 100))
	want(3, "a's next request on its kept-alive connection")

	// b's client resets with its request unanswered; c's server closes
	// with a FIN and the RST that follows counts nothing more.
	pass(b.request(tcpRst, 0))
	want(2, "b's client reset")
	h.egress(t, c.response(ackFlags|tcpFin, 0), step())
	h.egress(t, c.response(tcpRst, 0), step())
	want(1, "c's server closed")
	// An idle connection's FIN counts nothing out.
	pass(v6.request(ackFlags|tcpFin, 0))
	want(1, "the idle IPv6 connection closed")
	h.egress(t, a.response(ackFlags|tcpPsh, 100), step())
	want(0, "every request answered or forgotten")
	if r := h.requests(t, slot); r.Refused != 0 {
		t.Errorf("refused %d requests without a cap", r.Refused)
	}
}

// requestRunner runs the TC ingress program of the request refusal on a
// thread of its own in a new network namespace, whose loopback is up and
// captured: the reset that the program clones out of the test run's
// device (the namespace's loopback) is read back there, and nothing
// leaves the namespace.
type requestRunner struct {
	prog *RespProgram
	jobs chan requestJob
}

type requestJob struct {
	frame []byte
	reply chan requestResult
}

type requestResult struct {
	ret    int32
	out    []byte // the frame as the program left it
	cloned []byte // what the program sent out of the loopback, nil if nothing
	err    error
}

func newRequestRunner(t *testing.T, h *respHarness) *requestRunner {
	t.Helper()
	prog, err := h.obj.LoadRequestProgram(true)
	if err != nil {
		t.Fatalf("load the request refusal: %v", err)
	}
	r := &requestRunner{prog: prog, jobs: make(chan requestJob)}
	ready := make(chan error)
	go r.loop(ready)
	if err := <-ready; err != nil {
		prog.Close()
		t.Fatalf("namespace of the request refusal: %v", err)
	}
	t.Cleanup(func() { close(r.jobs); prog.Close() })
	return r
}

// loop serves jobs on a locked thread in a new namespace; the thread is
// never unlocked, so it exits with the goroutine and the namespace with it.
func (r *requestRunner) loop(ready chan<- error) {
	runtime.LockOSThread()
	fd, err := func() (int, error) {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return -1, fmt.Errorf("unshare: %w", err)
		}
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		defer unix.Close(s)
		ifr, err := unix.NewIfreq("lo")
		if err != nil {
			return -1, err
		}
		ifr.SetUint16(unix.IFF_UP | unix.IFF_LOOPBACK | unix.IFF_RUNNING)
		if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
			return -1, fmt.Errorf("set lo up: %w", err)
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return -1, fmt.Errorf("packet socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: 1}); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("bind to lo: %w", err)
		}
		tv := unix.NsecToTimeval(int64(200 * time.Millisecond))
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return -1, err
		}
		return fd, nil
	}()
	ready <- err
	if err != nil {
		return
	}
	defer unix.Close(fd)
	for j := range r.jobs {
		out := make([]byte, len(j.frame)+64)
		opts := &ebpf.RunOptions{Data: j.frame, DataOut: out}
		ret, err := r.prog.Program().Run(opts)
		res := requestResult{ret: int32(ret), out: opts.DataOut, err: err}
		// The clone, if any: the frame the run sent out of lo. The
		// loopback shows each frame outgoing, then incoming: incoming
		// copies (of an earlier run's clone) are skipped.
		buf := make([]byte, 2048)
		for {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				break // the timeout: nothing was sent
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				res.cloned = append([]byte(nil), buf[:n]...)
				break
			}
		}
		j.reply <- res
	}
}

func (r *requestRunner) run(t *testing.T, f []byte) requestResult {
	t.Helper()
	reply := make(chan requestResult)
	r.jobs <- requestJob{frame: f, reply: reply}
	res := <-reply
	if res.err != nil {
		t.Fatalf("run the request refusal: %v", res.err)
	}
	return res
}

func htons(v uint16) uint16 { return v>>8 | v<<8 }

// seg is a segment of x's client with sequence numbers.
func (x exchange) seg(flags uint8, seq, ack uint32, payload int) []byte {
	return frame.MustBuild(frame.Spec{Src: x.client, Dst: x.server, Proto: frame.ProtoTCP,
		SrcPort: x.cport, DstPort: x.sport, TCPFlags: flags, TCPSeq: seq, TCPAck: ack, PayloadLen: payload})
}

// resets are the two resets that refuse x's request at (seq, ack): to
// the service (the frame passed on) and to the client (the clone).
func (x exchange) resets(seq, ack uint32) (toService, toClient []byte) {
	client, host := net.HardwareAddr{2, 0, 0, 0, 0, 1}, net.HardwareAddr{2, 0, 0, 0, 0, 2}
	toService = frame.MustBuild(frame.Spec{SrcMAC: client, DstMAC: host, Src: x.client, Dst: x.server,
		Proto: frame.ProtoTCP, SrcPort: x.cport, DstPort: x.sport, TCPFlags: tcpRst | ackFlags,
		TCPSeq: seq, TCPAck: ack, IPv4ID: 0x1234, Literal: true})
	toClient = frame.MustBuild(frame.Spec{SrcMAC: host, DstMAC: client, Src: x.server, Dst: x.client,
		Proto: frame.ProtoTCP, SrcPort: x.sport, DstPort: x.cport, TCPFlags: tcpRst,
		TCPSeq: ack, IPv4ID: 0x1234, Literal: true})
	return toService, toClient
}

// The cap on requests in flight (xl_limit.req_cap): a new request over it,
// on a new or a kept-alive connection, is marked by the XDP program (which
// passes it, as the model does) and reset both ways by the TC ingress
// program: a reset out to the client at its next expected byte, the
// segment itself turned into a reset to the service at the request's own
// byte. A request under the cap, more of a request, or the cap of a stale
// or another rule's limit, refuses nothing.
func TestRequestRefusal(t *testing.T) {
	h := newRespHarness(t,
		dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1e6, Burst: 1e6, ResponseTime: true})
	slot := h.slot(t, "web")
	epoch := h.plan.Rules[slot].Epoch
	tc := newRequestRunner(t, h)
	now := uint64(1000 * second)
	b, err := dataplane.NewBucket(1e6, 1e6, false)
	if err != nil {
		t.Fatal(err)
	}
	h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: now + 1000*second, Epoch: epoch, ReqCap: 2})
	step := func() uint64 { now += 1_000_000; return now }
	pass := func(f []byte) {
		t.Helper()
		if ok, _ := h.run(t, f, step()); !ok {
			t.Fatalf("frame dropped at %d", now)
		}
	}
	// untouched: the TC program lets f through as it is and sends nothing.
	untouched := func(f []byte, what string) {
		t.Helper()
		r := tc.run(t, f)
		if r.ret != -1 || !bytes.Equal(r.out, f) || r.cloned != nil {
			t.Errorf("%s: returned %d, frame changed %v, sent %d bytes; want -1, unchanged, nothing",
				what, r.ret, !bytes.Equal(r.out, f), len(r.cloned))
		}
	}
	refused := func(f []byte, x exchange, seq, ack uint32, what string) {
		t.Helper()
		r := tc.run(t, f)
		toService, toClient := x.resets(seq, ack)
		if r.ret != -1 {
			t.Errorf("%s: returned %d, want -1 (next)", what, r.ret)
		}
		if !bytes.Equal(r.out, toService) {
			t.Errorf("%s: the frame passed on is\n%x\nwant the reset to the service\n%x", what, r.out, toService)
		}
		if !bytes.Equal(r.cloned, toClient) {
			t.Errorf("%s: sent\n%x\nwant the reset to the client\n%x", what, r.cloned, toClient)
		}
	}
	want := func(n int64, refusedN uint64, what string) {
		t.Helper()
		if r := h.requests(t, slot); r.InFlight != n || r.Refused != refusedN {
			t.Errorf("%s: %d in flight, %d refused; want %d, %d", what, r.InFlight, r.Refused, n, refusedN)
		}
	}
	client := func(i int) exchange {
		return exchange{netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), netip.MustParseAddr("10.9.0.1"), uint16(40000 + i), 80}
	}
	a, c, d := client(1), client(3), client(4)
	v6 := exchange{netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("2001:db8::80"), 40005, 80}
	for _, x := range []exchange{a, c, d, v6} {
		pass(x.request(synFlags, 0))
		pass(x.request(ackFlags, 0))
	}

	// a's first request, and a second from c: two in flight, at the cap.
	pass(a.seg(ackFlags|tcpPsh, 1000, 5000, 100))
	untouched(a.seg(ackFlags|tcpPsh, 1000, 5000, 100), "a request under the cap")
	pass(c.seg(ackFlags|tcpPsh, 1000, 5000, 100))
	want(2, 0, "two requests")
	// More of a's request is no new request.
	pass(a.seg(ackFlags|tcpPsh, 1100, 5000, 100))
	want(2, 0, "more of a request at the cap")

	// a is answered and keeps its connection; d's first request takes the
	// free place; a's next request, on its kept-alive connection, is over
	// the cap and refused.
	h.egress(t, a.response(ackFlags|tcpPsh, 500), step())
	pass(d.seg(ackFlags|tcpPsh, 1000, 5000, 100))
	want(2, 0, "a answered, d's request")
	next := a.seg(ackFlags|tcpPsh, 1200, 5500, 300)
	pass(next)
	want(2, 1, "a's kept-alive request over the cap")
	refused(next, a, 1200, 5500, "a's kept-alive request")
	// Its flow is refused once: a stray segment after the resets passes
	// (the stack answers it) and is not counted as a request.
	stray := a.seg(ackFlags|tcpPsh, 1500, 5500, 100)
	pass(stray)
	untouched(stray, "a segment after the refusal")
	want(2, 1, "a segment after the refusal")

	// IPv6: a first request over the cap.
	req6 := v6.seg(ackFlags|tcpPsh, 7000, 9000, 50)
	pass(req6)
	want(2, 2, "the IPv6 client's request over the cap")
	refused(req6, v6, 7000, 9000, "the IPv6 client's request")

	// A stale limit (past its deadline) caps nothing; nor does a limit of
	// another rule (epoch).
	for _, l := range []dataplane.Limit{
		{Bucket: b, DeadlineNS: now, Epoch: epoch, ReqCap: 2},
		{Bucket: b, DeadlineNS: now + 1000*second, Epoch: epoch + 1, ReqCap: 2},
	} {
		h.setLimit(t, slot, l)
		e := client(10 + int(l.Epoch-epoch))
		pass(e.request(synFlags, 0))
		f := e.seg(ackFlags|tcpPsh, 1000, 5000, 10)
		pass(f)
		untouched(f, "a request under a stale or foreign cap")
	}
	want(4, 2, "two requests under no cap in force")
}

// TestRequestsEvicted turns the response-flow LRU (xl_resp_flows) over
// with stamped flows in it: the evicted flows were never counted down, so
// the kernel's count stays high until the reconciliation (the daemon's,
// every few seconds) sets it to the stamped flows the LRU still holds.
func TestRequestsEvicted(t *testing.T) {
	h := newRespHarness(t,
		dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1e6, Burst: 1e6, ResponseTime: true})
	slot := h.slot(t, "web")
	now := uint64(1000 * second)
	step := func() uint64 { now += 1_000_000; return now }
	pass := func(f []byte) {
		t.Helper()
		if ok, _ := h.run(t, f, step()); !ok {
			t.Fatalf("frame dropped at %d", now)
		}
	}
	const stamped = 64
	for i := range stamped {
		x := exchange{netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}), netip.MustParseAddr("10.9.0.1"), uint16(40000 + i), 80}
		pass(x.request(synFlags, 0))
		h.egress(t, x.response(synAckFlags, 0), step())
		pass(x.request(ackFlags, 0))
		pass(x.request(ackFlags|tcpPsh, 300)) // half a request: never answered
	}
	if got := h.requests(t, slot).InFlight; got != stamped {
		t.Fatalf("%d requests in flight before the eviction, want %d", got, stamped)
	}

	// Turn the LRU over as an attacker would: twice as many new
	// connections as it holds, each with half a request sent (stamped,
	// never answered), through the XDP program.
	const fill = 2 * 65536
	for j := range fill {
		x := exchange{netip.AddrFrom4([4]byte{198, byte(j >> 16), byte(j >> 8), byte(j)}), netip.MustParseAddr("10.9.0.1"), 1234, 80}
		if ret, _ := h.kernelRunOut(t, x.request(ackFlags|tcpPsh, 100), step(), 1); ret != xdpPass {
			t.Fatalf("attacker's request %d: XDP returned %d", j, ret)
		}
	}
	left := stampedFlows(t, h, slot)
	raw := h.requests(t, slot).InFlight
	t.Logf("after the eviction: %d stamped flows left of %d stamped, the kernel counts %d in flight", left, stamped+fill, raw)
	if left >= stamped+fill {
		t.Fatalf("the LRU evicted no stamped flow (%d of %d left)", left, stamped+fill)
	}

	if _, err := h.tab.ReconcileRequests(); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if got := h.requests(t, slot).InFlight; got != left {
		t.Errorf("after the reconciliation: %d requests in flight, want %d (the stamped flows left)", got, left)
	}
	// And once more, with nothing to correct: the count stays.
	if _, err := h.tab.ReconcileRequests(); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if got := h.requests(t, slot).InFlight; got != left {
		t.Errorf("after a second reconciliation: %d requests in flight, want %d", got, left)
	}
}

// stampedFlows counts slot's flows with a request waiting.
func stampedFlows(t *testing.T, h *respHarness, slot int) int64 {
	t.Helper()
	p, err := h.tab.PendingRequests()
	if err != nil {
		t.Fatalf("read pending requests: %v", err)
	}
	var n int64
	for _, r := range p {
		if r.StampNS != 0 && r.Slot == slot {
			n++
		}
	}
	return n
}
