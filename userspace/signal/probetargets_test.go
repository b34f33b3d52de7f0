package signal

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
)

// TestProbePolicy: probes go to loopback, the host's own addresses and
// the operator's allowed prefixes only, never more often than
// MinProbeInterval.
func TestProbePolicy(t *testing.T) {
	pp := ProbePolicy{
		Allow:     []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		HostAddrs: func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.0.2.7")}, nil },
	}
	probe := func(addr string, every time.Duration) map[string]config.Probe {
		return map[string]config.Probe{"r": {Kind: config.ProbeTCP, Address: addr, Interval: every, Timeout: every / 2}}
	}
	for _, ok := range []string{"127.0.0.1:80", "[::1]:80", "localhost:80", "127.9.9.9:1", "192.0.2.7:8080", "198.51.100.9:443"} {
		if err := pp.Check(probe(ok, time.Second)); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for addr, want := range map[string]string{
		"203.0.113.5:80":     "target 203.0.113.5 is not loopback, not an address of this host, and not in --probe-allow",
		"[2001:db8::1]:80":   "target 2001:db8::1 is not loopback",
		"192.0.2.8:80":       "target 192.0.2.8",
		"198.51.101.1:80":    "target 198.51.101.1",
		"[::ffff:8.8.8.8]:1": "target 8.8.8.8",
	} {
		if err := pp.Check(probe(addr, time.Second)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", addr, err, want)
		}
	}
	if err := pp.Check(probe("127.0.0.1:80", 10*time.Millisecond)); err == nil || !strings.Contains(err.Error(), "interval 10ms is shorter than the minimum of 100ms") {
		t.Errorf("a probe every 10ms: %v", err)
	}
}
