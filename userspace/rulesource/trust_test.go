package rulesource

import (
	"strings"
	"testing"
)

// TestTrustWarnings: a Redis on the network without a password, or
// without TLS, is warned about; a unix socket or loopback is not (issue
// 41, lower: plain redis:// without a password was accepted silently).
func TestTrustWarnings(t *testing.T) {
	for _, c := range []struct {
		url, password string
		want          []string
	}{
		{"unix:///run/redis.sock", "", nil},
		{"redis://127.0.0.1:6379", "", nil},
		{"redis://localhost", "", nil},
		{"redis://[::1]:6379", "", nil},
		{"redis://10.0.0.5:6379", "", []string{"without a password", "without TLS"}},
		{"redis://10.0.0.5:6379", "secret", []string{"without TLS"}},
		{"rediss://redis.example:6380", "", []string{"without a password"}},
		{"rediss://redis.example:6380", "secret", nil},
	} {
		o, err := ParseURL(c.url)
		if err != nil {
			t.Fatal(err)
		}
		o.Redis.Password = c.password
		got := TrustWarnings(o.Redis, "--rules-source")
		if len(got) != len(c.want) {
			t.Errorf("%s (password %q): %q, want %d warnings", c.url, c.password, got, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: %q, want %q", c.url, got[i], w)
			}
		}
	}
}
