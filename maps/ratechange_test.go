//go:build linux

package maps

import (
	"testing"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// A change of a rule's rate (a reload that keeps the rule, a confirm's
// revert, the control loop's limit) keeps how full its buckets are, not
// their raw TAT (issue 26): a bucket held empty at 100/s (burst 1000,
// a TAT 10 s ahead) that is raised to 1000/s (burst 1000, a tolerance of
// 1 s) admits at the new rate at once, not nothing until the old TAT has
// drained; and one held empty at 1000/s cut to 100/s stays empty, it does
// not get 9 s of the new tolerance as a fresh burst. Every packet runs
// through the Go model as well, which must agree.

const rcMS = second / 1000

// rcStep is the fake clock's step of the floods below.
const rcStep = 10 * rcMS

// rcFlood offers perStep packets every rcStep after from, until from+dur
// (included), and returns how many were admitted and the time of the last
// step.
func rcFlood(t *testing.T, h *harness, slot int, frame []byte, from, dur uint64, perStep int) (int, uint64) {
	t.Helper()
	admitted, now := 0, from
	for now = from + rcStep; now <= from+dur; now += rcStep {
		admitted += offer(t, h, slot, frame, now, perStep)
	}
	return admitted, now - rcStep
}

// rcWithin fails unless got is within 1 % (and one packet) of want.
func rcWithin(t *testing.T, what string, got int, want float64) {
	t.Helper()
	t.Logf("%s: %d admitted", what, got)
	if d := float64(got) - want; d > 0.01*want+1 || d < -(0.01*want+1) {
		t.Errorf("%s: %d admitted, want %.0f (±1 %%)", what, got, want)
	}
}

// rcWithinChange is rcWithin for the first second after a change from
// rate from: the bucket was empty at the old rule's last packet, a step
// (rcStep) before the change applies, and the tokens the old rate refilled
// in that step are carried over as the same part of the new burst (both
// bursts 1000: as many tokens), on top of the new rate.
func rcWithinChange(t *testing.T, what string, got int, want, from float64) {
	t.Helper()
	extra := from * float64(rcStep) / 1e9
	t.Logf("%s: %d admitted", what, got)
	if d := float64(got) - want; d > 0.01*want+1+extra || d < -(0.01*want+1) {
		t.Errorf("%s: %d admitted, want %.0f (-1 %%, +1 %% + %.0f refilled at the old rate)", what, got, want, extra)
	}
}

// rcCase is one change: a rule (or per-source limit) at rate from, held
// empty by a flood, then at rate to; both with burst 1000.
type rcCase struct {
	name     string
	from, to float64
}

var rcCases = []rcCase{
	{"raise 100/s to 1000/s", 100, 1000},
	{"cut 1000/s to 100/s", 1000, 100},
}

// rcOffer is what a step offers at rate r: 1.5 times what it refills.
func rcOffer(r float64) int { return int(1.5*r*float64(rcStep)/1e9) + 1 }

// perStep is what each step of case c offers: enough to saturate the
// faster of its rates, so that tokens the change gives too many show.
func (c rcCase) perStep() int { return rcOffer(max(c.from, c.to)) }

// TestRateChangeReload: the rule's rate changes with a reload that keeps
// the rule (same name: same epoch, the state carries over).
func TestRateChangeReload(t *testing.T) {
	requireRoot(t)
	for _, c := range rcCases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			rule := func(rate float64) *dataplane.Spec {
				return &dataplane.Spec{Rules: []dataplane.RuleSpec{
					{Name: "r", Protocol: "udp", Ports: ports(53, 53), Rate: rate, Burst: 1000},
				}}
			}
			h.apply(t, compile(t, rule(c.from), nil))
			slot := h.slot(t, "r")
			frame := build(udpTo(srcA4, 53))
			n := c.perStep()
			t0 := 1000 * second
			if got := offer(t, h, slot, frame, t0, 1100); got != 1000 {
				t.Fatalf("first burst: %d admitted, want 1000", got)
			}
			got, now := rcFlood(t, h, slot, frame, t0, 2*second, n)
			rcWithin(t, "flood at the old rate, 2 s", got, 2*c.from)

			h.apply(t, compile(t, rule(c.to), h.plan))
			if h.slot(t, "r") != slot {
				t.Fatalf("the reload moved the rule to slot %d", h.slot(t, "r"))
			}
			got, now = rcFlood(t, h, slot, frame, now, second, n)
			rcWithinChange(t, "first second at the new rate", got, c.to, c.from)
			got, _ = rcFlood(t, h, slot, frame, now, second, n)
			rcWithin(t, "second second at the new rate", got, c.to)
		})
	}
}

// TestRateChangeLimit: the control loop's limit raises the rule's rate,
// then lapses (fail-static) back to the rule's own.
func TestRateChangeLimit(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "r", Protocol: "udp", Ports: ports(53, 53), Rate: 100, Burst: 1000},
	}}, nil))
	slot := h.slot(t, "r")
	frame := build(udpTo(srcA4, 53))
	t0 := 1000 * second
	if got := offer(t, h, slot, frame, t0, 1100); got != 1000 {
		t.Fatalf("first burst: %d admitted, want 1000", got)
	}
	got, now := rcFlood(t, h, slot, frame, t0, 2*second, rcOffer(100))
	rcWithin(t, "flood at the rule's 100/s, 2 s", got, 200)

	b, err := dataplane.NewBucket(1000, 1000, false)
	if err != nil {
		t.Fatal(err)
	}
	// The limit is in force for 2 s, then lapses.
	h.setLimit(t, slot, dataplane.Limit{Bucket: b, DeadlineNS: now + 2*second, Epoch: h.plan.Rules[slot].Epoch})
	got, now = rcFlood(t, h, slot, frame, now, second, rcOffer(1000))
	rcWithinChange(t, "first second of the loop's 1000/s", got, 1000, 100)
	got, now = rcFlood(t, h, slot, frame, now, second, rcOffer(1000))
	rcWithin(t, "second second of the loop's 1000/s", got, 1000)
	got, _ = rcFlood(t, h, slot, frame, now, second, rcOffer(1000))
	rcWithinChange(t, "first second after the limit lapsed (the rule's 100/s)", got, 100, 1000)
}

// TestRateChangeSource: a per-source limit's rate changes with a reload
// that keeps the rule.
func TestRateChangeSource(t *testing.T) {
	requireRoot(t)
	for _, c := range rcCases {
		t.Run(c.name, func(t *testing.T) {
			h := newPSHarness(t, 0)
			rule := func(rate float64) *dataplane.Spec {
				ps := dataplane.PerSourceSpec{Rate: rate, Burst: 1000, PrefixV4: 32, PrefixV6: 64}
				return &dataplane.Spec{Rules: []dataplane.RuleSpec{psRule("ps", 53, 1e6, 1e6, ps)}}
			}
			h.apply(t, compile(t, rule(c.from), nil))
			slot := h.slot(t, "ps")
			frame := build(udpTo(srcA4, 53))
			n := c.perStep()
			t0 := psT0
			if got := offer(t, h, slot, frame, t0, 1100); got != 1000 {
				t.Fatalf("first burst: %d admitted, want 1000", got)
			}
			got, now := rcFlood(t, h, slot, frame, t0, 2*second, n)
			rcWithin(t, "flood at the old rate, 2 s", got, 2*c.from)

			h.apply(t, compile(t, rule(c.to), h.plan))
			got, now = rcFlood(t, h, slot, frame, now, second, n)
			rcWithinChange(t, "first second at the new rate", got, c.to, c.from)
			got, _ = rcFlood(t, h, slot, frame, now, second, n)
			rcWithin(t, "second second at the new rate", got, c.to)
			psCompareTable(t, h)
		})
	}
}
