//go:build linux

package maps

import (
	"net/netip"
	"testing"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// TestCookieShareRescale is issue 41's "the cookie share not rescaled when
// a rule's rate changes" on the real program (BPF_PROG_TEST_RUN, the fake
// clock), the model in step. Rule 10/s, burst 40, `syn_cookies: always`: a
// spoofed flood of SYNs the cookie path cannot answer (one IPv4 NOP option
// word: the kernel's to answer) empties the rule's share for such SYNs
// (a quarter of its rate and burst), whose TAT is then a whole tolerance,
// 4 s, ahead. The rate is raised to 1000/s (a tolerance of 40 ms): the
// share must keep how full it is, as the rule's bucket does, and refill at
// the new rate, so that clients' SYNs of that class at 50/s (a fifth of
// the share's new 250/s) pass within a few tens of milliseconds. Left in
// the old units, the share's TAT stays 4 s ahead of a 40 ms tolerance and
// refuses every such SYN for almost 4 s.
func TestCookieShareRescale(t *testing.T) {
	h := newHarness(t)
	web := dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 10, Burst: 40, SynCookies: "always"}
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{web}}, nil))
	cookieListener(t)
	now := uint64(1000 * second)
	syn := func(i int) []byte {
		return frame.MustBuild(frame.Spec{Src: netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), Proto: frame.ProtoTCP,
			IPv4OptionWords: 1, SrcPort: uint16(1024 + i), DstPort: 80, TCPFlags: frame.TCPSyn})
	}
	run := func(i int) bool {
		in := syn(i)
		ret, _ := h.kernelRunOut(t, in, now, 1)
		res := h.model.Eval(in, now)
		if ret != modelRet(res) {
			t.Errorf("SYN %d: XDP return code %d, model %d", i, ret, modelRet(res))
		}
		if ret == xdpTx {
			t.Fatalf("SYN %d with an IPv4 option answered", i)
		}
		return ret == xdpPass
	}
	flood := 0
	for i := range 50 {
		if run(i) {
			flood++
		}
	}
	web.Rate = 1000
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{web}}, h.plan))
	passed := 0
	const n, every = 100, 20 * second / 1000
	first := -1
	for i := range n {
		now += every
		if run(1000 + i) {
			passed++
			if first < 0 {
				first = i
			}
		}
	}
	h.checkCounters(t)
	c := h.slotCounters(t, h.slot(t, "web"))
	firstAt := "none passed"
	if first >= 0 {
		firstAt = "the first after " + itoa((first+1)*20) + " ms"
	}
	t.Logf("flood: %d of 50 unanswerable SYNs passed through the share (10/s, burst 40: a quarter, 10); after the raise to 1000/s: %d of %d such SYNs at 50/s passed over 2 s, %s; rule %s",
		flood, passed, n, firstAt, fmtCounters(c))
	if flood != 10 {
		t.Errorf("the flood passed %d SYNs through the share, want a quarter of the burst, 10", flood)
	}
	if passed < n-5 {
		t.Errorf("after a raise from 10/s to 1000/s, %d of %d SYNs at 50/s passed the share (its new rate 250/s), want at least %d: the share kept the old rate's units",
			passed, n, n-5)
	}
}
