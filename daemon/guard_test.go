//go:build linux

package daemon

import (
	"bytes"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestGuardSurvivesATypo: the rules file's allow list and management
// section (the guard against locking the operator out) stay in force when
// the rules file no longer parses at start: its last usable version, kept
// in the state directory, gives them, said loudly (issue 41, lower: the
// guard vanished exactly when the operator made a typo).
func TestGuardSurvivesATypo(t *testing.T) {
	dir, state := t.TempDir(), t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	good := "allow: [192.0.2.0/24]\nmanagement:\n  sources: [198.51.100.7/32]\n  tcp_ports: [22]\nrules: []\n"
	if err := os.WriteFile(file, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	g := readGuard(file, state, log)
	if g == nil || !slices.Equal(g.allow, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}) || g.mgmt == nil {
		t.Fatalf("the guard of a good file: %+v", g)
	}
	if err := os.WriteFile(file, []byte(good+"rules: [\n"), 0o600); err != nil { // a typo
		t.Fatal(err)
	}
	g = readGuard(file, state, log)
	if g == nil || !slices.Equal(g.allow, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}) ||
		g.mgmt == nil || len(g.mgmt.TCPPorts) != 1 {
		t.Fatalf("the guard after a typo: %+v, want the last usable file's\n%s", g, logs.String())
	}
	if !strings.Contains(logs.String(), "last usable") {
		t.Errorf("nothing logged of the guard kept:\n%s", logs.String())
	}
}
