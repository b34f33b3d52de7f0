//go:build linux

package maps

import (
	"fmt"
	"testing"

	"github.com/xlimit/xlimit/tests/kit/corpus"
	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// noTxHarness is newHarness with the program loaded as Options says and
// the model told the same.
func noTxHarness(t *testing.T, noTx bool) *harness {
	t.Helper()
	requireRoot(t)
	pinToOneCPU(t)
	o, err := Load(Options{FakeClock: true, NoXDPTx: noTx})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { o.Close() })
	h := &harness{obj: o, tab: o.Tables(), model: &dataplane.Model{NoXDPTx: noTx}}
	h.bind(t)
	h.setHost(t, defaultHost())
	return h
}

// noTxSpec has a rule of each kind that answers SYNs over its rate: SYN
// cookies `auto` (the bucket's refusals go to the cookie path) and
// `refuse: reset`.
func noTxSpec() *dataplane.Spec {
	return &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "auto", Protocol: "tcp", Ports: corpus.Ports(8081, 8081), SynOnly: true, Rate: 1, Burst: 1, SynCookies: "auto"},
		{Name: "refuse", Protocol: "tcp", Ports: corpus.Ports(8082, 8082), SynOnly: true, Rate: 1, Burst: 1, Refuse: "reset"},
	}}
}

func noTxSYN(port uint16, i int) []byte {
	a := corpus.DefaultAnswerHost()
	b, err := frame.Build(frame.Spec{SrcMAC: a.PeerMAC, DstMAC: a.MAC, Src: a.Peer4, Dst: a.IP4, Proto: frame.ProtoTCP,
		SrcPort: uint16(40000 + i), DstPort: port, TCPFlags: frame.TCPSyn, TCPSeq: 777000})
	if err != nil {
		panic(err)
	}
	return b
}

// TestNoXDPTx: loaded with NoXDPTx (an interface whose driver would take a
// path known to crash, loader/preflight), the program returns XDP_TX for
// no frame of the answering corpus (every class on the cookie and reset
// paths, budgets spent and not) nor for SYNs over the rate of `auto`
// cookies and `refuse: reset` rules: what it would have answered with a
// cookie it passes to the kernel (whose own SYN cookies answer it), what
// it would have answered with a reset it drops; the Go model agrees frame
// by frame and counter by counter. The same frames without the flag are
// answered (the test sees XDP_TX when there is one).
func TestNoXDPTx(t *testing.T) {
	for _, noTx := range []bool{false, true} {
		name := map[bool]string{false: "XDP_TX allowed", true: "NoXDPTx"}[noTx]
		t.Run(name, func(t *testing.T) {
			var h *harness
			tx := 0
			count := func(what string, ret uint32, res dataplane.Result) {
				if ret == xdpTx {
					tx++
					if noTx {
						t.Errorf("%s: XDP_TX returned with NoXDPTx", what)
					}
				}
				if mret := modelRet(res); mret != ret {
					t.Errorf("%s: kernel returned %d, model %+v (%d)", what, ret, res, mret)
				}
			}
			now := uint64(1000 * second)
			cases := corpus.AnswerCases(corpus.DefaultAnswerHost())
			for spec, s := range corpus.AnswerSpecs() {
				// answerHarness's set-up: the resets rule's breaker refuses
				// every SYN, so its refusals take the reset path.
				h = noTxHarness(t, noTx)
				h.apply(t, compile(t, s, nil))
				slot := h.slot(t, corpus.AnswerRule(corpus.PathReset))
				b, _ := dataplane.NewBucket(1e6, 1e6, false)
				h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: now + 1e6*second, Epoch: h.plan.Rules[slot].Epoch,
					Gate: dataplane.Gate{Drop: dataplane.GateAll}})
				for _, c := range cases {
					if c.Spec != spec {
						continue
					}
					now += 10 * second
					for _, f := range c.Pre {
						ret, _ := h.kernelRunOut(t, f, now, 1)
						count(c.Path+": "+c.Name+" (pre)", ret, h.model.Eval(f, now))
					}
					ret, _ := h.kernelRunOut(t, c.Frame, now, 1)
					res := h.model.Eval(c.Frame, now)
					count(c.Path+": "+c.Name, ret, res)
					if noTx && c.Ret == corpus.XDPTx {
						want := map[string]uint32{corpus.PathCookie: xdpPass, corpus.PathReset: xdpDrop}[c.Path]
						if ret != want {
							t.Errorf("%s: %s: XDP return code %d, want %d", c.Path, c.Name, ret, want)
						}
					}
				}
				h.checkCounters(t)
			}
			h = noTxHarness(t, noTx)
			h.apply(t, compile(t, noTxSpec(), nil))
			now += 10 * second
			for i := range 20 {
				for _, port := range []uint16{8081, 8082} {
					f := noTxSYN(port, i)
					ret, _ := h.kernelRunOut(t, f, now, 1)
					count(fmt.Sprintf("SYN %d over the rate of port %d", i, port), ret, h.model.Eval(f, now))
				}
			}
			h.checkCounters(t)
			t.Logf("%s: %d frames answered with XDP_TX", name, tx)
			if !noTx && tx == 0 {
				t.Error("no XDP_TX without NoXDPTx: the corpus answers nothing, the test shows nothing")
			}
		})
	}
}
