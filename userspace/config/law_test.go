package config

import (
	"strings"
	"testing"
)

// adaptive: law track is the default, aimd is selectable; track has no
// gains, so the gains of aimd are ignored with a warning under it;
// signal socket_queue reads UDP sockets by port.
func TestAdaptiveLawAndSocketQueue(t *testing.T) {
	udp := func(extra string) string {
		return doc("rules:", "  - name: dns", "    protocol: udp", "    ports: [53]", "    rate: 1000",
			"    behavior: adaptive", "    adaptive: {target_latency: 10ms, min_rate: 100, max_rate: 5000"+extra+"}")
	}
	c := mustParse(t, udp(", signal: socket_queue"))
	if a := c.Rules[0].Adaptive; a.Law != LawTrack || a.Signal != SignalSocketQueue {
		t.Errorf("defaults: %+v", a)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings: %v", c.Warnings)
	}
	c = mustParse(t, udp(", law: aimd, ka: 10"))
	if a := c.Rules[0].Adaptive; a.Law != LawAIMD || a.KA != 10 || len(c.Warnings) != 0 {
		t.Errorf("law aimd: %+v, warnings %v", a, c.Warnings)
	}
	c = mustParse(t, udp(", ka: 10, alpha: 0.5"))
	if len(c.Warnings) != 2 || !strings.Contains(c.Warnings[0].Error(), "t.yaml:7: rules[0].adaptive.ka: ignored: ka is a gain of law aimd") {
		t.Errorf("gains under law track: warnings %v", c.Warnings)
	}
	for _, tc := range []struct{ src, want string }{
		{udp(", law: pid"), "rules[0].adaptive.law: must be one of track, aimd, got \"pid\""},
		{doc("rules:", "  - name: web", "    protocol: tcp", "    ports: [80]", "    rate: 1000", "    behavior: adaptive",
			"    adaptive: {target_latency: 10ms, min_rate: 100, max_rate: 5000, signal: socket_queue}"),
			"t.yaml:7: rules[0].adaptive: signal socket_queue reads UDP sockets; the rule's protocol is tcp"},
		{doc("rules:", "  - name: dns", "    protocol: udp", "    rate: 1000", "    behavior: adaptive",
			"    adaptive: {target_latency: 10ms, min_rate: 100, max_rate: 5000, signal: socket_queue}"),
			"t.yaml:6: rules[0].adaptive: signal socket_queue needs the rule's ports"},
	} {
		_, err := Parse("t.yaml", []byte(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.src, err, tc.want)
		}
	}
}
