package config

import (
	"strings"
	"testing"
)

// TestQueueKernelLimits: what the kernel queue cannot match is rejected with
// its line.
func TestQueueKernelLimits(t *testing.T) {
	for _, tc := range []struct{ rule, want string }{
		{"protocol: icmp\n    rate: 10", "f:6: rules[0].paced: queue: kernel queues TCP and UDP"},
		{"protocol: any\n    rate: 10", "f:6: rules[0].paced: queue: kernel with protocol any needs ports"},
		{"protocol: udp\n    rate: 1", "f:6: rules[0].paced: queue: kernel needs rate × max_queueing_time of at least one packet, got 0.5"},
		{"protocol: tcp\n    syn_only: true\n    ports: [80]\n    rate: 10", ""},
		{"protocol: any\n    ports: [80]\n    rate: 10", ""},
	} {
		doc := "rules:\n  - name: q\n    " + tc.rule + "\n    behavior: paced\n    paced: {max_queueing_time: 500ms, queue: kernel}\n"
		_, err := Parse("f", []byte(doc))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.rule, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%q: error %v, want one containing %q", tc.rule, err, tc.want)
		}
	}
}
