package config

import (
	"strings"
	"testing"
)

// resets: the host's budget of TCP resets, absent (the defaults), set, and
// refused out of bounds with FILE:LINE errors.
func TestResets(t *testing.T) {
	rule := doc("rules:", "  - name: web", "    protocol: tcp", "    ports: [443]", "    syn_only: true",
		"    rate: 2000", "    burst: 200", "    refuse: reset")
	if c := mustParse(t, rule); c.Resets != nil {
		t.Errorf("default: section %+v, want none", c.Resets)
	}
	c := mustParse(t, "resets:\n  rate: 50000\n"+rule)
	if c.Resets == nil || c.Resets.Rate != 50000 || c.Resets.Burst != 50000 || c.Resets.Line != 1 {
		t.Errorf("rate 50000: %+v, want burst 50000 (a second's worth) at line 1", c.Resets)
	}
	c = mustParse(t, "resets: {rate: 200, burst: 20}\n"+rule)
	if c.Resets == nil || c.Resets.Rate != 200 || c.Resets.Burst != 20 {
		t.Errorf("rate 200 burst 20: %+v", c.Resets)
	}
	for _, tc := range []struct{ src, want string }{
		{"resets:\n  rate: 0\n" + rule, "t.yaml:2: resets.rate: must be between 1 and 14880000 resets per second, got 0"},
		{"resets:\n  rate: 2e7\n" + rule, "t.yaml:2: resets.rate: must be between 1 and 14880000 resets per second, got 2e+07"},
		{"resets:\n  rate: many\n" + rule, "t.yaml:2: resets.rate: expected a number"},
		{"resets:\n  rate: 10\n  burst: 0\n" + rule, "t.yaml:3: resets.burst: must be between 1 and 14880000 resets, got 0"},
		{"resets:\n  rate: 1\n  burst: 100000\n" + rule, "t.yaml:3: resets.burst: 100000 resets at 1 per second last more than 24h0m0s"},
		{"resets: {}\n" + rule, "resets.rate: required key is missing"},
		{"resets: {answer_rate: 5}\n" + rule, "t.yaml:1: resets.answer_rate: unknown key (known keys: rate, burst)"},
	} {
		_, err := Parse("t.yaml", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n got %v\nwant %q", tc.src, err, tc.want)
		}
	}
}
