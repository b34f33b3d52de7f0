//go:build linux

package maps

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/xlimit/xlimit/tests/kit/corpus"
	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// answerHarness is a harness for one of corpus.AnswerSpecs, the resets
// rule's breaker refusing every SYN (its refusals take the reset path).
func answerHarness(t *testing.T, spec string, now uint64) *harness {
	t.Helper()
	h := newHarness(t)
	h.apply(t, compile(t, corpus.AnswerSpecs()[spec], nil))
	slot := h.slot(t, corpus.AnswerRule(corpus.PathReset))
	b, _ := dataplane.NewBucket(1e6, 1e6, false)
	h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: now + 1e6*second, Epoch: h.plan.Rules[slot].Epoch,
		Gate: dataplane.Gate{Drop: dataplane.GateAll}})
	return h
}

func (h *harness) answerCounters(tb testing.TB, slot int) dataplane.AnswerCounters {
	tb.Helper()
	c, err := h.tab.AnswerCounters(slot)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// TestAnswerClasses: every SYN of the answering corpus (corpus.AnswerCases:
// each class of bpf/answer.h, on the cookie path and the reset path) gets
// its verdict, answered (XDP_TX) only when the policy allows it, with
// exactly its class counted on its path, the kernel and the Go model in
// step. Before answer.h (cd7296b) the cookie path answered every one of
// the crafted SYNs (broadcast and multicast MACs, a foreign
// destination MAC, 255.255.255.255, 224.0.0.1, 0.0.0.0, 127.0.0.1, the
// host's own address, ff02::1, SYN|RST, SYN|FIN) and the reset path the
// loopback and own-address sources, SYN|RST and SYN|FIN.
func TestAnswerClasses(t *testing.T) {
	cases := corpus.AnswerCases(corpus.DefaultAnswerHost())
	specs := map[string]bool{}
	for _, c := range cases {
		specs[c.Spec] = true
	}
	names := make([]string, 0, len(specs))
	for s := range specs {
		names = append(names, s)
	}
	slices.Sort(names)
	for _, spec := range names {
		now := uint64(1000 * second)
		h := answerHarness(t, spec, now)
		for _, c := range cases {
			if c.Spec != spec {
				continue
			}
			now += 10 * second
			name := c.Path + ": " + c.Name
			for _, f := range c.Pre {
				h.run(t, f, now)
			}
			slot := h.slot(t, corpus.AnswerRule(c.Path))
			before, a0, k0 := h.counters(t), h.answerCounters(t, slot), h.cookieCounters(t, slot)
			m0 := h.model.AnswerCounters[slot]
			ret, _ := h.kernelRunOut(t, c.Frame, now, 1)
			res := h.model.Eval(c.Frame, now)
			if ret != c.Ret {
				t.Errorf("%s: XDP return code %d, want %d", name, ret, c.Ret)
			}
			if mret := modelRet(res); mret != c.Ret {
				t.Errorf("%s: model %+v (return code %d), want %d", name, res, mret, c.Ret)
			}
			d := deltas(h.counters(t), before)
			v := dataplane.VerdictDrop
			if c.Ret == corpus.XDPPass {
				v = dataplane.VerdictPass
			}
			rule := one(v, c.Reason, len(c.Frame))
			if c.Path == corpus.PathReset {
				rule.Resets[c.Reset] = 1
			}
			if d[slot] != rule || d[dataplane.GlobalSlot] != one(v, c.Reason, len(c.Frame)) {
				t.Errorf("%s: rule and global counters %s / %s, want %s", name, fmtCounters(d[slot]), fmtCounters(d[dataplane.GlobalSlot]), fmtCounters(rule))
			}
			var want dataplane.AnswerCounters
			if c.Path == corpus.PathCookie {
				want.Cookie[c.Class] = 1
			} else {
				want.Reset[c.Class] = 1
			}
			if got := h.answerCounters(t, slot).Sub(a0); got != want {
				t.Errorf("%s: answer counters %+v, want %v on the %s path", name, got, c.Class, c.Path)
			}
			if got := h.model.AnswerCounters[slot].Sub(m0); got != want {
				t.Errorf("%s: model's answer counters %+v, want %v on the %s path", name, got, c.Class, c.Path)
			}
			if c.Path == corpus.PathCookie && h.cookieCounters(t, slot).Sent-k0.Sent != b2u(c.Ret == corpus.XDPTx) {
				t.Errorf("%s: cookie counters %+v -> %+v", name, k0, h.cookieCounters(t, slot))
			}
		}
		h.checkCounters(t)
		for _, r := range []string{"cookies", "resets"} {
			slot := h.slot(t, r)
			k := h.cookieCounters(t, slot)
			xdp := dataplane.CookieCounters{Sent: k.Sent, OverBudget: k.OverBudget, NotLocal: k.NotLocal, Unanswerable: k.Unanswerable}
			if xdp != h.model.CookieCounters[slot] {
				t.Errorf("spec %s, rule %s: cookie counters kernel %+v, model %+v", spec, r, xdp, h.model.CookieCounters[slot])
			}
		}
	}
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// modelRet is the XDP return code the model's result stands for.
func modelRet(r dataplane.Result) uint32 {
	switch {
	case r.Reset || r.Cookie:
		return corpus.XDPTx
	case r.Pass():
		return corpus.XDPPass
	}
	return corpus.XDPDrop
}

// TestCookieBudgetFallback: with the budget of cookie answers spent, a SYN
// goes to the rule's own bucket through the rule's share for SYNs XDP
// cannot answer (a quarter of its burst, here 2): passed while it has room
// (counted over_budget, answer class budget), dropped with reason rule
// once it is empty; kernel and model in step. Before (cd7296b) every SYN
// over the budget was dropped, the rule's bucket full and unused.
func TestCookieBudgetFallback(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{CookieRate: 1, Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 8, Burst: 8, SynCookies: "always"},
	}}, nil))
	slot := h.slot(t, "web")
	now := uint64(1000 * second)
	for i, want := range []uint32{xdpTx, xdpPass, xdpPass, xdpDrop} {
		s := frame.Spec{Src: netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}), Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80, TCPFlags: frame.TCPSyn}
		in := frame.MustBuild(s)
		ret, _ := h.kernelRunOut(t, in, now, 1)
		res := h.model.Eval(in, now)
		if ret != want || modelRet(res) != want {
			t.Errorf("SYN %d under a budget of 1 answer and a bucket of 2: XDP return code %d, model %d, want %d", i, ret, modelRet(res), want)
		}
	}
	c := h.slotCounters(t, slot)
	if c.Reasons[dataplane.ReasonCookie] != 1 || c.Reasons[dataplane.ReasonAdmit] != 2 || c.Reasons[dataplane.ReasonRule] != 1 {
		t.Errorf("rule counters %s, want 1 cookie, 2 admitted by the bucket, 1 dropped by the share", fmtCounters(c))
	}
	if k := h.cookieCounters(t, slot); k.Sent != 1 || k.OverBudget != 3 {
		t.Errorf("cookie counters %+v, want 1 sent and 3 over the budget", k)
	}
	if a := h.answerCounters(t, slot); a.Cookie[dataplane.AnswerOK] != 1 || a.Cookie[dataplane.AnswerBudget] != 3 || a != h.model.AnswerCounters[slot] {
		t.Errorf("answer counters %+v, model %+v, want 1 ok and 3 budget", a, h.model.AnswerCounters[slot])
	}
	h.checkCounters(t)
}

// TestCookieUnlistedDestination: a SYN to a `syn_cookies: always` port
// whose destination xl_host_addrs does not list is dropped unanswered
// while the map is complete (no host should answer it), but goes on to the
// rule's bucket, as without cookies, when the map carries the mark that it
// is incomplete (a host with more addresses than it holds, or whose
// addresses could not be read): the destination may be one of the host's
// that did not fit (through the rule's share for SYNs XDP cannot answer:
// a quarter of its burst of 8). Listed destinations are answered either
// way. Kernel and model agree.
func TestCookieUnlistedDestination(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 8, Burst: 8, SynCookies: "always"},
	}}, nil))
	slot := h.slot(t, "web")
	unlisted := netip.MustParseAddr("192.0.2.77")
	syn := func(i int, dst netip.Addr) []byte {
		return frame.MustBuild(frame.Spec{Src: netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}), Dst: dst,
			Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80, TCPFlags: frame.TCPSyn})
	}
	now := uint64(1000 * second)
	run := func(what string, in []byte, want uint32) {
		t.Helper()
		ret, _ := h.kernelRunOut(t, in, now, 1)
		res := h.model.Eval(in, now)
		if ret != want || modelRet(res) != want {
			t.Errorf("%s: XDP return code %d, model %d, want %d", what, ret, modelRet(res), want)
		}
	}

	h.setHost(t, defaultHost())
	run("complete map, unlisted destination", syn(0, unlisted), xdpDrop)
	run("complete map, listed destination", syn(1, netip.Addr{}), xdpTx)

	incomplete := defaultHost()
	incomplete[dataplane.IncompleteKey] = 0
	h.setHost(t, incomplete)
	for i, want := range []uint32{xdpPass, xdpPass, xdpDrop} {
		run(fmt.Sprintf("incomplete map, unlisted destination, SYN %d of a share of 2", i), syn(2+i, unlisted), want)
	}
	run("incomplete map, listed destination", syn(9, netip.Addr{}), xdpTx)

	if a := h.answerCounters(t, slot); a.Cookie[dataplane.AnswerDstIP] != 4 || a.Cookie[dataplane.AnswerOK] != 2 || a != h.model.AnswerCounters[slot] {
		t.Errorf("answer counters %+v, model %+v, want 4 dst_ip and 2 ok", a, h.model.AnswerCounters[slot])
	}
	h.checkCounters(t)
}

// TestHostAddrsUnmaintained (issue 41 M1): only the daemon follows the
// host's addresses, while the program enforces without it. Once no daemon
// maintains xl_host_addrs (stopped, crashed, crash-looping) and its lease
// has run out, the map says nothing of the host's addresses: a SYN to a
// `syn_cookies: always` port is neither dropped because its destination is
// unlisted (an address added since: a VIP that failed over) nor answered
// because it is listed (an address removed since); it goes to the rule's
// bucket, as without cookies, and what the bucket admits reaches the
// kernel, which answers it itself. Within the lease, and once a daemon
// renews it, the map is trusted again. Kernel and model agree.
func TestHostAddrsUnmaintained(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 2, Burst: 2, SynCookies: "always"},
	}}, nil))
	slot := h.slot(t, "web")
	added := netip.MustParseAddr("192.0.2.77") // taken by the host after the daemon stopped
	syn := func(i int, dst netip.Addr) []byte {
		return frame.MustBuild(frame.Spec{Src: netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}), Dst: dst,
			Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80, TCPFlags: frame.TCPSyn})
	}
	run := func(what string, now uint64, in []byte, want uint32) {
		t.Helper()
		ret, _ := h.kernelRunOut(t, in, now, 1)
		res := h.model.Eval(in, now)
		if ret != want || modelRet(res) != want {
			t.Errorf("%s: XDP return code %d, model %d, want %d", what, ret, modelRet(res), want)
		}
	}
	start := uint64(1000 * second)
	h.setHost(t, defaultHost())
	run("daemon running, unlisted destination", start, syn(0, added), xdpDrop)
	run("daemon running, listed destination", start, syn(1, netip.Addr{}), xdpTx)

	h.daemonKilled(t) // at start: no exit hook, its last lease runs out on its own
	within := start + 3*second
	run("daemon gone 3 s, unlisted destination", within, syn(2, added), xdpDrop)
	run("daemon gone 3 s, listed destination", within, syn(3, netip.Addr{}), xdpTx)
	late := start + 60*second
	run("daemon gone 60 s, listed destination (maybe removed): to the kernel", late, syn(4, netip.Addr{}), xdpPass)
	run("daemon gone 60 s, unlisted destination (maybe added): to the kernel", late, syn(5, added), xdpPass)
	run("daemon gone 60 s, unlisted destination, the bucket of 2 spent", late, syn(6, added), xdpDrop)

	h.daemonGone = false // a daemon back: its full write, then its lease
	h.setHost(t, defaultHost())
	back := late + 10*second
	run("daemon back, unlisted destination", back, syn(7, added), xdpDrop)
	run("daemon back, listed destination", back, syn(8, netip.Addr{}), xdpTx)

	// A daemon that exits releases its lease: trusted no more at once.
	if err := h.tab.ReleaseHostAddrs(); err != nil {
		t.Fatal(err)
	}
	delete(h.model.Host, dataplane.LeaseKey)
	run("daemon exited, listed destination: to the kernel", back+second, syn(9, netip.Addr{}), xdpPass)

	if a := h.answerCounters(t, slot); a != h.model.AnswerCounters[slot] {
		t.Errorf("answer counters %+v, model %+v", a, h.model.AnswerCounters[slot])
	}
	h.checkCounters(t)
}
