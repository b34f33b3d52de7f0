package config

import (
	"strings"
	"testing"
)

// signal response_time is for TCP rules; refuse is drop (the default,
// also "") or reset, reset for TCP only; bad values name FILE:LINE.
func TestResponseTimeAndRefuse(t *testing.T) {
	web := func(proto, extra string) string {
		return doc("rules:", "  - name: web", "    protocol: "+proto, "    ports: [80]", "    syn_only: true", "    rate: 1000",
			"    behavior: adaptive", "    adaptive: {target_latency: 10ms, min_rate: 100, max_rate: 5000, signal: response_time}"+extra)
	}
	c := mustParse(t, web("tcp", ""))
	if r := c.Rules[0]; r.Adaptive.Signal != SignalResponseTime || r.Refuse != "" {
		t.Errorf("response_time: signal %q refuse %q", r.Adaptive.Signal, r.Refuse)
	}
	c = mustParse(t, web("tcp", "\n    refuse: reset"))
	if r := c.Rules[0]; r.Refuse != RefuseReset {
		t.Errorf("refuse reset: %q", r.Refuse)
	}
	c = mustParse(t, web("tcp", "\n    refuse: drop"))
	if r := c.Rules[0]; r.Refuse != "" {
		t.Errorf("refuse drop: %q, want the default \"\"", r.Refuse)
	}
	udp := doc("rules:", "  - name: dns", "    protocol: udp", "    ports: [53]", "    rate: 1000",
		"    behavior: adaptive", "    adaptive: {target_latency: 10ms, min_rate: 100, max_rate: 5000, signal: response_time}")
	for _, tc := range []struct{ src, want string }{
		{udp, "t.yaml:7: rules[0].adaptive: signal response_time times TCP requests and responses; the rule's protocol is udp"},
		{web("tcp", "\n    refuse: rst"), "t.yaml:9: rules[0].refuse: must be one of drop, reset, got \"rst\""},
		{doc("rules:", "  - name: dns", "    protocol: udp", "    rate: 10", "    refuse: reset"),
			"t.yaml:5: rules[0].refuse: reset answers TCP SYNs: requires protocol tcp (protocol is udp)"},
	} {
		_, err := Parse("t.yaml", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n got %v\nwant %q", tc.src, err, tc.want)
		}
	}
}
