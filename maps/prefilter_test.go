//go:build linux

package maps

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// readPrefilter reads a generation's prefilter back.
func (t *Tables) readPrefilter(gen uint32) (*dataplane.Prefilter, error) {
	f := &dataplane.Prefilter{}
	for i := range dataplane.PrefilterWords {
		if err := t.prefilter.Lookup(prefilterKey(gen, false, i), &f.V4[i]); err != nil {
			return nil, fmt.Errorf("read prefilter: %w", err)
		}
		if err := t.prefilter.Lookup(prefilterKey(gen, true, i), &f.V6[i]); err != nil {
			return nil, fmt.Errorf("read prefilter: %w", err)
		}
	}
	return f, nil
}

// pfPlans are the plans of TestPrefilterMatchesTrie, applied in turn: every
// prefix length of the issue, then without /0 and the IPv6 prefixes
// shorter than /32 (which fill their family's bitmap), then without the
// short IPv4 ones either. Frames go to UDP port 53, whose rule "src" has
// sources, and to 54, whose rule has none.
func pfPlans() []*dataplane.Spec {
	mk := func(allow, deny, sources []string) *dataplane.Spec {
		var s dataplane.Spec
		for _, p := range allow {
			s.Allow = append(s.Allow, pfx(p))
		}
		for _, p := range deny {
			s.Deny = append(s.Deny, pfx(p))
		}
		var src []netip.Prefix
		for _, p := range sources {
			src = append(src, pfx(p))
		}
		s.Rules = []dataplane.RuleSpec{
			{Name: "src", Protocol: "udp", Ports: ports(53, 53), Rate: 1e9, Burst: 1e9, Sources: src},
			{Name: "all", Protocol: "udp", Ports: ports(54, 54), Rate: 1e9, Burst: 1e9},
		}
		return &s
	}
	return []*dataplane.Spec{
		mk([]string{"10.0.0.0/8", "198.51.100.7/32", "2001:db8:a::/48", "2001:db8:ff::1/128"},
			[]string{"172.16.0.0/15", "192.168.128.0/17", "2a00:1450::/31", "2001:db9::/32"},
			[]string{"0.0.0.0/0", "100.64.0.0/16", "203.0.113.0/24", "10.20.0.0/16", "::/0", "2400::/16", "2001:db8:1::/48"}),
		mk([]string{"10.0.0.0/8", "198.51.100.7/32", "2001:db8:a::/48", "2001:db8:ff::1/128"},
			[]string{"172.16.0.0/15", "192.168.128.0/17", "2001:db9::/32"},
			[]string{"100.64.0.0/16", "203.0.113.0/24", "10.20.0.0/16", "2001:db8:1::/48"}),
		mk([]string{"198.51.100.7/32", "2001:db8:a::/48", "2001:db8:ff::1/128"},
			[]string{"192.168.128.0/17"},
			[]string{"203.0.113.0/24", "2001:db8:1::/48"}),
	}
}

// pfProbes are addresses around each prefix of the plans: its first and
// last address and one in between, the addresses just outside it, one in
// the same /16 (IPv4) or with the same top 32 bits (IPv6) but outside
// it, where the prefilter lets the lookup happen and the trie finds
// nothing, and one far away.
func pfProbes(specs []*dataplane.Spec) []netip.Addr {
	seen := map[netip.Addr]bool{}
	var out []netip.Addr
	add := func(a netip.Addr) {
		if a.IsValid() && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	var all []netip.Prefix
	for _, s := range specs {
		all = append(all, s.Allow...)
		all = append(all, s.Deny...)
		for _, r := range s.Rules {
			all = append(all, r.Sources...)
		}
	}
	for _, p := range all {
		first := p.Masked().Addr()
		last := lastAddr(p)
		add(first)
		add(last)
		add(first.Next().Next().Next())
		add(first.Prev())
		add(last.Next())
		b := first.AsSlice()
		if first.Is4() {
			b[2] ^= 0x80 // same /16
			b[3] ^= 0x01
		} else {
			b[4] ^= 0x80 // same top 32 bits
			b[15] ^= 0x01
		}
		a, _ := netip.AddrFromSlice(b)
		add(a)
		b[0] ^= 0x40 // far
		a, _ = netip.AddrFromSlice(b)
		add(a)
	}
	for _, a := range []string{"192.0.2.10", "8.8.8.8", "255.255.255.255", "0.0.0.1", "2001:db8:1::10", "fe80::1", "::1", "2606:4700::1111"} {
		add(netip.MustParseAddr(a))
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// pfProbe runs one frame from src to port in the kernel and the model and
// returns how they differ ("" when they agree): the verdict, and every
// slot's counters, whose global slot holds the reason (allow, deny,
// no_rule, admit) and the rules' slots which rules matched.
func pfProbe(tb testing.TB, h *harness, src netip.Addr, port uint16, now uint64) string {
	tb.Helper()
	f := build(udpTo(src, port))
	pass := h.kernelRun(tb, f, now, 1)
	res := h.model.Eval(f, now)
	if diff := diffCounters(h.counters(tb), h.model.Counters, h.plan); pass != res.Pass() || diff != "" {
		return fmt.Sprintf("%s to port %d: kernel pass=%v, model (the trie) %v/%v; counters:%s", src, port, pass, res.Verdict, res.Reason, diff)
	}
	return ""
}

// TestPrefilterMatchesTrie applies plans with prefixes of every length in
// turn, in both generations, reloads that remove prefixes included, and
// checks for addresses inside, just outside and far from each prefix that
// the program decides as the Go model does, which looks every source up
// in the plan's prefixes (Plan.Lookup: the trie's answer). It checks too
// that the bitmap written is the plan's, that the probes meet both a
// skipped lookup and a useless one, and that a wrong bitmap is caught.
func TestPrefilterMatchesTrie(t *testing.T) {
	h := newHarness(t)
	specs := pfPlans()
	probes := pfProbes(specs)
	now := uint64(second)
	var plan *dataplane.Plan
	var skipped, useless int
	// Each plan twice: generation 1, 0, 1 for the first round, 0, 1, 0
	// for the second.
	for round := range 2 {
		for i, s := range specs {
			plan = compile(t, s, plan)
			h.apply(t, plan)
			gen, err := h.tab.ActiveGeneration()
			if err != nil {
				t.Fatal(err)
			}
			var g xdpXlGlobals
			if err := h.tab.config.Lookup(gen, &g); err != nil {
				t.Fatal(err)
			}
			if g.Flags&dataplane.GlobalPrefilter == 0 {
				t.Fatalf("plan %d: generation %d written without XL_G_PREFILTER", i, gen)
			}
			got, err := h.tab.readPrefilter(gen)
			if err != nil {
				t.Fatal(err)
			}
			want := plan.Prefilter()
			if *got != *want {
				t.Fatalf("plan %d: generation %d's prefilter is not the plan's", i, gen)
			}
			for _, a := range probes {
				for _, port := range []uint16{53, 54} {
					now += 1000
					if d := pfProbe(t, h, a, port, now); d != "" {
						t.Fatalf("round %d, plan %d (generation %d): %s", round, i, gen, d)
					}
				}
				switch {
				case !want.MayContain(a):
					skipped++
				case plan.Lookup(a) == nil:
					useless++
				}
			}
		}
	}
	t.Logf("%d probes × %d plans × 2 rounds: %d lookups skipped, %d made that found nothing", len(probes), len(specs), skipped, useless)
	if skipped == 0 || useless == 0 {
		t.Fatalf("the probes skipped %d lookups and made %d useless ones: they do not exercise both", skipped, useless)
	}

	// The test can fail: a bitmap that says nothing is listed (wrong for
	// every listed source) must show as an allowlisted source limited.
	gen, err := h.tab.ActiveGeneration()
	if err != nil {
		t.Fatal(err)
	}
	if err := h.tab.writePrefilter(gen, &dataplane.Prefilter{}); err != nil {
		t.Fatal(err)
	}
	allowed := netip.MustParseAddr("198.51.100.7")
	if e := h.plan.Lookup(allowed); e == nil || e.Flags&dataplane.PrefixAllow == 0 {
		t.Fatalf("%s is not allowlisted in the last plan", allowed)
	}
	if d := pfProbe(t, h, allowed, 54, now+1000); d == "" {
		t.Fatal("an empty prefilter went unnoticed")
	}
}

// TestPrefilterOldPins: a daemon upgraded over pins of an xlimit from
// before the prefilter finds no xl_prefilter pinned. The loader creates it
// (all zero), and until the daemon writes a generation the one in force,
// written without XL_G_PREFILTER, is looked up as before: a listed source
// is not skipped.
func TestPrefilterOldPins(t *testing.T) {
	requireRoot(t)
	pins := privatePinDir(t)
	old, err := Load(Options{PinDir: pins})
	if err != nil {
		t.Fatal(err)
	}
	plan := compile(t, &dataplane.Spec{
		Allow: []netip.Prefix{pfx("198.51.100.0/24")},
		Rules: []dataplane.RuleSpec{{Name: "drop", Protocol: "udp", Ports: ports(54, 54), Rate: 0.001, Burst: 1}},
	}, nil)
	if err := old.Tables().Apply(plan); err != nil {
		t.Fatal(err)
	}
	// What an old daemon leaves: the generation in force without the
	// flag, and no xl_prefilter.
	tab := old.Tables()
	gen, err := tab.ActiveGeneration()
	if err != nil {
		t.Fatal(err)
	}
	var g xdpXlGlobals
	if err := tab.config.Lookup(gen, &g); err != nil {
		t.Fatal(err)
	}
	g.Flags &^= dataplane.GlobalPrefilter
	if err := tab.config.Update(gen, &g, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	old.Close()
	if err := os.Remove(filepath.Join(pins, xdpMapXlPrefilter)); err != nil {
		t.Fatal(err)
	}

	// Read-only access to such pins (xlimit status) works without it.
	ro, err := OpenPinned(pins, true)
	if err != nil {
		t.Fatalf("open pins without %s: %v", xdpMapXlPrefilter, err)
	}
	if ro.prefilter != nil {
		t.Errorf("%s opened, but it is not pinned", xdpMapXlPrefilter)
	}
	if back, err := ro.ReadPlan(); err != nil || back.Globals.Flags != plan.Globals.Flags {
		t.Errorf("read plan back: flags %#x, want %#x (%v)", back.Globals.Flags, plan.Globals.Flags, err)
	}
	ro.Close()

	o, err := Load(Options{PinDir: pins})
	if err != nil {
		t.Fatalf("load over pins without %s: %v", xdpMapXlPrefilter, err)
	}
	defer o.Close()
	if _, err := os.Stat(filepath.Join(pins, xdpMapXlPrefilter)); err != nil {
		t.Fatalf("%s not pinned by the new load: %v", xdpMapXlPrefilter, err)
	}
	frame := build(udpTo(netip.MustParseAddr("198.51.100.9"), 54))
	for i := range 3 {
		ret, _, err := o.Program().Benchmark(frame, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if ret != xdpPass {
			t.Fatalf("run %d: an allowlisted source returned %d under the old generation (prefilter all zero)", i, ret)
		}
	}
	// Once the new daemon writes its plan, the prefilter is in force and
	// still lets the listed source through.
	if err := o.Tables().Apply(plan); err != nil {
		t.Fatal(err)
	}
	if ret, _, err := o.Program().Benchmark(frame, 1, nil); err != nil || ret != xdpPass {
		t.Fatalf("after the new daemon's plan: returned %d (%v)", ret, err)
	}
	if ret, _, err := o.Program().Benchmark(build(udpTo(netip.MustParseAddr("198.51.101.9"), 54)), 3, nil); err != nil || ret != xdpDrop {
		t.Fatalf("an unlisted source: returned %d (%v), want a drop", ret, err)
	}
}
