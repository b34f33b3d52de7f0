package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocumentSizeLimit: a document over MaxDocumentBytes is refused with
// a clear error, by Parse (the API, the rules source) and by ReadFile
// (run, reload, check) before the file is read whole.
func TestDocumentSizeLimit(t *testing.T) {
	big := make([]byte, MaxDocumentBytes+1)
	for i := range big {
		big[i] = '#'
	}
	if _, err := Parse("api", big); err == nil || !strings.Contains(err.Error(), "more than the limit of 16777216 bytes") {
		t.Errorf("Parse of %d bytes: %v", len(big), err)
	}
	dir := t.TempDir()
	sparse := filepath.Join(dir, "huge.yaml")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil { // 1 TiB, sparse
		t.Fatal(err)
	}
	f.Close()
	if _, err := Load(sparse); err == nil || !strings.Contains(err.Error(), "document of 1099511627776 bytes") {
		t.Errorf("Load of a 1 TiB file: %v", err)
	}
	if _, err := ReadFile("/dev/zero"); err == nil || !strings.Contains(err.Error(), "more than the limit") {
		t.Errorf("ReadFile of /dev/zero: %v", err)
	}
	ok := filepath.Join(dir, "ok.yaml")
	if err := os.WriteFile(ok, []byte("interfaces: [eth0]\nrules: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(ok); err != nil {
		t.Errorf("Load of a small file: %v", err)
	}
}

// TestBanBounds: a ban longer than MaxBanDuration, or after longer than
// MaxBanAfter, is refused at its line.
func TestBanBounds(t *testing.T) {
	doc := func(after, duration string) []byte {
		return []byte("rules:\n  - name: r\n    protocol: tcp\n    ports: [80]\n    rate: 100\n    per_source:\n      rate: 10\n      ban: {after: " + after + ", duration: " + duration + "}\n")
	}
	if _, err := Parse("f", doc("10s", "24h")); err != nil {
		t.Errorf("ban of 24h after 10s: %v", err)
	}
	for _, c := range []struct{ after, duration, want string }{
		{"10s", "8760h", "f:8: rules[0].per_source.ban.duration: 8760h0m0s is longer than the maximum of 24h0m0s"},
		{"2h", "1h", "f:8: rules[0].per_source.ban.after: 2h0m0s is longer than the maximum of 1h0m0s"},
	} {
		if _, err := Parse("f", doc(c.after, c.duration)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ban after %s duration %s: %v, want %q", c.after, c.duration, err, c.want)
		}
	}
}

// TestProbeIntervalBound: a probe more often than MinProbeInterval is
// refused at its line.
func TestProbeIntervalBound(t *testing.T) {
	doc := "rules:\n  - name: r\n    protocol: tcp\n    ports: [80]\n    rate: 100\n    adaptive:\n      min_rate: 10\n      max_rate: 100\n      signal: probe\n      probe: {kind: tcp, address: \"127.0.0.1:80\", interval: 10ms, timeout: 5ms}\n"
	if _, err := Parse("f", []byte(doc)); err == nil || !strings.Contains(err.Error(), "f:10: rules[0].adaptive.probe.interval: 10ms is shorter than the minimum of 100ms") {
		t.Errorf("a probe every 10ms: %v", err)
	}
}
