package config

import (
	"strings"
	"testing"
)

// syn_cookies: a rule's mode (off, auto, always; syn_only rules only) and
// the top-level answer budget, with FILE:LINE errors.
func TestSynCookies(t *testing.T) {
	rule := func(extra string) string {
		return doc("rules:", "  - name: web", "    protocol: tcp", "    ports: [443]", "    syn_only: true",
			"    rate: 2000", "    burst: 200"+extra)
	}
	c := mustParse(t, rule(""))
	if r := c.Rules[0]; r.SynCookies != "" || c.SynCookies != nil {
		t.Errorf("default: rule %q, section %+v; want off and no section", r.SynCookies, c.SynCookies)
	}
	for _, m := range []SynCookieMode{SynCookiesOff, SynCookiesAuto, SynCookiesAlways} {
		c := mustParse(t, rule("\n    syn_cookies: "+string(m)))
		if c.Rules[0].SynCookies != m {
			t.Errorf("syn_cookies %s: got %q", m, c.Rules[0].SynCookies)
		}
	}
	// With refuse: reset (issue 42): a valid cookie ACK the rule refuses
	// is answered with a reset to its proven source.
	for _, m := range []string{"auto", "always"} {
		c := mustParse(t, rule("\n    refuse: reset\n    syn_cookies: "+m))
		if c.Rules[0].Refuse != RefuseReset || string(c.Rules[0].SynCookies) != m {
			t.Errorf("refuse: reset with syn_cookies: %s: got refuse %q, syn_cookies %q", m, c.Rules[0].Refuse, c.Rules[0].SynCookies)
		}
	}
	c = mustParse(t, "syn_cookies:\n  answer_rate: 50000\n"+rule("\n    syn_cookies: auto"))
	if c.SynCookies == nil || c.SynCookies.AnswerRate != 50000 || c.SynCookies.Line != 1 {
		t.Errorf("answer_rate 50000: %+v", c.SynCookies)
	}
	// A section no rule uses is valid, with a warning.
	c = mustParse(t, "syn_cookies: {answer_rate: 1000}\n"+rule(""))
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0].Error(), "t.yaml:1: syn_cookies: no rule has syn_cookies") {
		t.Errorf("unused section: warnings %v", c.Warnings)
	}
	udp := doc("rules:", "  - name: dns", "    protocol: udp", "    ports: [53]", "    rate: 10", "    syn_cookies: auto")
	for _, tc := range []struct{ src, want string }{
		{rule("\n    syn_cookies: on"), `t.yaml:8: rules[0].syn_cookies: must be one of off, auto, always, got "on"`},
		{doc("rules:", "  - name: web", "    protocol: tcp", "    ports: [443]", "    rate: 10", "    syn_cookies: always"),
			"t.yaml:6: rules[0].syn_cookies: always answers SYNs of a new-connection rule: requires syn_only: true"},
		{udp, "t.yaml:6: rules[0].syn_cookies: auto answers SYNs of a new-connection rule: requires syn_only: true"},
		{"syn_cookies:\n  answer_rate: 0\n" + rule("\n    syn_cookies: auto"),
			"t.yaml:2: syn_cookies.answer_rate: must be between 1 and 14880000 SYN-ACKs per second, got 0"},
		{"syn_cookies:\n  answer_rate: 2e7\n" + rule("\n    syn_cookies: auto"),
			"t.yaml:2: syn_cookies.answer_rate: must be between 1 and 14880000 SYN-ACKs per second, got 2e+07"},
		{"syn_cookies:\n  answer_rate: lots\n" + rule("\n    syn_cookies: auto"),
			"t.yaml:2: syn_cookies.answer_rate: expected a number"},
		{"syn_cookies: {}\n" + rule("\n    syn_cookies: auto"), "syn_cookies.answer_rate: required key is missing"},
		{"syn_cookies: {rate: 5}\n" + rule("\n    syn_cookies: auto"), "t.yaml:1: syn_cookies.rate: unknown key (known keys: answer_rate)"},
	} {
		_, err := Parse("t.yaml", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n got %v\nwant %q", tc.src, err, tc.want)
		}
	}
}
