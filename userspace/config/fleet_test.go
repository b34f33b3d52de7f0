package config

import (
	"strings"
	"testing"
)

func fleetDoc(fleet string, extra ...string) string {
	lines := append([]string{"rules:", "  - name: web", "    protocol: tcp", "    ports: [443]", "    rate: 2000"}, extra...)
	return doc(append(lines, "    fleet: "+fleet)...)
}

func TestFleet(t *testing.T) {
	c := mustParse(t, fleetDoc("{rate: 3000, burst: 300, safe_rate: 800}"))
	f := c.Rules[0].Fleet
	if f == nil || f.Rate != 3000 || f.Burst != 300 || f.Key != "web" || f.SafeRate != 800 || len(c.Warnings) != 0 {
		t.Fatalf("fleet %+v, warnings %v", f, c.Warnings)
	}
	if got := c.Rules[0].StaticRate(); got != 800 {
		t.Errorf("static rate %v, want min(2000, 800)", got)
	}
	c = mustParse(t, fleetDoc("{rate: 3000, key: front}"))
	if f := c.Rules[0].Fleet; f.Key != "front" || f.Burst != 3000 || c.Rules[0].StaticRate() != 2000 {
		t.Fatalf("fleet %+v", f)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0].Error(), "t.yaml:6: rules[0].fleet: no safe_rate") {
		t.Errorf("warnings %v", c.Warnings)
	}
	for _, tc := range []struct{ text, want string }{
		{fleetDoc("{burst: 3}"), "t.yaml:6: rules[0].fleet.rate: required key is missing"},
		{fleetDoc("{rate: 3000, safe_rate: 4000}"), "t.yaml:6: rules[0].fleet.safe_rate: 4000 exceeds the fleet's rate 3000"},
		{fleetDoc("{rate: 3000, key: 'a b'}"), "t.yaml:6: rules[0].fleet.key: want a non-empty name"},
		{fleetDoc("{rate: 3000, nope: 1}"), "t.yaml:6: rules[0].fleet.nope"},
		{fleetDoc("{rate: 3000}", "    unit: bytes"), "requires unit packets"},
		{doc("rules:", "  - {name: a, protocol: tcp, ports: [1], rate: 10, fleet: {rate: 30, key: k}}",
			"  - {name: b, protocol: tcp, ports: [2], rate: 10, fleet: {rate: 30, key: k}}"), "t.yaml:3: rules[1].fleet.key: fleet key \"k\" is already the key of another rule (line 2)"},
	} {
		_, err := Parse("t.yaml", []byte(tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n got %v\nwant %s", tc.text, err, tc.want)
		}
	}
}
