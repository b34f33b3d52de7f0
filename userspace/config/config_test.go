package config

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// doc joins lines into a YAML document, so that line numbers in the
// expectations can be read off the case.
func doc(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

// rule returns a valid rule (lines 1-4 of the document) followed by extra
// lines, each indented into the rule's mapping from line 5 on.
func rule(extra ...string) string {
	lines := []string{"rules:", "  - name: r", "    protocol: tcp", "    rate: 100"}
	for _, l := range extra {
		lines = append(lines, "    "+l)
	}
	return doc(lines...)
}

func mustParse(t *testing.T, src string) *Config {
	t.Helper()
	c, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

// TestDesignDocExample keeps docs/design.md true: every YAML block of it is a
// valid rules file.
func TestDesignDocExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for rest := string(doc); ; {
		_, after, ok := strings.Cut(rest, "```yaml\n")
		if !ok {
			break
		}
		block, tail, ok := strings.Cut(after, "```")
		if !ok {
			t.Fatal("docs/design.md: a yaml block is not closed")
		}
		blocks++
		if _, err := Parse("docs/design.md", []byte(block)); err != nil {
			t.Errorf("docs/design.md yaml block %d is not a valid rules file: %v", blocks, err)
		}
		rest = tail
	}
	if blocks == 0 {
		t.Error("docs/design.md has no yaml example")
	}
}

func TestDesignExample(t *testing.T) {
	// The rules file of the first brief (testdata/design.yaml), the subset of
	// docs/design.md §10's example that it grew from. Its rule has behavior reject
	// and also warm_up, paced and adaptive sections: those are decoded and
	// validated, reported as warnings and left out of the Config.
	c, err := Load("testdata/design.yaml")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(c.Rules) != 1 {
		t.Fatalf("got %d rules, want 1", len(c.Rules))
	}
	r := c.Rules[0]
	want := Rule{
		Name: "web", Protocol: ProtoTCP,
		Ports:   []dataplane.PortRange{{Lo: 80, Hi: 80}, {Lo: 443, Hi: 443}, {Lo: 8000, Hi: 8100}},
		SynOnly: true,
		Sources: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")},
		Unit:    UnitPackets, Rate: 1000, Burst: 200, Behavior: BehaviorReject,
		PerSource:   &PerSource{Rate: 50, Burst: 10, PrefixV4: 32, PrefixV6: 64},
		Concurrency: &Concurrency{Soft: 400, Max: 500},
		CircuitBreaker: &CircuitBreaker{SlowLatency: 200 * time.Millisecond, SlowRatio: 0.5, ErrorRatio: 0.5,
			MinRequests: 5, Window: time.Second, RetryTimeout: 10 * time.Second, HalfOpenProbes: 1},
		Fragments: FragmentsLimit,
		Line:      5,
	}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("rule:\n got %+v\nwant %+v", r, want)
	}
	if got, want := c.Interfaces, []string{"eth0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("interfaces = %v, want %v", got, want)
	}
	if got, want := fmt.Sprint(c.Allow, c.Deny), "[10.0.0.0/8 2001:db8::/32] [192.0.2.0/24]"; got != want {
		t.Errorf("allow, deny = %s, want %s", got, want)
	}
	if c.System == nil || c.System.CPUHigh != 0.9 {
		t.Errorf("system = %+v, want cpu_high 0.9", c.System)
	}
	var warns []string
	for _, w := range c.Warnings {
		warns = append(warns, fmt.Sprintf("%d: %s", w.Line, w.Field))
	}
	if want := []string{"14: rules[0].warm_up", "15: rules[0].paced", "16: rules[0].adaptive"}; !reflect.DeepEqual(warns, want) {
		t.Errorf("warnings = %q, want %q", warns, want)
	}
	if w := c.Warnings[0].Error(); w != "testdata/design.yaml:14: rules[0].warm_up: ignored: behavior is reject, and warm_up applies only to warm_up and warm_up_paced" {
		t.Errorf("warning text = %q", w)
	}
}

func TestDocExamples(t *testing.T) {
	// Every yaml block of the reference must be a valid rules file.
	data, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Skipf("docs not found: %v", err)
	}
	blocks := strings.Split(string(data), "```yaml\n")[1:]
	if len(blocks) == 0 {
		t.Fatal("no yaml blocks in docs/config.md")
	}
	for i, b := range blocks {
		src, _, _ := strings.Cut(b, "```")
		if _, err := Parse(fmt.Sprintf("docs/config.md block %d", i), []byte(src)); err != nil {
			t.Error(err)
		}
	}
}

func TestFullExample(t *testing.T) {
	c, err := Load("testdata/full.yaml")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("unexpected warnings: %v", c.Warnings)
	}
	if c.Malformed != VerdictPass || c.SourceTableSize != 131072 {
		t.Errorf("malformed, source_table_size = %s, %d", c.Malformed, c.SourceTableSize)
	}
	if got, want := fmt.Sprint(c.Allow), "[10.0.0.0/8 2001:db8::/32 192.0.2.7/32 2001:db8:1::1/128]"; got != want {
		t.Errorf("allow = %s, want %s", got, want)
	}
	if got, want := c.Interfaces, []string{"eth0", "bond0.100"}; !reflect.DeepEqual(got, want) {
		t.Errorf("interfaces = %v, want %v", got, want)
	}
	byName := map[string]Rule{}
	for _, r := range c.Rules {
		byName[r.Name] = r
	}
	web := byName["web"]
	if got, want := fmt.Sprint(web.Ports), "[443 80 8000-8100 8050-8200]"; got != want {
		t.Errorf("web ports as written = %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(web.MergedPorts()), "[80 443 8000-8200]"; got != want {
		t.Errorf("web merged ports = %s, want %s", got, want)
	}
	if want := (&Ban{After: 5 * time.Second, Duration: time.Minute}); !reflect.DeepEqual(web.PerSource.Ban, want) {
		t.Errorf("ban = %+v, want %+v", web.PerSource.Ban, want)
	}
	if web.Fragments != FragmentsLimit || web.CircuitBreaker.HalfOpenProbes != 3 || web.Line != 9 {
		t.Errorf("web = %+v", web)
	}
	if w := byName["api_warm"].WarmUp; w == nil || w.Period != 10*time.Second || w.ColdFactor != 3 {
		t.Errorf("api_warm warm_up = %+v", w)
	}
	dns := byName["dns"]
	if dns.Unit != UnitBytes || dns.Paced == nil || dns.Paced.Queue != QueueKernel || !dns.Shadow {
		t.Errorf("dns = %+v paced %+v", dns, dns.Paced)
	}
	wp := byName["grpc-warm-paced"]
	if wp.WarmUp == nil || wp.Paced == nil || wp.Paced.MaxQueueingTime != 100*time.Millisecond || wp.Paced.Queue != QueueNone {
		t.Errorf("grpc-warm-paced = %+v", wp)
	}
	a := byName["backend"].Adaptive
	wantA := &Adaptive{Law: LawAIMD, AdaptiveParams: AdaptiveParams{TargetLatency: 25 * time.Millisecond, MinRate: 1000,
		MaxRate: 12000, KA: 40, KM: 0.4, Gamma: 0.6, Alpha: 0.3, CPUHigh: 0.7, ErrorThreshold: 0.1}, Signal: SignalProbe,
		Probe: &Probe{Kind: ProbeHTTP, Address: "127.0.0.1:8080", Path: "/healthz", Interval: 2 * time.Second, Timeout: time.Second}}
	if !reflect.DeepEqual(a, wantA) {
		t.Errorf("adaptive:\n got %+v %+v\nwant %+v %+v", a, a.Probe, wantA, wantA.Probe)
	}
	if ping := byName["ping"]; ping.Protocol != ProtoICMP || len(ping.Ports) != 0 {
		t.Errorf("ping = %+v", ping)
	}
}

func TestDefaults(t *testing.T) {
	c, err := Load("testdata/minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Malformed != VerdictDrop || c.SourceTableSize != DefaultSourceTableSize || c.System != nil ||
		c.Interfaces != nil || c.Allow != nil || c.Deny != nil || c.Warnings != nil {
		t.Errorf("config defaults: %+v", c)
	}
	want := Rule{Name: "ssh", Protocol: ProtoTCP, Ports: []dataplane.PortRange{{Lo: 22, Hi: 22}}, Unit: UnitPackets, Rate: 20,
		Behavior: BehaviorReject, Fragments: FragmentsLimit, Line: 2}
	if !reflect.DeepEqual(c.Rules[0], want) {
		t.Errorf("rule defaults:\n got %+v\nwant %+v", c.Rules[0], want)
	}

	sections := []struct {
		name string
		src  string
		got  func(r *Rule) any
		want any
	}{
		{"paced without section", rule("behavior: paced"),
			func(r *Rule) any { return r.Paced }, &Paced{MaxQueueingTime: 500 * time.Millisecond, Queue: QueueNone}},
		{"warm_up cold factor", rule("behavior: warm_up", "warm_up: {period: 5s}"),
			func(r *Rule) any { return r.WarmUp }, &WarmUp{Period: 5 * time.Second, ColdFactor: 3}},
		{"adaptive", rule("behavior: adaptive", "adaptive: {target_latency: 10ms, min_rate: 50, max_rate: 500}"),
			func(r *Rule) any { return r.Adaptive }, &Adaptive{Law: LawTrack, AdaptiveParams: AdaptiveParams{TargetLatency: 10 * time.Millisecond,
				MinRate: 50, MaxRate: 500, KA: 50, KM: 0.5, Gamma: 0.5, Alpha: 0.2, CPUHigh: 0.8, ErrorThreshold: 0.05},
				Signal: SignalAcceptQueue}},
		{"probe", rule("behavior: adaptive", "adaptive: {target_latency: 10ms, min_rate: 50, max_rate: 500, signal: probe,",
			"  probe: {kind: http, address: \"[::1]:80\"}}"),
			func(r *Rule) any { return r.Adaptive.Probe }, &Probe{Kind: ProbeHTTP, Address: "[::1]:80", Path: "/", Interval: time.Second, Timeout: 500 * time.Millisecond}},
		{"tcp probe has no path", rule("behavior: adaptive", "adaptive: {target_latency: 10ms, min_rate: 50, max_rate: 500, signal: probe,",
			"  probe: {kind: tcp, address: \"localhost:22\"}}"),
			func(r *Rule) any { return r.Adaptive.Probe }, &Probe{Kind: ProbeTCP, Address: "localhost:22", Interval: time.Second, Timeout: 500 * time.Millisecond}},
		{"per_source", rule("per_source: {rate: 0.5}"),
			func(r *Rule) any { return r.PerSource }, &PerSource{Rate: 0.5, Burst: 1, PrefixV4: 32, PrefixV6: 64}},
		{"per_source burst", rule("per_source: {rate: 30}"),
			func(r *Rule) any { return r.PerSource }, &PerSource{Rate: 30, Burst: 30, PrefixV4: 32, PrefixV6: 64}},
		{"ban after", rule("per_source: {rate: 30, ban: {duration: 10m}}"),
			func(r *Rule) any { return r.PerSource.Ban }, &Ban{Duration: 10 * time.Minute}},
		{"concurrency soft", rule("concurrency: {max: 100}"),
			func(r *Rule) any { return r.Concurrency }, &Concurrency{Soft: 100, Max: 100}},
		{"breaker", rule("circuit_breaker: {error_ratio: 0.2}"),
			func(r *Rule) any { return r.CircuitBreaker }, &CircuitBreaker{ErrorRatio: 0.2, MinRequests: 5,
				Window: time.Second, RetryTimeout: 10 * time.Second, HalfOpenProbes: 1}},
		{"null lists and sections", doc("interfaces:", "allow:", "rules:"),
			func(*Rule) any { return nil }, nil},
	}
	for _, tc := range sections {
		t.Run(tc.name, func(t *testing.T) {
			c := mustParse(t, tc.src)
			if len(c.Rules) == 0 {
				return
			}
			if got := tc.got(&c.Rules[0]); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestEffectiveBurst(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name string
		r    Rule
		want float64
	}{
		{"paced golden: rate 10, 500ms", Rule{Rate: 10, Behavior: BehaviorPaced, Paced: &Paced{MaxQueueingTime: 500 * ms}}, 6},
		{"paced default queueing time", Rule{Rate: 10, Behavior: BehaviorPaced}, 6},
		{"warm_up_paced", Rule{Rate: 1000, Behavior: BehaviorWarmUpPaced, Paced: &Paced{MaxQueueingTime: 20 * ms}}, 21},
		{"paced fractional", Rule{Rate: 3, Behavior: BehaviorPaced, Paced: &Paced{MaxQueueingTime: 500 * ms}}, 2.5},
		{"paced bytes", Rule{Unit: UnitBytes, Rate: 1e6, Behavior: BehaviorPaced, Paced: &Paced{MaxQueueingTime: 10 * ms}}, 10000},
		{"paced bytes at least one frame", Rule{Unit: UnitBytes, Rate: 1e4, Behavior: BehaviorPaced, Paced: &Paced{MaxQueueingTime: 10 * ms}}, 1514},
		{"paced ignores burst", Rule{Rate: 10, Burst: 99, Behavior: BehaviorPaced, Paced: &Paced{MaxQueueingTime: 500 * ms}}, 6},
		{"explicit burst", Rule{Rate: 1000, Burst: 200}, 200},
		{"default one second", Rule{Rate: 1000}, 1000},
		{"default at least one packet", Rule{Rate: 0.1}, 1},
		{"adaptive default", Rule{Rate: 500, Behavior: BehaviorAdaptive}, 500},
		{"bytes default", Rule{Unit: UnitBytes, Rate: 1e6}, 1e6},
		{"bytes default at least 64KiB", Rule{Unit: UnitBytes, Rate: 1000}, 65535},
		{"bytes explicit", Rule{Unit: UnitBytes, Rate: 1e6, Burst: 3000}, 3000},
	}
	for _, tc := range tests {
		if got := tc.r.EffectiveBurst(); got != tc.want {
			t.Errorf("%s: EffectiveBurst() = %g, want %g", tc.name, got, tc.want)
		}
	}
	// The golden case through the parser.
	c := mustParse(t, rule("behavior: paced", "paced: {max_queueing_time: 500ms}"))
	if c.Rules[0].Rate != 100 {
		t.Fatal("fixture changed")
	}
	c = mustParse(t, doc("rules:", "  - {name: p, protocol: udp, rate: 10, behavior: paced, paced: {max_queueing_time: 500ms}}"))
	if got := c.Rules[0].EffectiveBurst(); got != 6 {
		t.Errorf("parsed paced rule: EffectiveBurst() = %g, want 6", got)
	}
}

func TestPrefixes(t *testing.T) {
	c := mustParse(t, doc(`allow: [192.0.2.1, "2001:DB8::1", 10.1.0.0/16, "2001:db8:0:0::/64", 0.0.0.0/0]`))
	want := []string{"192.0.2.1/32", "2001:db8::1/128", "10.1.0.0/16", "2001:db8::/64", "0.0.0.0/0"}
	for i, p := range c.Allow {
		if p.String() != want[i] || p != p.Masked() {
			t.Errorf("allow[%d] = %s, want %s", i, p, want[i])
		}
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0].Problem, "allows every IPv4 source") {
		t.Errorf("warnings = %v, want one about 0.0.0.0/0", c.Warnings)
	}
}

func TestMergePorts(t *testing.T) {
	got := MergePorts([]dataplane.PortRange{{Lo: 443, Hi: 443}, {Lo: 80, Hi: 80}, {Lo: 81, Hi: 90}, {Lo: 85, Hi: 86}, {Lo: 65535, Hi: 65535}, {Lo: 1000, Hi: 2000}, {Lo: 2001, Hi: 2001}, {Lo: 65000, Hi: 65534}})
	if s := fmt.Sprint(got); s != "[80-90 443 1000-2001 65000-65535]" {
		t.Errorf("MergePorts = %s", s)
	}
	if MergePorts(nil) != nil {
		t.Error("MergePorts(nil) != nil")
	}
}

func TestMergeKeys(t *testing.T) {
	c := mustParse(t, doc(
		"rules:",
		"  - &base {name: a, protocol: tcp, rate: 5, ports: [80]}",
		"  - <<: *base",
		"    name: b",
		"    rate: 7",
	))
	b := c.Rules[1]
	if b.Name != "b" || b.Rate != 7 || b.Protocol != ProtoTCP || fmt.Sprint(b.Ports) != "[80]" || b.Line != 3 {
		t.Errorf("merged rule = %+v", b)
	}
}

type wantErr struct {
	line    int
	field   string
	problem string // substring
}

func TestErrors(t *testing.T) {
	many := []string{"rules:"}
	for i := range MaxRules + 2 {
		many = append(many, fmt.Sprintf("  - {name: r%d, protocol: udp, rate: 1}", i))
	}

	tests := []struct {
		name string
		src  string
		want []wantErr
	}{
		// Strict decoding.
		{"unknown top-level key", doc("rule: []"), []wantErr{{1, "rule", `unknown key (did you mean "rules"?)`}}},
		{"unknown rule key", rule("prots: [80]"), []wantErr{{5, "rules[0].prots", `unknown key (did you mean "ports"?)`}}},
		{"unknown nested key", rule("behavior: adaptive", "adaptive:", "  target_latency: 1s", "  min_rate: 1", "  max_rate: 1000", "  kaa: 2"),
			[]wantErr{{10, "rules[0].adaptive.kaa", `did you mean "ka"?`}}},
		{"unknown key lists known keys", doc("xyzzy: 1"), []wantErr{{1, "xyzzy", "unknown key (known keys: interfaces, allow"}}},
		{"duplicate key", rule("rate: 200"), []wantErr{{5, "rules[0].rate", "duplicate key (first at line 4)"}}},
		{"duplicate top-level key", doc("rules: []", "allow: []", "rules: []"), []wantErr{{3, "rules", "duplicate key (first at line 1)"}}},
		{"non-string key", doc("1: x"), []wantErr{{1, "", "keys must be strings, got number 1"}}},
		{"top level not a mapping", doc("- a"), []wantErr{{1, "", "expected a mapping, got a list"}}},
		{"rules not a list", doc("rules: {a: 1}"), []wantErr{{1, "rules", "expected a list, got a mapping"}}},
		{"rule not a mapping", doc("rules: [web]"), []wantErr{{1, "rules[0]", `expected a mapping, got string "web"`}}},
		{"empty rule", doc("rules:", "  -"), []wantErr{{2, "rules[0]", "empty rule"}}},
		{"string for number", rule(`burst: "100"`), []wantErr{{5, "rules[0].burst", `expected a number, got string "100"`}}},
		{"string for bool", rule("syn_only: yes"), []wantErr{{5, "rules[0].syn_only", "expected true or false"}}},
		{"number for string", doc("rules:", "  - name: 7", "    protocol: tcp", "    rate: 1"), []wantErr{{2, "rules[0].name", "expected a string, got number 7"}}},
		{"float for integer", doc("source_table_size: 1.5"), []wantErr{{1, "source_table_size", "expected an integer"}}},
		{"list for scalar", rule("shadow: [true]"), []wantErr{{5, "rules[0].shadow", "expected true or false, got a list"}}},
		{"null scalar", rule("burst:"), []wantErr{{5, "rules[0].burst", "missing value"}}},
		{"null section", rule("behavior: warm_up", "warm_up:"), []wantErr{{6, "rules[0].warm_up", "missing value: expected a mapping with keys period, cold_factor"}}},
		{"null per_source", rule("per_source: ~"), []wantErr{{5, "rules[0].per_source", "missing value"}}},
		{"section not a mapping", rule("concurrency: 5"), []wantErr{{5, "rules[0].concurrency", "expected a mapping, got number 5"}}},
		{"missing required keys", doc("rules:", "  - name: x"), []wantErr{
			{2, "rules[0].protocol", "required key is missing"}, {2, "rules[0].rate", "required key is missing"}}},
		{"bad enum", rule("unit: bits"), []wantErr{{5, "rules[0].unit", `must be one of packets, bytes, got "bits"`}}},
		{"bad protocol", doc("rules:", "  - name: x", "    protocol: sctp", "    rate: 1"), []wantErr{{3, "rules[0].protocol", "must be one of tcp, udp, icmp, any"}}},
		{"bad behavior", rule("behavior: throttle"), []wantErr{{5, "rules[0].behavior", "must be one of reject, warm_up"}}},
		{"bad malformed", doc("malformed: reject"), []wantErr{{1, "malformed", "must be one of drop, pass"}}},

		// YAML itself.
		{"syntax error", doc("rules:", "  - name: a", "    rate: [1", "    x: 2"), []wantErr{{2, "", "invalid YAML"}}},
		{"unknown anchor", doc("rules: []", "allow: [*nope]"), []wantErr{{2, "", "invalid YAML: unknown anchor 'nope'"}}},
		{"second document", doc("rules: []", "---", "rules: []"), []wantErr{{3, "", "a second YAML document"}}},
		{"empty file", "", []wantErr{{0, "", "file is empty"}}},
		{"comments only", "# nothing\n", []wantErr{{0, "", "file is empty"}}},
		{"self merge", doc("rules:", "  - &a {name: a, protocol: tcp, rate: 5, <<: *a}"), []wantErr{{2, "rules[0].<<", "already merged"}}},

		// Names.
		{"duplicate rule names", doc("rules:", "  - {name: a, protocol: tcp, rate: 1}", "  - {name: b, protocol: tcp, rate: 1}", "  - {name: a, protocol: udp, rate: 1}"),
			[]wantErr{{4, "rules[2].name", `duplicate rule name "a" (first at line 2)`}}},
		{"name charset", doc("rules:", "  - {name: Web, protocol: tcp, rate: 1}"), []wantErr{{2, "rules[0].name", "may only contain a-z, 0-9"}}},
		{"name too long", doc("rules:", "  - {name: "+strings.Repeat("a", 32)+", protocol: tcp, rate: 1}"), []wantErr{{2, "rules[0].name", "longer than 31"}}},
		{"empty name", doc("rules:", `  - {name: "", protocol: tcp, rate: 1}`), []wantErr{{2, "rules[0].name", "must not be empty"}}},
		{"too many rules", doc(many...), []wantErr{{MaxRules + 2, "rules[64]", "too many rules: at most 64 are allowed, the file has 66"}}},

		// Prefixes.
		{"invalid address", doc("allow: [10.0.0.0/8, 10.0.0.300]"), []wantErr{{1, "allow[1]", `"10.0.0.300" is not an IP address or prefix`}}},
		{"host bits", doc("allow:", "  - 10.0.0.0/8", "  - 10.0.0.1/8"), []wantErr{{3, "allow[1]", "10.0.0.1/8 has host bits set (did you mean 10.0.0.0/8?)"}}},
		{"host bits v6", doc(`deny: ["2001:db8::1/32"]`), []wantErr{{1, "deny[0]", "2001:db8::1/32 has host bits set (did you mean 2001:db8::/32?)"}}},
		{"prefix too long", doc("deny: [10.0.0.0/33]"), []wantErr{{1, "deny[0]", "prefix length must be 0-32 for IPv4"}}},
		{"bad prefix length", doc(`deny: ["::/x"]`), []wantErr{{1, "deny[0]", "prefix length must be 0-128 for IPv6"}}},
		{"mapped address", doc(`allow: ["::ffff:10.0.0.1"]`), []wantErr{{1, "allow[0]", "IPv4-mapped"}}},
		{"zone", doc(`allow: ["fe80::1%eth0"]`), []wantErr{{1, "allow[0]", "zones are not allowed"}}},
		{"number for prefix", doc("allow: [10]"), []wantErr{{1, "allow[0]", "expected an address or prefix"}}},
		{"bad source", rule("sources: [1.2.3.4/24]"), []wantErr{{5, "rules[0].sources[0]", "1.2.3.4/24 has host bits set (did you mean 1.2.3.0/24?)"}}},
		{"empty sources", rule("sources: []"), []wantErr{{5, "rules[0].sources", "empty list"}}},

		// Ports.
		{"port zero", rule("ports: [80, 0]"), []wantErr{{5, "rules[0].ports[1]", "port 0 is out of range 1-65535"}}},
		{"port too big", rule("ports: [65536]"), []wantErr{{5, "rules[0].ports[0]", "port 65536 is out of range"}}},
		{"port string too big", rule(`ports: ["70000"]`), []wantErr{{5, "rules[0].ports[0]", "port 70000 is out of range"}}},
		{"port non-numeric", rule("ports: [http]"), []wantErr{{5, "rules[0].ports[0]", `"http" is not a port number`}}},
		{"port float", rule("ports: [80.5]"), []wantErr{{5, "rules[0].ports[0]", "expected a port (80) or a range"}}},
		{"reversed range", rule("ports:", `  - "9000-8000"`), []wantErr{{6, "rules[0].ports[0]", `reversed range "9000-8000" (did you mean "8000-9000"?)`}}},
		{"half range", rule(`ports: ["8000-"]`), []wantErr{{5, "rules[0].ports[0]", "empty range"}}},
		{"empty port string", rule(`ports: [""]`), []wantErr{{5, "rules[0].ports[0]", "empty port"}}},
		{"range bound zero", rule(`ports: ["0-10"]`), []wantErr{{5, "rules[0].ports[0]", "port 0 is out of range"}}},
		{"empty ports", rule("ports: []"), []wantErr{{5, "rules[0].ports", "empty list: omit ports"}}},

		// Rates and bursts.
		{"rate zero", doc("rules:", "  - {name: a, protocol: tcp, rate: 0}"), []wantErr{{2, "rules[0].rate", "must be greater than 0, got 0"}}},
		{"rate negative", doc("rules:", "  - name: a", "    protocol: tcp", "    rate: -5"), []wantErr{{4, "rules[0].rate", "must be greater than 0, got -5"}}},
		{"rate NaN", doc("rules:", "  - {name: a, protocol: tcp, rate: .nan}"), []wantErr{{2, "rules[0].rate", "must be a finite number"}}},
		{"rate Inf", doc("rules:", "  - {name: a, protocol: tcp, rate: .inf}"), []wantErr{{2, "rules[0].rate", "must be a finite number"}}},
		{"rate too small", doc("rules:", "  - {name: a, protocol: tcp, rate: 0.0001}"), []wantErr{{2, "rules[0].rate", "below the minimum of 0.001 packets per second"}}},
		{"rate too big", doc("rules:", "  - {name: a, protocol: tcp, rate: 2e9}"), []wantErr{{2, "rules[0].rate", "above the maximum of 1e+08 packets"}}},
		{"byte rate too small", doc("rules:", "  - {name: a, protocol: tcp, unit: bytes, rate: 10}"), []wantErr{{2, "rules[0].rate", "below the minimum of 16 bytes per second"}}},
		{"byte rate too big", doc("rules:", "  - {name: a, protocol: tcp, unit: bytes, rate: 3e11}"), []wantErr{{2, "rules[0].rate", "above the maximum of 1.25e+10 bytes"}}},
		{"burst zero", rule("burst: 0"), []wantErr{{5, "rules[0].burst", "must be greater than 0"}}},
		{"burst below one packet", rule("burst: 0.5"), []wantErr{{5, "rules[0].burst", "smaller than one packet"}}},
		{"byte burst below a frame", rule("unit: bytes", "burst: 1000"), []wantErr{{6, "rules[0].burst", "smaller than one full-size frame"}}},
		{"burst over a day", rule("burst: 8640001"), []wantErr{{5, "rules[0].burst", "at most 86400 s (24h)"}}},
		{"burst with paced", rule("burst: 10", "behavior: paced"), []wantErr{{5, "rules[0].burst", "conflicts with paced.max_queueing_time"}}},
		{"burst with warm_up_paced", rule("burst: 10", "behavior: warm_up_paced", "warm_up: {period: 10s}"), []wantErr{{5, "rules[0].burst", "conflicts with paced.max_queueing_time"}}},
		{"paced queue over a day", rule("behavior: paced", "paced: {max_queueing_time: 24h}"), []wantErr{{6, "rules[0].paced.max_queueing_time", "at most 86400 s"}}},

		// Inconsistent options.
		{"syn_only with udp", doc("rules:", "  - name: a", "    protocol: udp", "    rate: 1", "    syn_only: true"), []wantErr{{5, "rules[0].syn_only", "requires protocol tcp (protocol is udp)"}}},
		{"syn_only with any", doc("rules:", "  - {name: a, protocol: any, rate: 1, syn_only: true}"), []wantErr{{2, "rules[0].syn_only", "requires protocol tcp (protocol is any)"}}},
		{"syn_only with bytes", rule("syn_only: true", "unit: bytes"), []wantErr{{6, "rules[0].unit", "cannot be combined with syn_only"}}},
		{"ports with icmp", doc("rules:", "  - name: a", "    protocol: icmp", "    rate: 1", "    ports: [80]"), []wantErr{{5, "rules[0].ports", "not allowed with protocol icmp"}}},
		{"concurrency with udp", doc("rules:", "  - name: a", "    protocol: udp", "    rate: 1", "    concurrency: {max: 5}"), []wantErr{{5, "rules[0].concurrency", "requires protocol tcp (protocol is udp)"}}},
		{"soft above max", rule("concurrency:", "  max: 300", "  soft: 400"), []wantErr{{7, "rules[0].concurrency.soft", "soft limit 400 exceeds max 300"}}},
		{"concurrency without max", rule("concurrency: {soft: 4}"), []wantErr{{5, "rules[0].concurrency.max", "required key is missing"}}},
		{"concurrency max zero", rule("concurrency: {max: 0}"), []wantErr{{5, "rules[0].concurrency.max", "must be between 1 and"}}},
		{"fragments without ports", rule("fragments: drop"), []wantErr{{5, "rules[0].fragments", "applies only to rules with ports"}}},

		// Behaviours.
		{"warm_up without section", rule("behavior: warm_up"), []wantErr{{5, "rules[0].warm_up", "requires a warm_up section with period"}}},
		{"warm_up without period", rule("behavior: warm_up", "warm_up: {cold_factor: 2}"), []wantErr{{6, "rules[0].warm_up.period", "required key is missing"}}},
		{"cold factor one", rule("behavior: warm_up", "warm_up: {period: 10s, cold_factor: 1}"), []wantErr{{6, "rules[0].warm_up.cold_factor", "must be greater than 1, got 1"}}},
		{"cold factor below one", rule("behavior: warm_up", "warm_up:", "  period: 10s", "  cold_factor: 0.5"), []wantErr{{8, "rules[0].warm_up.cold_factor", "must be greater than 1"}}},
		{"warm_up too short", doc("rules:", "  - {name: a, protocol: tcp, rate: 1, behavior: warm_up, warm_up: {period: 1s}}"), []wantErr{{2, "rules[0].warm_up.period", "too short for rate 1"}}},
		{"cold rate too low", doc("rules:", "  - {name: a, protocol: tcp, rate: 0.01, behavior: warm_up, warm_up: {period: 10000s, cold_factor: 100}}"), []wantErr{{2, "rules[0].warm_up.cold_factor", "cold rate"}}},
		{"adaptive without section", rule("behavior: adaptive"), []wantErr{{5, "rules[0].adaptive", "requires an adaptive section with target_latency, min_rate and max_rate"}}},
		{"adaptive missing keys", rule("behavior: adaptive", "adaptive: {ka: 1}"), []wantErr{
			{6, "rules[0].adaptive.target_latency", "required"}, {6, "rules[0].adaptive.min_rate", "required"}, {6, "rules[0].adaptive.max_rate", "required"}}},
		{"min above max", rule("behavior: adaptive", "adaptive:", "  target_latency: 25ms", "  max_rate: 100", "  min_rate: 1000"),
			[]wantErr{{9, "rules[0].adaptive.min_rate", "min_rate 1000 is above max_rate 100"}}},
		{"rate outside adaptive range", rule("behavior: adaptive", "adaptive: {target_latency: 25ms, min_rate: 1000, max_rate: 12000}"),
			[]wantErr{{4, "rules[0].rate", "100 is outside adaptive [min_rate 1000, max_rate 12000]"}}},
		{"adaptive gains", rule("behavior: adaptive", "adaptive: {target_latency: 25ms, min_rate: 10, max_rate: 1000,",
			"  ka: 0, km: 1.5, gamma: 1, alpha: 0, cpu_high: -1, error_threshold: 2}"), []wantErr{
			{7, "rules[0].adaptive.ka", "must be greater than 0"},
			{7, "rules[0].adaptive.km", "must be in (0, 1]"},
			{7, "rules[0].adaptive.gamma", "must be in (0, 1)"},
			{7, "rules[0].adaptive.alpha", "must be in (0, 1]"},
			{7, "rules[0].adaptive.cpu_high", "must be in (0, 1]"},
			{7, "rules[0].adaptive.error_threshold", "must be in [0, 1]"}}},
		{"signal probe without probe", rule("behavior: adaptive", "adaptive: {target_latency: 25ms, min_rate: 10, max_rate: 1000, signal: probe}"),
			[]wantErr{{6, "rules[0].adaptive.signal", "signal probe requires a probe section"}}},
		{"bad probe", rule("behavior: adaptive", "adaptive:", "  target_latency: 25ms", "  min_rate: 10", "  max_rate: 1000", "  signal: probe",
			"  probe:", "    kind: tcp", "    address: example.com:80", "    path: /x", "    timeout: 2s"), []wantErr{
			{13, "rules[0].adaptive.probe.address", `host "example.com" must be an IP address or localhost`},
			{14, "rules[0].adaptive.probe.path", "only kind http has a path"},
			{15, "rules[0].adaptive.probe.timeout", "2s exceeds the probe interval 1s"}}},
		{"probe address without port", rule("behavior: adaptive", "adaptive: {target_latency: 25ms, min_rate: 10, max_rate: 1000, signal: probe,",
			"  probe: {kind: http, address: 127.0.0.1, path: healthz}}"), []wantErr{
			{7, "rules[0].adaptive.probe.address", "is not host:port"},
			{7, "rules[0].adaptive.probe.path", "must start with '/'"}}},

		// Durations.
		{"duration without unit", rule("behavior: warm_up", "warm_up: {period: 10}"), []wantErr{{6, "rules[0].warm_up.period", `10 has no unit: durations are Go durations such as "500ms" or "10s"`}}},
		{"duration garbage", rule("behavior: paced", "paced: {max_queueing_time: 10 sec}"), []wantErr{{6, "rules[0].paced.max_queueing_time", `"10 sec" is not a duration`}}},
		{"duration negative", rule("behavior: paced", "paced: {max_queueing_time: -1s}"), []wantErr{{6, "rules[0].paced.max_queueing_time", "must be positive"}}},
		{"duration zero", rule("circuit_breaker: {error_ratio: 0.5, window: 0s}"), []wantErr{{5, "rules[0].circuit_breaker.window", "must be positive"}}},
		{"ban after negative", rule("per_source: {rate: 5, ban: {after: -1s, duration: 1m}}"), []wantErr{{5, "rules[0].per_source.ban.after", "must not be negative"}}},

		// per_source, circuit breaker, system, top level.
		{"per_source rate", rule("per_source: {rate: 0}"), []wantErr{{5, "rules[0].per_source.rate", "must be greater than 0"}}},
		{"per_source prefix", rule("per_source: {rate: 5, prefix_v4: 33, prefix_v6: 0}"), []wantErr{
			{5, "rules[0].per_source.prefix_v4", "must be between 1 and 32, got 33"},
			{5, "rules[0].per_source.prefix_v6", "must be between 1 and 128, got 0"}}},
		{"per_source burst", rule("per_source: {rate: 5, burst: 0.5}"), []wantErr{{5, "rules[0].per_source.burst", "smaller than one packet"}}},
		{"ban without duration", rule("per_source: {rate: 5, ban: {after: 1s}}"), []wantErr{{5, "rules[0].per_source.ban.duration", "required"}}},
		{"breaker ratio", rule("circuit_breaker: {error_ratio: 1.5}"), []wantErr{{5, "rules[0].circuit_breaker.error_ratio", "must be in (0, 1], got 1.5"}}},
		{"breaker without ratio", rule("circuit_breaker:", "  window: 2s"), []wantErr{{5, "rules[0].circuit_breaker", "needs slow_ratio (with slow_latency) or error_ratio"}}},
		{"breaker slow ratio alone", rule("circuit_breaker: {slow_ratio: 0.5}"), []wantErr{{5, "rules[0].circuit_breaker.slow_ratio", "requires slow_latency"}}},
		{"breaker min requests", rule("circuit_breaker: {error_ratio: 0.5, min_requests: 0}"), []wantErr{{5, "rules[0].circuit_breaker.min_requests", "must be between 1 and"}}},
		{"system cpu", doc("system: {cpu_high: 1.5}"), []wantErr{{1, "system.cpu_high", "must be in (0, 1]"}}},
		{"system empty", doc("system: {}"), []wantErr{{1, "system.cpu_high", "required"}}},
		{"source table size", doc("source_table_size: 0"), []wantErr{{1, "source_table_size", "must be between 1 and 33554432, got 0"}}},
		{"interfaces", doc("interfaces:", "  - eth0", "  - averyveryverylongname", "  - eth0", "  - a/b", `  - "e th"`, `  - ""`), []wantErr{
			{3, "interfaces[1]", "longer than 15 bytes"},
			{4, "interfaces[2]", `duplicate interface "eth0" (first at line 2)`},
			{5, "interfaces[3]", "contains '/' or ':'"},
			{6, "interfaces[4]", "contains whitespace"},
			{7, "interfaces[5]", "empty interface name"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("t.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("Parse succeeded (%+v), want errors %v", c, tc.want)
			}
			if c != nil {
				t.Errorf("Parse returned a Config with an error")
			}
			errs := Errors(err)
			if joined, ok := err.(interface{ Unwrap() []error }); !ok || len(joined.Unwrap()) != len(errs) {
				t.Errorf("Errors() does not return every joined error")
			}
			if len(errs) != len(tc.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(tc.want), err)
			}
			for i, w := range tc.want {
				e := errs[i]
				if e.File != "t.yaml" || e.Line != w.line || e.Field != w.field || !strings.Contains(e.Problem, w.problem) {
					t.Errorf("error %d = %q\nwant line %d, field %q, problem containing %q", i, e.Error(), w.line, w.field, w.problem)
				}
				text := e.Error()
				prefix := fmt.Sprintf("t.yaml:%d: %s: ", w.line, w.field)
				switch {
				case w.line == 0 && w.field == "":
					prefix = "t.yaml: "
				case w.field == "":
					prefix = fmt.Sprintf("t.yaml:%d: ", w.line)
				}
				if !strings.HasPrefix(text, prefix) {
					t.Errorf("error text %q does not start with %q", text, prefix)
				}
			}
		})
	}
}

func TestMultipleErrors(t *testing.T) {
	src := doc(
		"interfaces: [eth0, eth0]",          // 1
		"allow: [10.0.0.1/8]",               // 2
		"rules:",                            // 3
		"  - name: web",                     // 4
		"    protocol: udp",                 // 5
		"    ports: [80, 0, \"9000-8000\"]", // 6
		"    syn_only: true",                // 7
		"    rate: -1",                      // 8
		"    colour: red",                   // 9
		"  - name: web",                     // 10
		"    protocol: tcp",                 // 11
		"    rate: 10",                      // 12
		"    behavior: adaptive",            // 13
		"    adaptive: {target_latency: 25, min_rate: 20, max_rate: 10}", // 14
	)
	_, err := Parse("rules.yaml", []byte(src))
	want := []string{
		"rules.yaml:1: interfaces[1]: duplicate interface \"eth0\" (first at line 1)",
		"rules.yaml:2: allow[0]: 10.0.0.1/8 has host bits set (did you mean 10.0.0.0/8?)",
		"rules.yaml:6: rules[0].ports[1]: port 0 is out of range 1-65535",
		"rules.yaml:6: rules[0].ports[2]: reversed range \"9000-8000\" (did you mean \"8000-9000\"?)",
		"rules.yaml:7: rules[0].syn_only: requires protocol tcp (protocol is udp)",
		"rules.yaml:8: rules[0].rate: must be greater than 0, got -1",
		"rules.yaml:9: rules[0].colour: unknown key (known keys: name, protocol, ports, syn_only, sources, unit, rate, burst, behavior, warm_up, paced, adaptive, per_source, concurrency, circuit_breaker, shadow, fragments, refuse, syn_cookies, fleet)",
		"rules.yaml:10: rules[1].name: duplicate rule name \"web\" (first at line 4)",
		"rules.yaml:14: rules[1].adaptive.target_latency: 25 has no unit: durations are Go durations such as \"500ms\" or \"10s\"",
		"rules.yaml:14: rules[1].adaptive.min_rate: min_rate 20 is above max_rate 10",
	}
	if err == nil {
		t.Fatal("Parse succeeded")
	}
	if got := strings.Split(err.Error(), "\n"); !reflect.DeepEqual(got, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var first *Error
	if !errors.As(err, &first) || first.Line != 1 {
		t.Errorf("errors.As found %v, want the line-1 error", first)
	}
}

func TestErrorText(t *testing.T) {
	tests := []struct {
		e    Error
		want string
	}{
		{Error{File: "f.yaml", Line: 3, Column: 5, Field: "rules[0].rate", Problem: "bad"}, "f.yaml:3: rules[0].rate: bad"},
		{Error{File: "f.yaml", Line: 3, Problem: "invalid YAML: x"}, "f.yaml:3: invalid YAML: x"},
		{Error{File: "f.yaml", Problem: "file is empty"}, "f.yaml: file is empty"},
	}
	for _, tc := range tests {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
	if Errors(nil) != nil {
		t.Error("Errors(nil) != nil")
	}
	e := &Error{File: "f", Line: 1, Problem: "p"}
	wrapped := fmt.Errorf("reload rules: %w", errors.Join(e, errors.New("other")))
	if got := Errors(wrapped); len(got) != 1 || got[0] != e {
		t.Errorf("Errors(wrapped) = %v", got)
	}
}

func TestLoad(t *testing.T) {
	_, err := Load("testdata/does-not-exist.yaml")
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "read rules file: ") {
		t.Errorf("Load(missing) = %v", err)
	}
	_, err = Load("testdata/bad.yaml")
	errs := Errors(err)
	if len(errs) == 0 || errs[0].File != "testdata/bad.yaml" {
		t.Errorf("Load(bad) = %v", err)
	}
}

func TestAliasBomb(t *testing.T) {
	// Each level doubles the walk; the budget stops it with an error.
	var b strings.Builder
	b.WriteString("a0: &a0 [10.0.0.0/8, 10.0.0.0/8]\n")
	for i := 1; i < 40; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [*a%d, *a%d]\n", i, i, i-1, i-1)
	}
	b.WriteString("rules:\n")
	for i := range 70 {
		fmt.Fprintf(&b, "  - {name: r%d, protocol: tcp, rate: 1, sources: *a39, ports: *a39}\n", i)
	}
	start := time.Now()
	_, err := Parse("bomb.yaml", []byte(b.String()))
	if err == nil {
		t.Fatal("Parse succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Parse took %v", d)
	}
	if len(Errors(err)) > maxErrors+2 {
		t.Errorf("%d errors, want at most %d", len(Errors(err)), maxErrors+2)
	}
}

func FuzzParse(f *testing.F) {
	for _, name := range []string{"testdata/design.yaml", "testdata/full.yaml", "testdata/minimal.yaml", "testdata/bad.yaml"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(rule("behavior: paced", "paced: {max_queueing_time: 1s}")))
	f.Add([]byte(doc("rules:", "  - &b {name: a, protocol: tcp, rate: 5}", "  - <<: *b", "    name: b")))
	f.Add([]byte(""))
	f.Add([]byte("a: [1,"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if c != nil {
				t.Fatal("Config and error both returned")
			}
			errs := Errors(err)
			if len(errs) == 0 {
				t.Fatalf("error without *Error: %v", err)
			}
			for _, e := range errs {
				if e.File != "fuzz.yaml" || e.Line < 0 || e.Problem == "" {
					t.Fatalf("malformed error %#v", e)
				}
				if e.Line == 0 && e.Field != "" {
					t.Fatalf("field error without a line: %v", e)
				}
				if strings.Contains(e.Problem, "internal error") {
					t.Fatalf("parser panicked: %v", e)
				}
			}
			return
		}
		if len(c.Rules) > MaxRules {
			t.Fatalf("%d rules accepted", len(c.Rules))
		}
		names := map[string]bool{}
		for i := range c.Rules {
			r := &c.Rules[i]
			if names[r.Name] || checkRuleName(r.Name) != "" {
				t.Fatalf("bad or duplicate name %q accepted", r.Name)
			}
			names[r.Name] = true
			b := r.EffectiveBurst()
			if !(r.Rate > 0) || math.IsInf(r.Rate, 0) || !(b >= 1) || b/r.Rate > MaxBurstSeconds {
				t.Fatalf("rule %q: rate %g burst %g accepted", r.Name, r.Rate, b)
			}
			if r.Behavior.WarmsUp() != (r.WarmUp != nil) || r.Behavior.IsPaced() != (r.Paced != nil) ||
				(r.Behavior == BehaviorAdaptive) != (r.Adaptive != nil) {
				t.Fatalf("rule %q: sections do not match behavior %s", r.Name, r.Behavior)
			}
			for _, p := range r.Ports {
				if p.Lo == 0 || p.Lo > p.Hi {
					t.Fatalf("rule %q: port range %v accepted", r.Name, p)
				}
			}
		}
		for _, p := range append(append([]netip.Prefix{}, c.Allow...), c.Deny...) {
			if !p.IsValid() || p != p.Masked() {
				t.Fatalf("prefix %v accepted", p)
			}
		}
	})
}

// TestDesignSketchKeys keeps docs/design.md §10's rules-file sketch, which
// says it puts every key into one rule, true: every key that a mapping it
// decodes knows is in it, and every value an enum of it allows is named on
// the enum's line (its comment), so that a new key or value cannot ship
// without the sketch.
func TestDesignSketchKeys(t *testing.T) {
	doc, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "### Rules file (YAML)")
	if !ok {
		t.Fatal("docs/design.md: no section \"### Rules file (YAML)\"")
	}
	_, after, ok = strings.Cut(after, "```yaml\n")
	if !ok {
		t.Fatal("docs/design.md: the rules file section has no yaml block")
	}
	block, _, _ := strings.Cut(after, "```")
	var tr trace
	if _, err := parse("docs/design.md", []byte(block), &tr); err != nil {
		t.Fatalf("the sketch is not a valid rules file: %v", err)
	}
	for _, m := range tr.mappings {
		for _, k := range m.known {
			if !slices.Contains(m.present, k) {
				t.Errorf("docs/design.md §10 sketch: %s lacks the key %q", cmp.Or(m.path, "the top level"), k)
			}
		}
	}
	lines := strings.Split(block, "\n")
	for _, e := range tr.enums {
		if e.line < 1 || e.line > len(lines) {
			t.Fatalf("enum %s at line %d of a %d-line block", e.path, e.line, len(lines))
		}
		for _, v := range e.allowed {
			if !strings.Contains(lines[e.line-1], v) {
				t.Errorf("docs/design.md §10 sketch, line %d: %s does not name the value %q", e.line, e.path, v)
			}
		}
	}
	if len(tr.mappings) < 10 || len(tr.enums) < 5 {
		t.Errorf("the trace saw %d mappings and %d enums: the sketch was not decoded", len(tr.mappings), len(tr.enums))
	}
}

// TestFragmentsWithoutPorts: a TCP or UDP rule without ports takes
// `fragments: limit` (its default: it follows fragments as a port rule
// does) or `ignore` (each fragment charged as it comes); `drop` needs
// ports (issue 41).
func TestFragmentsWithoutPorts(t *testing.T) {
	for _, v := range []FragmentPolicy{FragmentsLimit, FragmentsIgnore} {
		if got := mustParse(t, rule("fragments: "+string(v))).Rules[0].Fragments; got != v {
			t.Errorf("fragments: %s on a rule without ports parsed as %q", v, got)
		}
	}
	if got := mustParse(t, rule()).Rules[0].Fragments; got != FragmentsLimit {
		t.Errorf("a rule without ports defaults to fragments %q, want limit", got)
	}
}
