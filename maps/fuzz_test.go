//go:build linux

package maps

import (
	"testing"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// testRunMaxLinear is the most BPF_PROG_TEST_RUN puts in the linear data
// of an XDP test frame: a page less the XDP headroom (256) and the
// skb_shared_info tail (320) on x86-64. Longer input goes to fragments,
// which this program (not loaded with xdp.frags) never reads: it sees
// data_end - data = 3520. On a NIC the program cannot be attached at an MTU
// that would need fragments, so only the test runner produces them.
const testRunMaxLinear = 4096 - 256 - 320

// fuzzSpec is the fixed plan of FuzzXDP: the frame tests' plan plus rules
// that take fragments.
func fuzzSpec() *dataplane.Spec {
	s := baseSpec()
	s.Rules = append(s.Rules,
		dataplane.RuleSpec{Name: "frag-limit", Protocol: "tcp", Ports: ports(8000, 8099), Fragments: "limit", Rate: 5, Burst: 2},
		dataplane.RuleSpec{Name: "frag-drop", Protocol: "udp", Ports: ports(6000, 6000), Fragments: "drop", Rate: 5, Burst: 2},
	)
	return s
}

// FuzzXDP feeds arbitrary frames to the kernel program and the model with a
// fixed plan: verdicts, reasons and the counters of every slot the packet
// must agree. Each input runs 1..4 times at one instant an hour
// after the previous input, so every bucket starts full and the outcome
// depends on the input alone.
func FuzzXDP(f *testing.F) {
	for _, c := range frameCases() {
		for _, p := range c.pre {
			f.Add(p, uint8(0))
		}
		f.Add(c.frame, uint8(len(c.pre)))
	}
	jumbo := udpTo(srcA4, 9200)
	jumbo.PayloadLen = 4000
	f.Add(build(jumbo), uint8(0))
	h := newHarness(f)
	h.apply(f, compile(f, fuzzSpec(), nil))
	now := second
	f.Fuzz(func(t *testing.T, frame []byte, repeat uint8) {
		h.enter(t)
		now += 3600 * second
		if len(frame) < 14 {
			// BPF_PROG_TEST_RUN rejects XDP input under 14 bytes: the
			// model alone must call it malformed L2.
			if res := h.model.Eval(frame, now); res.Reason != dataplane.ReasonMalformedL2 || res.Pass() {
				t.Fatalf("%d-byte frame: model %v/%v, want drop/malformed_l2", len(frame), res.Verdict, res.Reason)
			}
			return
		}
		if len(frame) > testRunMaxLinear {
			// The kernel's program sees only the linear part of a longer
			// input (see testRunMaxLinear): so must the model.
			frame = frame[:testRunMaxLinear]
		}
		for range 1 + int(repeat%4) {
			before, modelBefore := h.counters(t), h.model.Counters
			_, res := h.run(t, frame, now)
			got := deltas(h.counters(t), before)
			want := deltas(h.model.Counters, modelBefore)
			if d := diffCounters(got, want, h.plan); d != "" {
				t.Fatalf("frame %x (model %v/%v): kernel counters differ from the model's:%s", frame, res.Verdict, res.Reason, d)
			}
		}
	})
}
