//go:build linux

package maps

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The response time (resptime.h) on crafted frames with the fake clock:
// the XDP program stamps a flow's first unanswered request byte, the TC
// egress program (resptime_tc.c) times the first byte of the response
// into the rule's histogram.

const (
	tcpFin = 0x01
	tcpRst = 0x04
	tcpPsh = 0x08
)

// respHarness is a harness with the TC egress program loaded over its maps.
type respHarness struct {
	*harness
	tc *RespProgram
}

func newRespHarness(t *testing.T, rules ...dataplane.RuleSpec) *respHarness {
	t.Helper()
	h := newHarness(t)
	tc, err := h.obj.LoadRespProgram(true)
	if err != nil {
		t.Fatalf("load the response timer: %v", err)
	}
	t.Cleanup(func() { tc.Close() })
	h.apply(t, compile(t, &dataplane.Spec{Rules: rules}, nil))
	return &respHarness{harness: h, tc: tc}
}

// egress runs a frame through the TC program at time now; it must let
// the next program run (TCX_NEXT, -1) and leave the frame as it was.
func (h *respHarness) egress(t *testing.T, f []byte, now uint64) {
	t.Helper()
	h.onThread(t)
	h.setClock(t, now)
	out := make([]byte, len(f)+64)
	opts := &ebpf.RunOptions{Data: f, DataOut: out}
	ret, err := h.tc.Program().Run(opts)
	if err != nil {
		t.Fatalf("run egress: %v", err)
	}
	if int32(ret) != -1 {
		t.Fatalf("egress returned %d, want -1 (next)", int32(ret))
	}
	if !bytes.Equal(opts.DataOut, f) {
		t.Fatalf("egress changed the frame")
	}
}

func (h *respHarness) hist(t *testing.T, slot int) dataplane.RespHist {
	t.Helper()
	r, err := h.tab.ResponseTimes(slot)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (h *respHarness) pending(t *testing.T) map[Flow]PendingRequest {
	t.Helper()
	p, err := h.tab.PendingRequests()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// exchange is a client and a server of one TCP flow.
type exchange struct {
	client, server netip.Addr
	cport, sport   uint16
}

func (x exchange) request(flags uint8, payload int) []byte {
	return frame.MustBuild(frame.Spec{Src: x.client, Dst: x.server, Proto: frame.ProtoTCP,
		SrcPort: x.cport, DstPort: x.sport, TCPFlags: flags, PayloadLen: payload})
}

func (x exchange) response(flags uint8, payload int) []byte {
	return frame.MustBuild(frame.Spec{SrcMAC: []byte{2, 0, 0, 0, 0, 2}, DstMAC: []byte{2, 0, 0, 0, 0, 1},
		Src: x.server, Dst: x.client, Proto: frame.ProtoTCP,
		SrcPort: x.sport, DstPort: x.cport, TCPFlags: flags, PayloadLen: payload})
}

func (x exchange) flow() Flow {
	f := Flow{Family: 4, SrcPort: x.cport, DstPort: x.sport}
	if x.client.Is6() {
		f.Family = 6
		f.Src, f.Dst = x.client.As16(), x.server.As16()
	} else {
		c, s := x.client.As4(), x.server.As4()
		copy(f.Src[:], c[:])
		copy(f.Dst[:], s[:])
	}
	return f
}

func TestResponseTime(t *testing.T) {
	h := newRespHarness(t,
		dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1e6, Burst: 1e6, ResponseTime: true},
		dataplane.RuleSpec{Name: "other", Protocol: "tcp", Ports: ports(81, 81), Rate: 1e6, Burst: 1e6})
	slot := h.slot(t, "web")
	for _, x := range []exchange{
		{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("10.9.0.1"), 40000, 80},
		{netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("2001:db8::80"), 40001, 80},
	} {
		t.Run(x.client.String(), func(t *testing.T) {
			h.enter(t)
			now := uint64(1000 * second)
			before := h.hist(t, slot)
			pass := func(f []byte, at uint64) {
				t.Helper()
				if ok, _ := h.run(t, f, at); !ok {
					t.Fatalf("frame dropped at %d", at)
				}
			}
			stamp := func() (uint64, bool) {
				p, ok := h.pending(t)[x.flow()]
				return p.StampNS, ok
			}

			// The handshake stamps nothing: the SYN and the ACK carry
			// no request.
			pass(x.request(synFlags, 0), now)
			h.egress(t, x.response(synAckFlags, 0), now+10_000)
			pass(x.request(ackFlags, 0), now+20_000)
			// A padded short frame (Ethernet's 60-byte minimum) is no data.
			pass(append(x.request(ackFlags, 0), make([]byte, 6)...), now+21_000)
			if s, ok := stamp(); ok {
				t.Fatalf("stamped %d before any request byte", s)
			}

			// A request in two segments: stamped at its first byte.
			t0 := now + 1_000_000
			pass(x.request(ackFlags|tcpPsh, 300), t0)
			pass(x.request(ackFlags|tcpPsh, 200), t0+500_000)
			if s, ok := stamp(); !ok || s != t0 {
				t.Fatalf("stamp %d (present %v), want %d", s, ok, t0)
			}
			// The server's pure ACK answers nothing; its first data byte,
			// 3 ms after the request's, answers the request; the rest of
			// the response counts nothing more.
			h.egress(t, x.response(ackFlags, 0), t0+1_000_000)
			h.egress(t, x.response(ackFlags|tcpPsh, 1000), t0+3_000_000)
			h.egress(t, x.response(ackFlags|tcpPsh, 1000), t0+3_500_000)
			if s, _ := stamp(); s != 0 {
				t.Fatalf("stamp %d after the response, want 0", s)
			}

			// Keep-alive: the next request on the flow, answered in 40 ms.
			t1 := t0 + 100_000_000
			pass(x.request(ackFlags|tcpPsh, 100), t1)
			h.egress(t, x.response(ackFlags|tcpPsh, 100), t1+40_000_000)

			d, ok := h.hist(t, slot).Sub(before)
			if !ok {
				t.Fatal("histogram went down")
			}
			want := dataplane.RespHist{Stamps: 2, Count: 2, SumNS: 43_000_000}
			want.Buckets[dataplane.RespBucket(3_000_000)]++
			want.Buckets[dataplane.RespBucket(40_000_000)]++
			if d != want {
				t.Errorf("histogram increase: stamps %d count %d sum %d, want %d %d %d; buckets equal: %v",
					d.Stamps, d.Count, d.SumNS, want.Stamps, want.Count, want.SumNS, d.Buckets == want.Buckets)
			}
			if m := d.Mean(); m != 21_500*time.Microsecond {
				t.Errorf("mean %v, want 21.5ms", m)
			}

			// The client's FIN forgets the flow; a request after it (a
			// stray retransmission) stamps anew and the server's RST
			// forgets it again.
			pass(x.request(ackFlags|tcpFin, 0), t1+50_000_000)
			if _, ok := stamp(); ok {
				t.Error("the flow is still followed after the client's FIN")
			}
			pass(x.request(ackFlags|tcpPsh, 10), t1+60_000_000)
			h.egress(t, x.response(tcpRst, 0), t1+61_000_000)
			if _, ok := stamp(); ok {
				t.Error("the flow is still followed after the server's RST")
			}
			if d, _ := h.hist(t, slot).Sub(before); d.Count != 2 {
				t.Errorf("a reset timed as a response: count %d, want 2", d.Count)
			}
		})
	}

	// A rule without response_time stamps nothing.
	x := exchange{netip.MustParseAddr("192.0.2.8"), netip.MustParseAddr("10.9.0.1"), 40002, 81}
	h.run(t, x.request(ackFlags|tcpPsh, 100), 2000*second)
	if p := h.pending(t); len(p) != 0 {
		t.Errorf("a rule without response_time stamped: %v", p)
	}
}

// No rule with response_time: neither program touches the flows.
func TestResponseTimeOff(t *testing.T) {
	h := newRespHarness(t, dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: ports(80, 80), Rate: 1e6, Burst: 1e6})
	x := exchange{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("10.9.0.1"), 40000, 80}
	h.run(t, x.request(ackFlags|tcpPsh, 100), 1000*second)
	h.egress(t, x.response(ackFlags|tcpPsh, 100), 1001*second)
	if p := h.pending(t); len(p) != 0 {
		t.Errorf("stamped without a response_time rule: %v", p)
	}
	if r := h.hist(t, h.slot(t, "web")); r.Count != 0 || r.Stamps != 0 {
		t.Errorf("timed without a response_time rule: %+v", r)
	}
}

// The buckets of the histogram, Go against the kernel's: every bucket's
// lower bound and the time just below it fall on both sides of the edge.
func TestResponseBuckets(t *testing.T) {
	h := newRespHarness(t, dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: ports(80, 80), Rate: 1e9, Burst: 1e9, ResponseTime: true})
	slot := h.slot(t, "web")
	x := exchange{netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("10.9.0.1"), 40000, 80}
	now := uint64(1000 * second)
	var want dataplane.RespHist
	for b := 1; b < dataplane.RespBuckets; b += 7 {
		for _, ns := range []uint64{uint64(dataplane.RespBucketLow(b)), uint64(dataplane.RespBucketLow(b)) - 1} {
			if got := dataplane.RespBucket(ns); got != b && got != b-1 {
				t.Fatalf("RespBucket(%d) = %d, want %d or %d", ns, got, b, b-1)
			}
			h.run(t, x.request(ackFlags|tcpPsh, 10), now)
			h.egress(t, x.response(ackFlags|tcpPsh, 10), now+ns)
			want.Buckets[dataplane.RespBucket(ns)]++
			now += ns + second
		}
	}
	if got := h.hist(t, slot); got.Buckets != want.Buckets {
		for i := range got.Buckets {
			if got.Buckets[i] != want.Buckets[i] {
				t.Errorf("bucket %d (from %v): kernel %d, Go %d", i, dataplane.RespBucketLow(i), got.Buckets[i], want.Buckets[i])
			}
		}
	}
}

// refuse: reset answers the SYNs over the rule's rate with the reset of
// reset.h, within the rule's reset budget and the host's, and only for
// the host's own addresses; refuse: drop (the default) answers none. The
// model decides the same (h.run compares every verdict and reset).
func TestRefuseReset(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{ResetRate: 0.001, ResetBurst: 4, Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 1, Burst: 2, Refuse: dataplane.RefuseReset},
		{Name: "quiet", Protocol: "tcp", Ports: ports(81, 81), SynOnly: true, Rate: 1, Burst: 2},
	}}, nil))
	web, quiet := h.slot(t, "web"), h.slot(t, "quiet")
	now := uint64(1000 * second)
	syn := func(dport uint16, dst string) []byte {
		s := tcpSpec(synFlags, "192.0.2.50")
		s.DstPort, s.Dst, s.TCPSeq = dport, netip.MustParseAddr(dst), 7777
		return frame.MustBuild(s)
	}
	outcomes := func(slot int) [dataplane.ResetMax]uint64 { return h.slotCounters(t, slot).Resets }

	// Two SYNs pass (the burst), the next two are answered with a reset
	// (the rule's reset budget, at the rule's rate and burst), the fifth
	// is dropped unanswered.
	var got []bool
	for range 5 {
		_, res := h.run(t, syn(80, "10.9.0.1"), now)
		got = append(got, res.Reset)
	}
	if want := []bool{false, false, true, true, false}; !equalBools(got, want) {
		t.Errorf("resets of 5 SYNs at once: %v, want %v", got, want)
	}
	if o := outcomes(web); o[dataplane.ResetSent] != 2 || o[dataplane.ResetRuleBudget] != 1 {
		t.Errorf("web's reset outcomes %v, want 2 sent, 1 over the rule's budget", o)
	}
	// The reset's fields: ports swapped, sequence 0, acknowledging the SYN.
	now += 10 * second
	for range 2 {
		h.run(t, syn(80, "10.9.0.1"), now)
	}
	ret, out := h.kernelRunOut(t, syn(80, "10.9.0.1"), now, 1)
	h.model.Eval(syn(80, "10.9.0.1"), now)
	if ret != xdpTx {
		t.Fatalf("refused SYN: XDP return code %d, want XDP_TX", ret)
	}
	tcp := out[14+20:]
	if binary.BigEndian.Uint16(tcp[0:]) != 80 || binary.BigEndian.Uint16(tcp[2:]) != 40000 ||
		binary.BigEndian.Uint32(tcp[4:]) != 0 || binary.BigEndian.Uint32(tcp[8:]) != 7778 || tcp[13] != 0x14 {
		t.Errorf("reset's TCP header %x: want ports 80 → 40000, seq 0, ack 7778, RST|ACK", tcp[:20])
	}

	// The host's budget (4 at once, one per 1000 s) holds across time:
	// 3 resets so far, 1 left.
	now += 10 * second
	for range 2 {
		h.run(t, syn(80, "10.9.0.1"), now)
	}
	_, r1 := h.run(t, syn(80, "10.9.0.1"), now)
	_, r2 := h.run(t, syn(80, "10.9.0.1"), now)
	if !r1.Reset || r2.Reset {
		t.Errorf("the host's last reset: %v then %v, want one reset then none", r1.Reset, r2.Reset)
	}
	if o := outcomes(web); o[dataplane.ResetGlobalBudget] != 1 {
		t.Errorf("web's reset outcomes %v, want 1 over the host's budget", o)
	}

	// Not to one of the host's addresses: never answered.
	now += 100 * second
	for range 2 {
		h.run(t, syn(80, "10.9.0.99"), now)
	}
	if _, res := h.run(t, syn(80, "10.9.0.99"), now); res.Reset {
		t.Error("a SYN to another host's address was answered")
	}
	if o := outcomes(web); o[dataplane.ResetNotLocal] != 1 {
		t.Errorf("web's reset outcomes %v, want 1 not local", o)
	}

	// refuse: drop (the default): dropped, never answered, nothing counted.
	for range 5 {
		if _, res := h.run(t, syn(81, "10.9.0.1"), now); res.Reset {
			t.Error("a rule without refuse: reset answered a SYN")
		}
	}
	if o := outcomes(quiet); o != ([dataplane.ResetMax]uint64{}) {
		t.Errorf("quiet's reset outcomes %v, want none", o)
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
