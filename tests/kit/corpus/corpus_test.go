package corpus

import (
	"slices"
	"testing"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// TestRulesFileRoundTrip checks that every spec, rendered as a rules file,
// is a valid file that describes the same rules: the live test runs the
// corpus against the daemon with these files.
func TestRulesFileRoundTrip(t *testing.T) {
	for name, spec := range Specs() {
		text := RulesFile(spec)
		cfg, err := config.Parse(name+".yaml", []byte(text))
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, text)
		}
		if len(cfg.Warnings) > 0 {
			t.Errorf("%s: warnings %v", name, cfg.Warnings)
		}
		if got := cfg.Malformed == config.VerdictPass; got != spec.MalformedPass {
			t.Errorf("%s: malformed pass %v, want %v", name, got, spec.MalformedPass)
		}
		if !slices.Equal(cfg.Allow, spec.Allow) || !slices.Equal(cfg.Deny, spec.Deny) {
			t.Errorf("%s: lists %v %v, want %v %v", name, cfg.Allow, cfg.Deny, spec.Allow, spec.Deny)
		}
		if len(cfg.Rules) != len(spec.Rules) {
			t.Fatalf("%s: %d rules, want %d", name, len(cfg.Rules), len(spec.Rules))
		}
		for i, r := range cfg.Rules {
			w := spec.Rules[i]
			var ports []dataplane.PortRange
			for _, p := range r.MergedPorts() {
				ports = append(ports, dataplane.PortRange{Lo: p.Lo, Hi: p.Hi})
			}
			frag := string(r.Fragments)
			if w.Fragments == "" && frag == string(config.FragmentsLimit) {
				frag = ""
			}
			if r.Name != w.Name || string(r.Protocol) != w.Protocol || !slices.Equal(ports, w.Ports) ||
				r.SynOnly != w.SynOnly || !slices.Equal(r.Sources, w.Sources) || (r.Unit == config.UnitBytes) != w.Bytes ||
				r.Rate != w.Rate || r.EffectiveBurst() != w.Burst || r.Shadow != w.Shadow || frag != w.Fragments {
				t.Errorf("%s: rule %d decoded as %+v, want %+v", name, i, r, w)
			}
		}
	}
}

// TestCasesHaveSpecs checks that every case names a spec and that its
// expected rules exist in it.
func TestCasesHaveSpecs(t *testing.T) {
	specs := Specs()
	names := map[string]bool{}
	for _, c := range Cases() {
		if names[c.Name] {
			t.Errorf("case %q: name used twice", c.Name)
		}
		names[c.Name] = true
		s := specs[c.Spec]
		if s == nil {
			t.Errorf("case %q: unknown spec %q", c.Name, c.Spec)
			continue
		}
		for _, r := range c.Rules {
			if !slices.ContainsFunc(s.Rules, func(rs dataplane.RuleSpec) bool { return rs.Name == r.Name }) {
				t.Errorf("case %q: rule %q not in spec %q", c.Name, r.Name, c.Spec)
			}
		}
		if len(c.Frame) < 14 {
			t.Errorf("case %q: %d-byte frame, shorter than an Ethernet header", c.Name, len(c.Frame))
		}
	}
}
