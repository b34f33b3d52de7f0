//go:build linux

package maps

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

const second = uint64(1e9)

// TestFrames runs each crafted frame through the kernel program and the
// model and checks the exact verdict and the exact counter deltas of every
// slot. Each case runs 1000 s after the previous one, so every bucket is
// full again when it starts.
func TestFrames(t *testing.T) {
	requireRoot(t)
	specs := frameSpecsByName()
	hs := map[string]*harness{}
	for i, c := range frameCases() {
		h := hs[c.spec]
		if h == nil {
			h = newHarness(t)
			h.apply(t, compile(t, specs[c.spec], nil))
			hs[c.spec] = h
		}
		now := uint64(i+1) * 1000 * second
		t.Run(c.name, func(t *testing.T) {
			h.enter(t)
			for _, f := range c.pre {
				h.run(t, f, now)
			}
			before, modelBefore := h.counters(t), h.model.Counters
			pass, res := h.run(t, c.frame, now)
			got := deltas(h.counters(t), before)
			gotModel := deltas(h.model.Counters, modelBefore)

			var want allCounters
			v := dataplane.VerdictDrop
			if c.pass {
				v = dataplane.VerdictPass
			}
			want[dataplane.GlobalSlot] = one(v, c.reason, len(c.frame))
			for _, r := range c.rules {
				want[h.slot(t, r.name)] = one(r.verdict, r.reason, len(c.frame))
			}
			if pass != c.pass {
				t.Errorf("kernel pass=%v, want %v", pass, c.pass)
			}
			if res.Pass() != c.pass || res.Reason != c.reason {
				t.Errorf("model %v/%v, want pass=%v/%v", res.Verdict, res.Reason, c.pass, c.reason)
			}
			if d := diffCounters(got, want, h.plan); d != "" {
				t.Errorf("kernel counter deltas:%s", d)
			}
			if d := diffCounters(gotModel, want, h.plan); d != "" {
				t.Errorf("model counter deltas:%s", d)
			}
			if t.Failed() {
				t.Logf("frame (%d bytes): %x", len(c.frame), c.frame)
			}
		})
	}
}

// TestShortFramesModel covers frames shorter than an Ethernet header in the
// Go model only: BPF_PROG_TEST_RUN rejects XDP input under 14 bytes with
// EINVAL, so the kernel side cannot be run. On a NIC the driver never hands
// XDP such a frame either.
func TestShortFramesModel(t *testing.T) {
	specs := frameSpecsByName()
	full := build(udpTo(srcA4, 53))
	for _, name := range []string{"base", "malformed-pass"} {
		plan, err := dataplane.Compile(specs[name], nil)
		if err != nil {
			t.Fatal(err)
		}
		m := &dataplane.Model{Plan: plan}
		for n := range 14 {
			res := m.Eval(full[:n], second)
			wantPass := name == "malformed-pass"
			if res.Reason != dataplane.ReasonMalformedL2 || res.Pass() != wantPass {
				t.Errorf("%s: %d-byte frame: %v/%v, want pass=%v/malformed_l2", name, n, res.Verdict, res.Reason, wantPass)
			}
		}
		c := m.Counters[dataplane.GlobalSlot]
		if c.Reasons[dataplane.ReasonMalformedL2] != 14 {
			t.Errorf("%s: malformed_l2 counted %d times, want 14", name, c.Reasons[dataplane.ReasonMalformedL2])
		}
	}
}

// offer runs frame n times at now, one run at a time so kernel and model
// are compared packet by packet, and returns how many the kernel admitted.
// It also checks that the rule slot's pass counter grew by that much.
func offer(t *testing.T, h *harness, slot int, frame []byte, now uint64, n int) int {
	t.Helper()
	before := h.slotCounters(t, slot)
	admitted := 0
	for range n {
		if pass, _ := h.run(t, frame, now); pass {
			admitted++
		}
	}
	d := h.slotCounters(t, slot).Sub(before)
	if d.Packets[dataplane.VerdictPass] != uint64(admitted) {
		t.Errorf("at %d ns: %d passed but slot %d counted %d", now, admitted, slot, d.Packets[dataplane.VerdictPass])
	}
	return admitted
}

// TestFailStatic checks that the control loop's limit applies only while it
// is fresh and meant for the rule in the slot, and the static fallback
// otherwise.
func TestFailStatic(t *testing.T) {
	h := newHarness(t)
	h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "api", Protocol: "udp", Ports: ports(8080, 8080), Rate: 1, Burst: 3},
	}}, nil))
	slot := h.slot(t, "api")
	epoch := h.plan.Rules[slot].Epoch
	fast, err := dataplane.NewBucket(1000, 50, false)
	if err != nil {
		t.Fatal(err)
	}
	frame := build(udpTo(srcA4, 8080))
	const deadline = 1000 * second

	steps := []struct {
		name  string
		limit *dataplane.Limit // written before the step, when set
		at    uint64
		want  int
		n     int // packets offered; 0: 100
	}{
		{"no limit: fallback burst", nil, 10 * second, 3, 0},
		{"fresh limit", &dataplane.Limit{Bucket: fast, DeadlineNS: 200 * second, Epoch: epoch}, 100 * second, 50, 0},
		{"after the deadline: fallback", nil, 300 * second, 3, 0},
		{"limit for another epoch: ignored", &dataplane.Limit{Bucket: fast, DeadlineNS: deadline, Epoch: epoch ^ 2}, 400 * second, 3, 0},
		{"limit with epoch 0: ignored", &dataplane.Limit{Bucket: fast, DeadlineNS: deadline}, 500 * second, 3, 0},
		{"1 ns before the deadline", &dataplane.Limit{Bucket: fast, DeadlineNS: deadline, Epoch: epoch}, deadline - 1, 50, 0},
		// The limit's 50 packets emptied its bucket (its TAT 50 ms
		// ahead, its whole tolerance): under the fallback (1/s, burst
		// 3 s) the bucket stays as empty (a change of rate keeps the
		// bucket's fill: the TAT is rescaled to 3 s ahead), so nothing
		// passes at the deadline. The drops of the run begun 1 ns
		// before, in the same tick, come first (SkipDrops packets
		// without a clock read); the read that ends it finds the bucket
		// empty on the limit chosen by the run's time and starts
		// another: the deadline is seen after at most two runs, and
		// within the tick. A second later the fallback has refilled one
		// packet (the limit's 1000/s would have 50).
		{"at the deadline", nil, deadline, 0, 2*dataplane.SkipDrops + 100},
		{"1 s after the deadline", nil, deadline + second, 1, 0},
		{"well after the deadline", nil, deadline + 10*second, 3, 0},
	}
	for _, s := range steps {
		if s.limit != nil {
			h.setLimit(t, slot, *s.limit)
			if got, err := h.tab.Limit(slot); err != nil || got != *s.limit {
				t.Fatalf("%s: limit read back as %+v (%v), wrote %+v", s.name, got, err, *s.limit)
			}
		}
		n := s.n
		if n == 0 {
			n = 100
		}
		if got := offer(t, h, slot, frame, s.at, n); got != s.want {
			t.Errorf("%s: admitted %d of %d, want %d", s.name, got, n, s.want)
		}
	}
}

// TestReloadKeepsState applies a recompiled plan over a drained bucket.
func TestReloadKeepsState(t *testing.T) {
	h := newHarness(t)
	p1 := compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "api", Protocol: "udp", Ports: ports(8080, 8080), Rate: 10, Burst: 5},
		{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 100, Burst: 10},
	}}, nil)
	h.apply(t, p1)
	gen1, err := h.tab.ActiveGeneration()
	if err != nil {
		t.Fatal(err)
	}
	api := h.slot(t, "api")
	apiFrame := build(udpTo(srcA4, 8080))
	t0 := 1000 * second

	// Drain api: 5 of 10 pass.
	if got := offer(t, h, api, apiFrame, t0, 10); got != 5 {
		t.Fatalf("drain: admitted %d of 10, want 5", got)
	}
	h.run(t, build(udpTo(srcA4, 53)), t0)
	tat1, epoch1, err := h.tab.BucketTAT(api)
	if err != nil {
		t.Fatal(err)
	}
	before := h.counters(t)

	// Reload: api's rate doubles, a rule is added in front, dns is the same.
	p2 := compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "new", Protocol: "udp", Ports: ports(9090, 9090), Rate: 10, Burst: 3},
		{Name: "api", Protocol: "udp", Ports: ports(8080, 8080), Rate: 20, Burst: 5},
		{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 100, Burst: 10},
	}}, p1)
	if p2.Slot("api") != api || p2.Slot("dns") != p1.Slot("dns") {
		t.Fatalf("rules moved: api %d→%d, dns %d→%d", api, p2.Slot("api"), p1.Slot("dns"), p2.Slot("dns"))
	}
	h.apply(t, p2)
	if gen2, err := h.tab.ActiveGeneration(); err != nil || gen2 == gen1 {
		t.Errorf("active generation %d after reload (%v), was %d", gen2, err, gen1)
	}
	if d := diffCounters(h.counters(t), before, p2); d != "" {
		t.Errorf("counters changed by the reload:%s", d)
	}
	if tat, epoch, err := h.tab.BucketTAT(api); err != nil || tat != tat1 || epoch != epoch1 {
		t.Errorf("api bucket after reload: tat %d epoch %#x (%v), was %d %#x", tat, epoch, err, tat1, epoch1)
	}
	// Still drained at the same instant: no new burst.
	if got := offer(t, h, api, apiFrame, t0, 5); got != 0 {
		t.Errorf("drained bucket admitted %d right after the reload, want 0", got)
	}
	// At 20/s with a burst of 5 (250 ms) the bucket stays as empty as it
	// was (a change of rate keeps the bucket's fill: the TAT, 500 ms
	// ahead of a tolerance of 500 ms, is rescaled to 250 ms ahead), and
	// admits again 50 ms later, one emission interval at the new rate:
	// one packet, then another every 50 ms. (The probe 1 ns before reads
	// the clock on its first packet only: after a read that finds the
	// bucket empty the cache drops without reading until the next tick
	// (bucket.h, xl_cache_empty), so the probe at 50 ms is a tick later.)
	if got := offer(t, h, api, apiFrame, t0+50*second/1000-1, 3); got != 0 {
		t.Errorf("1 ns before 50 ms: admitted %d, want 0", got)
	}
	at50 := t0 + 50*second/1000 + 1<<dataplane.FakeTickShift
	if got := offer(t, h, api, apiFrame, at50, 3); got != 1 {
		t.Errorf("at 50 ms (the next tick): admitted %d, want 1", got)
	}
	// The counters carried on: 5+1 passed, 5+5+3+2 dropped.
	c := h.slotCounters(t, api)
	if c.Packets[dataplane.VerdictPass] != 6 || c.Packets[dataplane.VerdictDrop] != 15 {
		t.Errorf("api counters %s, want 6 passed, 15 dropped", fmtCounters(c))
	}
	// The added rule starts full.
	newSlot := h.slot(t, "new")
	if got := offer(t, h, newSlot, build(udpTo(srcA4, 9090)), t0, 5); got != 3 {
		t.Errorf("added rule admitted %d of 5, want its burst of 3", got)
	}

	// A reload where api's slot passes to another rule: it starts full.
	spec3 := &dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "new", Protocol: "udp", Ports: ports(9090, 9090), Rate: 10, Burst: 3},
		{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 100, Burst: 10},
	}}
	// Fill every slot the previous plan left free, so the last rule must
	// take api's slot.
	for i := 0; len(spec3.Rules) < dataplane.MaxRules-1; i++ {
		spec3.Rules = append(spec3.Rules, dataplane.RuleSpec{Name: "filler-" + itoa(i), Protocol: "udp",
			Ports: ports(uint16(20000+i), uint16(20000+i)), Rate: 1, Burst: 1})
	}
	spec3.Rules = append(spec3.Rules, dataplane.RuleSpec{Name: "heir", Protocol: "udp", Ports: ports(8080, 8080), Rate: 10, Burst: 5})
	p3 := compile(t, spec3, p2)
	if p3.Slot("heir") != api {
		t.Fatalf("heir took slot %d, want api's %d", p3.Slot("heir"), api)
	}
	h.apply(t, p3)
	if got := offer(t, h, api, apiFrame, t0+300*second/1000, 10); got != 5 {
		t.Errorf("heir of a drained slot admitted %d of 10, want its full burst of 5", got)
	}
	if _, epoch, err := h.tab.BucketTAT(api); err != nil || epoch != dataplane.Epoch("heir") {
		t.Errorf("slot %d bucket epoch %#x (%v), want heir's %#x", api, epoch, err, dataplane.Epoch("heir"))
	}
}

// TestNewBucketStartsFullAtAnyUptime adds a rule at various clock values
// (bpf_ktime_get_ns is the time since boot) and checks that it starts with
// its full burst. The bucket compares times by wrapping difference, and
// docs/dataplane.md promises the state "stays correct for any uptime", its
// one blind spot being a bucket idle for a multiple of 9.1 years. A new
// rule has been idle for no time at all.
func TestNewBucketStartsFullAtAnyUptime(t *testing.T) {
	h := newHarness(t)
	const day = 24 * 3600 * second
	const year = 365 * day
	for i, up := range []struct {
		name string
		ns   uint64
	}{
		{"1 s", second},
		{"1 year", year},
		{"7 years", 7 * year},
		// 2^58 ns (9.13 years) is where the 2^-6 ns units wrap; the bucket
		// treats a TAT more than StaleAhead (2^53 units, 1.6 days) ahead of
		// now as stale.
		{"2^58 ns - 2 days", 1<<58 - 2*day},
		{"2^58 ns - 1 day", 1<<58 - day},
		{"2^58 ns - 1 s", 1<<58 - second},
		{"2^58 ns", 1 << 58},
		{"2^59 ns - 1 s (18.3 years)", 1<<59 - second},
		{"20 years", 20 * year},
	} {
		t.Run(up.name, func(t *testing.T) {
			h.enter(t)
			// A rule with a new name: a new epoch, so the slot's bucket
			// state is reset by the program.
			name := "rule-" + itoa(i)
			h.apply(t, compile(t, &dataplane.Spec{Rules: []dataplane.RuleSpec{
				{Name: name, Protocol: "udp", Ports: ports(53, 53), Rate: 10, Burst: 5},
			}}, nil))
			slot := h.slot(t, name)
			if got := offer(t, h, slot, build(udpTo(srcA4, 53)), up.ns, 6); got != 5 {
				tat, _, _ := h.tab.BucketTAT(slot)
				t.Errorf("new rule at uptime %d ns admitted %d of 6, want its burst of 5: the bucket's TAT "+
					"is %d, %d units (2^-6 ns) ahead of now, which is within StaleAhead (%d), so it "+
					"looks drained until the clock passes it", up.ns, got, tat,
					int64(tat-up.ns<<dataplane.TimeShift), uint64(dataplane.StaleAhead))
			}
		})
	}
}

// TestEnumsMatchBTF checks the dataplane constants against what bpf2go
// generated from the BTF of the compiled program, and the BTF itself.
func TestEnumsMatchBTF(t *testing.T) {
	// What bpf2go generated, by enumerator name.
	generated := map[string]uint64{
		"XL_PROTO_TCP":              uint64(xdpXlProtoXL_PROTO_TCP),
		"XL_PROTO_UDP":              uint64(xdpXlProtoXL_PROTO_UDP),
		"XL_PROTO_ICMP":             uint64(xdpXlProtoXL_PROTO_ICMP),
		"XL_PROTO_OTHER":            uint64(xdpXlProtoXL_PROTO_OTHER),
		"XL_PROTO_MAX":              uint64(xdpXlProtoXL_PROTO_MAX),
		"XL_VERDICT_PASS":           uint64(xdpXlVerdictXL_VERDICT_PASS),
		"XL_VERDICT_DROP":           uint64(xdpXlVerdictXL_VERDICT_DROP),
		"XL_VERDICT_WOULD_DROP":     uint64(xdpXlVerdictXL_VERDICT_WOULD_DROP),
		"XL_VERDICT_MAX":            uint64(xdpXlVerdictXL_VERDICT_MAX),
		"XL_REASON_NO_RULE":         uint64(xdpXlReasonXL_REASON_NO_RULE),
		"XL_REASON_ALLOW":           uint64(xdpXlReasonXL_REASON_ALLOW),
		"XL_REASON_ADMIT":           uint64(xdpXlReasonXL_REASON_ADMIT),
		"XL_REASON_NOT_IP":          uint64(xdpXlReasonXL_REASON_NOT_IP),
		"XL_REASON_DENY":            uint64(xdpXlReasonXL_REASON_DENY),
		"XL_REASON_RULE":            uint64(xdpXlReasonXL_REASON_RULE),
		"XL_REASON_SOURCE":          uint64(xdpXlReasonXL_REASON_SOURCE),
		"XL_REASON_CONCURRENCY":     uint64(xdpXlReasonXL_REASON_CONCURRENCY),
		"XL_REASON_BREAKER":         uint64(xdpXlReasonXL_REASON_BREAKER),
		"XL_REASON_FRAGMENT":        uint64(xdpXlReasonXL_REASON_FRAGMENT),
		"XL_REASON_MALFORMED_L2":    uint64(xdpXlReasonXL_REASON_MALFORMED_L2),
		"XL_REASON_MALFORMED_L3":    uint64(xdpXlReasonXL_REASON_MALFORMED_L3),
		"XL_REASON_MALFORMED_L4":    uint64(xdpXlReasonXL_REASON_MALFORMED_L4),
		"XL_REASON_EXT_LIMIT":       uint64(xdpXlReasonXL_REASON_EXT_LIMIT),
		"XL_REASON_FRAGMENT_ORPHAN": uint64(xdpXlReasonXL_REASON_FRAGMENT_ORPHAN),
		"XL_REASON_ND_INVALID":      uint64(xdpXlReasonXL_REASON_ND_INVALID),
		"XL_REASON_VLAN_DEPTH":      uint64(xdpXlReasonXL_REASON_VLAN_DEPTH),
		"XL_RESET_SENT":             uint64(xdpXlResetOutcomeXL_RESET_SENT),
		"XL_RESET_UNSUPPORTED":      uint64(xdpXlResetOutcomeXL_RESET_UNSUPPORTED),
		"XL_RESET_NOT_UNICAST":      uint64(xdpXlResetOutcomeXL_RESET_NOT_UNICAST),
		"XL_RESET_RULE_BUDGET":      uint64(xdpXlResetOutcomeXL_RESET_RULE_BUDGET),
		"XL_RESET_NOT_LOCAL":        uint64(xdpXlResetOutcomeXL_RESET_NOT_LOCAL),
		"XL_RESET_GLOBAL_BUDGET":    uint64(xdpXlResetOutcomeXL_RESET_GLOBAL_BUDGET),
		"XL_RESET_MAX":              uint64(xdpXlResetOutcomeXL_RESET_MAX),
		"XL_ANSWER_OK":              uint64(xdpXlAnswerXL_ANSWER_OK),
		"XL_ANSWER_SHAPE":           uint64(xdpXlAnswerXL_ANSWER_SHAPE),
		"XL_ANSWER_FLAGS":           uint64(xdpXlAnswerXL_ANSWER_FLAGS),
		"XL_ANSWER_SRC_MAC":         uint64(xdpXlAnswerXL_ANSWER_SRC_MAC),
		"XL_ANSWER_SRC_IP":          uint64(xdpXlAnswerXL_ANSWER_SRC_IP),
		"XL_ANSWER_DST_MAC":         uint64(xdpXlAnswerXL_ANSWER_DST_MAC),
		"XL_ANSWER_DST_IP":          uint64(xdpXlAnswerXL_ANSWER_DST_IP),
		"XL_ANSWER_SRC_OWN":         uint64(xdpXlAnswerXL_ANSWER_SRC_OWN),
		"XL_ANSWER_SOCKET":          uint64(xdpXlAnswerXL_ANSWER_SOCKET),
		"XL_ANSWER_BUDGET":          uint64(xdpXlAnswerXL_ANSWER_BUDGET),
		"XL_ANSWER_MAX":             uint64(xdpXlAnswerXL_ANSWER_MAX),
		"XL_HOST_MAC":               uint64(xdpXlHostKindXL_HOST_MAC),
		"XL_HOST_IPV4":              uint64(xdpXlHostKindXL_HOST_IPV4),
		"XL_HOST_IPV6":              uint64(xdpXlHostKindXL_HOST_IPV6),
		"XL_HOST_INCOMPLETE":        uint64(xdpXlHostKindXL_HOST_INCOMPLETE),
		"XL_HOST_LEASE":             uint64(xdpXlHostKindXL_HOST_LEASE),
		"XL_REASON_MAX":             uint64(xdpXlReasonXL_REASON_MAX),
		"XL_RULE_ACTIVE":            uint64(xdpXlRuleFlagXL_RULE_ACTIVE),
		"XL_RULE_SHADOW":            uint64(xdpXlRuleFlagXL_RULE_SHADOW),
		"XL_RULE_BYTES":             uint64(xdpXlRuleFlagXL_RULE_BYTES),
		"XL_RULE_FRAG_DROP":         uint64(xdpXlRuleFlagXL_RULE_FRAG_DROP),
		"XL_RULE_PER_SOURCE":        uint64(xdpXlRuleFlagXL_RULE_PER_SOURCE),
		"XL_RULE_BAN":               uint64(xdpXlRuleFlagXL_RULE_BAN),
		"XL_RULE_CONCURRENCY":       uint64(xdpXlRuleFlagXL_RULE_CONCURRENCY),
		"XL_RULE_COOKIE_AUTO":       uint64(xdpXlRuleFlagXL_RULE_COOKIE_AUTO),
		"XL_RULE_COOKIE_ALWAYS":     uint64(xdpXlRuleFlagXL_RULE_COOKIE_ALWAYS),
		"XL_RULE_REFUSE_RESET":      uint64(xdpXlRuleFlagXL_RULE_REFUSE_RESET),
		"XL_REASON_COOKIE":          uint64(xdpXlReasonXL_REASON_COOKIE),
		"XL_G_MALFORMED_PASS":       uint64(xdpXlGlobalFlagXL_G_MALFORMED_PASS),
		"XL_G_PREFIXES_V4":          uint64(xdpXlGlobalFlagXL_G_PREFIXES_V4),
		"XL_G_PREFIXES_V6":          uint64(xdpXlGlobalFlagXL_G_PREFIXES_V6),
		"XL_G_PREFILTER":            uint64(xdpXlGlobalFlagXL_G_PREFILTER),
		"XL_PREFIX_ALLOW":           uint64(xdpXlPrefixFlagXL_PREFIX_ALLOW),
		"XL_PREFIX_DENY":            uint64(xdpXlPrefixFlagXL_PREFIX_DENY),
	}
	want := map[string]uint64{}
	for _, p := range enumPairs() {
		want[p.name] = p.value
		if g, ok := generated[p.name]; !ok || g != p.value {
			t.Errorf("%s: generated %d (present %v), dataplane %d", p.name, g, ok, p.value)
		}
	}
	if len(generated) != len(want) {
		t.Errorf("%d generated enumerators, %d in dataplane", len(generated), len(want))
	}

	// Sizes of the generated structs and their arrays.
	var rule xdpXlRule
	var glob xdpXlGlobals
	var ctr xdpXlCounters
	var k6 xdpXlLpm6Key
	for _, s := range []struct {
		name      string
		got, want int
	}{
		{"xl_rule.name", len(rule.Name), dataplane.NameLen},
		{"xl_globals.portless", len(glob.Portless), int(dataplane.ProtoMax)},
		{"xl_globals.frag_match", len(glob.FragMatch), int(dataplane.ProtoMax)},
		{"xl_counters.packets", len(ctr.Packets), int(dataplane.VerdictMax)},
		{"xl_counters.bytes", len(ctr.Bytes), int(dataplane.VerdictMax)},
		{"xl_counters.reasons", len(ctr.Reasons), int(dataplane.ReasonMax)},
		{"xl_counters.resets", len(ctr.Resets), int(dataplane.ResetMax)},
		{"xl_answer_counters.cookie", len(xdpXlAnswerCounters{}.Cookie), int(dataplane.AnswerMax)},
		{"xl_answer_counters.reset", len(xdpXlAnswerCounters{}.Reset), int(dataplane.AnswerMax)},
		{"sizeof xl_answer_counters", binary.Size(xdpXlAnswerCounters{}), 8 * (2*int(dataplane.AnswerMax) + 1)},
		{"sizeof xl_cookie_link", binary.Size(xdpXlCookieLink{}), 8},
		{"sizeof xl_frag_key", binary.Size(xdpXlFragKey{}), 40},
		{"sizeof xl_frag", binary.Size(xdpXlFrag{}), 32},
		{"sizeof xl_host_key", binary.Size(xdpXlHostKey{}), 24},
		{"sizeof xl_host_addr", binary.Size(xdpXlHostAddr{}), 8},
		{"xl_lpm6_key.addr", len(k6.Addr), 16},
		{"sizeof xl_bucket", binary.Size(xdpXlBucket{}), 16},
		{"sizeof xl_rule", binary.Size(rule), dataplane.NameLen + 8 + 2*16 + 2*8 + 8 + 8},
		{"sizeof xl_limit", binary.Size(xdpXlLimit{}), 48},
		{"sizeof xl_globals", binary.Size(glob), 8*(2*int(dataplane.ProtoMax)+6) + 16 + 8},
		{"sizeof xl_flow_key", binary.Size(xdpXlFlowKey{}), 40},
		{"sizeof xl_flow", binary.Size(xdpXlFlow{}), 16},
		{"sizeof xl_resp_hist", binary.Size(xdpXlRespHist{}), 8 * (3 + dataplane.RespBuckets)},
		{"sizeof xl_prefix", binary.Size(xdpXlPrefix{}), 16},
		{"sizeof xl_bucket_state", binary.Size(xdpXlBucketState{}), 48},
		{"sizeof xl_conns", binary.Size(xdpXlConns{}), 16},
		{"sizeof xl_flood", binary.Size(xdpXlFlood{}), 32 + 16*dataplane.MaxRules},
		{"sizeof xl_src_credit", binary.Size(xdpXlSrcCredit{}), binary.Size(xdpXlSourceKey{}) + 3*8 + 8},
		{"sizeof xl_src_way", binary.Size(xdpXlSrcWay{}), 32},
		{"sizeof xl_src_set", binary.Size(xdpXlSrcSet{}), dataplane.SrcSetSize},
		{"xl_src_set.way", len(xdpXlSrcSet{}.Way), dataplane.SrcWays},
		{"sizeof xl_src_ext", binary.Size(xdpXlSrcExt{}), 32},
		{"sizeof xl_src_ext_set", binary.Size(xdpXlSrcExtSet{}), dataplane.SrcExtSetSize},
		{"xl_src_ext_set.ext", len(xdpXlSrcExtSet{}.Ext), dataplane.SrcWays},
		{"sizeof xl_sk_conn", binary.Size(xdpXlSkConn{}), 8},
		{"sizeof xl_counters", binary.Size(ctr), 8 * (2*int(dataplane.VerdictMax) + int(dataplane.ReasonMax) + int(dataplane.ResetMax))},
	} {
		if s.got != s.want {
			t.Errorf("%s: %d, want %d", s.name, s.got, s.want)
		}
	}

	spec, err := Spec()
	if err != nil {
		t.Fatal(err)
	}
	// Map geometry follows the constants.
	for _, m := range []struct {
		name       string
		entries    uint32
		value      int
		valueBytes uint32
	}{
		{xdpMapXlGen, 1, 0, 4},
		{xdpMapXlConfig, dataplane.Generations, binary.Size(glob), 0},
		{xdpMapXlRules, dataplane.Generations * dataplane.MaxRules, binary.Size(rule), 0},
		{xdpMapXlPorts, dataplane.Generations * dataplane.PortProtos * dataplane.Ports, 0, 8},
		{xdpMapXlLimits, dataplane.MaxRules, binary.Size(xdpXlLimit{}), 0},
		{xdpMapXlBuckets, dataplane.MaxRules, binary.Size(xdpXlBucketState{}), 0},
		{xdpMapXlStats, dataplane.CounterSlots, binary.Size(ctr), 0},
		{xdpMapXlCaches, dataplane.MaxRules, binary.Size(xdpXlCache{}), 0},
		{xdpMapXlConns, dataplane.MaxRules, binary.Size(xdpXlConns{}), 0},
		{xdpMapXlFrags, dataplane.FragEntries, binary.Size(xdpXlFrag{}), 0},
		{xdpMapXlHostAddrs, dataplane.HostAddrsMax, binary.Size(xdpXlHostAddr{}), 0},
		{xdpMapXlResetBudget, 1, 0, 8},
		{xdpMapXlServed, dataplane.MaxRules, 0, 8},
		{xdpMapXlRespFlows, dataplane.RespFlows, binary.Size(xdpXlFlow{}), 0},
		{xdpMapXlRespHists, dataplane.MaxRules, binary.Size(xdpXlRespHist{}), 0},
		{xdpMapXlRequests, dataplane.MaxRules, binary.Size(xdpXlRequests{}), 0},
		{xdpMapXlFlood, 1, binary.Size(xdpXlFlood{}), 0},
		{xdpMapXlSrcCredits, dataplane.MaxRules, binary.Size(xdpXlSrcCredit{}), 0},
		{xdpMapXlSrcTable, uint32(dataplane.SrcSets(0)), binary.Size(xdpXlSrcSet{}), 0},
		{xdpMapXlSrcExts, uint32(dataplane.SrcSets(0)), binary.Size(xdpXlSrcExtSet{}), 0},
	} {
		ms := spec.Maps[m.name]
		if ms == nil {
			t.Errorf("map %s missing from the spec", m.name)
			continue
		}
		want := m.valueBytes
		if m.value != 0 {
			want = uint32(m.value)
		}
		if ms.MaxEntries != m.entries || ms.ValueSize != want {
			t.Errorf("map %s: %d entries of %d bytes, want %d of %d", m.name, ms.MaxEntries, ms.ValueSize, m.entries, want)
		}
	}

	// Every enumerator in the BTF is known to dataplane with the same
	// value, and the names dataplane prints are the enumerators' names.
	names := map[string]func(v uint64) string{
		"xl_proto":         func(v uint64) string { return dataplane.Proto(v).String() },
		"xl_verdict":       func(v uint64) string { return dataplane.Verdict(v).String() },
		"xl_reason":        func(v uint64) string { return dataplane.Reason(v).String() },
		"xl_reset_outcome": func(v uint64) string { return dataplane.ResetOutcome(v).String() },
		"xl_answer":        func(v uint64) string { return dataplane.Answer(v).String() },
	}
	seen := map[string]bool{}
	for _, enumName := range []string{"xl_proto", "xl_verdict", "xl_reason", "xl_rule_flag", "xl_global_flag", "xl_prefix_flag", "xl_reset_outcome", "xl_host_kind", "xl_answer"} {
		var e *btf.Enum
		if err := spec.Types.TypeByName(enumName, &e); err != nil {
			t.Errorf("enum %s: %v", enumName, err)
			continue
		}
		if e.Size != 4 {
			t.Errorf("enum %s: %d bytes, want 4", enumName, e.Size)
		}
		prefix := strings.ToUpper(enumName) + "_" // XL_REASON_ for xl_reason
		if enumName == "xl_reset_outcome" {
			prefix = "XL_RESET_"
		}
		for _, v := range e.Values {
			if w, ok := want[v.Name]; !ok || w != v.Value {
				t.Errorf("%s: %s = %d in BTF; dataplane has %d (present %v)", enumName, v.Name, v.Value, w, ok)
			}
			seen[v.Name] = true
			if str := names[enumName]; str != nil && !strings.HasSuffix(v.Name, "_MAX") {
				if got, w := str(v.Value), strings.ToLower(strings.TrimPrefix(v.Name, prefix)); got != w {
					t.Errorf("%s: dataplane prints %q, want %q", v.Name, got, w)
				}
			}
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("%s: in dataplane, not in the BTF", name)
		}
	}
}

type enumPair struct {
	name  string
	value uint64
}

// enumPairs is every enumerator of types.h with dataplane's value.
func enumPairs() []enumPair {
	return []enumPair{
		{"XL_PROTO_TCP", uint64(dataplane.ProtoTCP)}, {"XL_PROTO_UDP", uint64(dataplane.ProtoUDP)},
		{"XL_PROTO_ICMP", uint64(dataplane.ProtoICMP)}, {"XL_PROTO_OTHER", uint64(dataplane.ProtoOther)},
		{"XL_PROTO_MAX", uint64(dataplane.ProtoMax)},
		{"XL_VERDICT_PASS", uint64(dataplane.VerdictPass)}, {"XL_VERDICT_DROP", uint64(dataplane.VerdictDrop)},
		{"XL_VERDICT_WOULD_DROP", uint64(dataplane.VerdictWouldDrop)}, {"XL_VERDICT_MAX", uint64(dataplane.VerdictMax)},
		{"XL_REASON_NO_RULE", uint64(dataplane.ReasonNoRule)}, {"XL_REASON_ALLOW", uint64(dataplane.ReasonAllow)},
		{"XL_REASON_ADMIT", uint64(dataplane.ReasonAdmit)}, {"XL_REASON_NOT_IP", uint64(dataplane.ReasonNotIP)},
		{"XL_REASON_DENY", uint64(dataplane.ReasonDeny)}, {"XL_REASON_RULE", uint64(dataplane.ReasonRule)},
		{"XL_REASON_SOURCE", uint64(dataplane.ReasonSource)}, {"XL_REASON_CONCURRENCY", uint64(dataplane.ReasonConcurrency)},
		{"XL_REASON_BREAKER", uint64(dataplane.ReasonBreaker)}, {"XL_REASON_FRAGMENT", uint64(dataplane.ReasonFragment)},
		{"XL_REASON_MALFORMED_L2", uint64(dataplane.ReasonMalformedL2)},
		{"XL_REASON_MALFORMED_L3", uint64(dataplane.ReasonMalformedL3)},
		{"XL_REASON_MALFORMED_L4", uint64(dataplane.ReasonMalformedL4)},
		{"XL_REASON_EXT_LIMIT", uint64(dataplane.ReasonExtLimit)}, {"XL_REASON_MAX", uint64(dataplane.ReasonMax)},
		{"XL_REASON_FRAGMENT_ORPHAN", uint64(dataplane.ReasonFragOrphan)},
		{"XL_REASON_ND_INVALID", uint64(dataplane.ReasonNDInvalid)},
		{"XL_REASON_VLAN_DEPTH", uint64(dataplane.ReasonVLANDepth)},
		{"XL_REASON_COOKIE", uint64(dataplane.ReasonCookie)},
		{"XL_RESET_SENT", uint64(dataplane.ResetSent)}, {"XL_RESET_UNSUPPORTED", uint64(dataplane.ResetUnsupported)},
		{"XL_RESET_NOT_UNICAST", uint64(dataplane.ResetNotUnicast)}, {"XL_RESET_RULE_BUDGET", uint64(dataplane.ResetRuleBudget)},
		{"XL_RESET_NOT_LOCAL", uint64(dataplane.ResetNotLocal)}, {"XL_RESET_GLOBAL_BUDGET", uint64(dataplane.ResetGlobalBudget)},
		{"XL_RESET_MAX", uint64(dataplane.ResetMax)},
		{"XL_ANSWER_OK", uint64(dataplane.AnswerOK)}, {"XL_ANSWER_SHAPE", uint64(dataplane.AnswerShape)},
		{"XL_ANSWER_FLAGS", uint64(dataplane.AnswerFlags)}, {"XL_ANSWER_SRC_MAC", uint64(dataplane.AnswerSrcMAC)},
		{"XL_ANSWER_SRC_IP", uint64(dataplane.AnswerSrcIP)}, {"XL_ANSWER_DST_MAC", uint64(dataplane.AnswerDstMAC)},
		{"XL_ANSWER_DST_IP", uint64(dataplane.AnswerDstIP)}, {"XL_ANSWER_SRC_OWN", uint64(dataplane.AnswerSrcOwn)},
		{"XL_ANSWER_SOCKET", uint64(dataplane.AnswerSocket)}, {"XL_ANSWER_BUDGET", uint64(dataplane.AnswerBudget)},
		{"XL_ANSWER_MAX", uint64(dataplane.AnswerMax)},
		{"XL_HOST_MAC", uint64(dataplane.HostMAC)}, {"XL_HOST_IPV4", uint64(dataplane.HostIPv4)},
		{"XL_HOST_IPV6", uint64(dataplane.HostIPv6)},
		{"XL_HOST_INCOMPLETE", uint64(dataplane.HostIncomplete)},
		{"XL_HOST_LEASE", uint64(dataplane.HostLease)},
		{"XL_RULE_ACTIVE", uint64(dataplane.RuleActive)}, {"XL_RULE_SHADOW", uint64(dataplane.RuleShadow)},
		{"XL_RULE_BYTES", uint64(dataplane.RuleBytes)}, {"XL_RULE_FRAG_DROP", uint64(dataplane.RuleFragDrop)},
		{"XL_RULE_PER_SOURCE", uint64(dataplane.RulePerSource)}, {"XL_RULE_BAN", uint64(dataplane.RuleBan)},
		{"XL_RULE_CONCURRENCY", uint64(dataplane.RuleConcurrency)},
		{"XL_RULE_COOKIE_AUTO", uint64(dataplane.RuleCookieAuto)}, {"XL_RULE_COOKIE_ALWAYS", uint64(dataplane.RuleCookieAlways)},
		{"XL_RULE_REFUSE_RESET", uint64(dataplane.RuleRefuseReset)},
		{"XL_G_MALFORMED_PASS", uint64(dataplane.GlobalMalformedPass)},
		{"XL_G_PREFIXES_V4", uint64(dataplane.GlobalPrefixesV4)}, {"XL_G_PREFIXES_V6", uint64(dataplane.GlobalPrefixesV6)},
		{"XL_G_PREFILTER", uint64(dataplane.GlobalPrefilter)},
		{"XL_PREFIX_ALLOW", uint64(dataplane.PrefixAllow)}, {"XL_PREFIX_DENY", uint64(dataplane.PrefixDeny)},
	}
}
