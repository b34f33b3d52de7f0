//go:build linux

package maps

import (
	"net/netip"
	"testing"

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
