package daemon

import (
	"strings"
	"testing"

	"github.com/xlimit/xlimit/userspace/config"
)

// A breaker is enforced; only its slow check without a probe is not.
func TestBreakerNotEnforced(t *testing.T) {
	for _, c := range []struct {
		breaker string
		warn    bool
	}{
		{"{error_ratio: 0.5}", false},
		{"{slow_latency: 100ms, slow_ratio: 0.5}", true},
	} {
		cfg, err := config.Parse("t.yaml", []byte("rules:\n  - name: b\n    protocol: tcp\n    ports: [80]\n    syn_only: true\n    rate: 100\n    circuit_breaker: "+c.breaker+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		got := notEnforced(cfg)
		if warned := len(got) == 1 && strings.Contains(got[0], "slow_ratio without a probe"); warned != c.warn || (!c.warn && len(got) != 0) {
			t.Errorf("%s: not enforced %q, want a slow_ratio warning: %v", c.breaker, got, c.warn)
		}
	}
}
