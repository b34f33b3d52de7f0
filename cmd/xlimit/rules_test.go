//go:build linux

package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestRulesCLI: usage errors exit 2; a file that does not validate is
// reported like 'xlimit check' and never reaches Redis; Redis errors exit 1.
// (Pushing to a real Redis is tested in tests/redis_test.go.)
func TestRulesCLI(t *testing.T) {
	nowhere := "unix://" + filepath.Join(t.TempDir(), "no.sock")
	good := writeFile(t, "good.yaml", "rules:\n  - name: u\n    protocol: udp\n    ports: [9000]\n    rate: 10\n")
	bad := writeFile(t, "bad.yaml", "rules:\n  - name: u\n    protocol: udp\n    ports: [0]\n    rate: 10\n")
	for _, args := range [][]string{
		{"rules"},
		{"rules", "pull"},
		{"rules", "push", good},
		{"rules", "push", "--redis", nowhere},
		{"rules", "push", "--redis", nowhere, good, good},
		{"rules", "push", "--redis", "http://h", good},
		{"rules", "push", "--redis", "redis://h?resync=1ms", good},
		{"rules", "show", "--redis", nowhere, "extra"},
		{"run", "--rules-source", "redis://h?bogus=1", "--iface", "lo"},
	} {
		if code, _, errOut := runCLI(t, args...); code != 2 {
			t.Errorf("xlimit %v: code %d, want 2 (stderr %q)", args, code, errOut)
		}
	}
	code, _, errOut := runCLI(t, "rules", "push", "--redis", nowhere, bad)
	if code != 1 || !strings.Contains(errOut, "bad.yaml:4: rules[0].ports[0]") || !strings.Contains(errOut, "not pushed") || strings.Contains(errOut, "dial") {
		t.Errorf("push of an invalid file: code %d, stderr %q; want 1, the check's lines, and no attempt to connect", code, errOut)
	}
	code, out, errOut := runCLI(t, "rules", "push", "--redis", nowhere, good)
	if code != 1 || !strings.Contains(out, "good.yaml: ok") || !strings.Contains(errOut, "no.sock") {
		t.Errorf("push to no Redis: code %d, stdout %q, stderr %q; want 1 naming the socket", code, out, errOut)
	}
	if code, _, errOut := runCLI(t, "rules", "show", "--redis", nowhere); code != 1 {
		t.Errorf("show from no Redis: code %d, stderr %q", code, errOut)
	}
	for _, sub := range []string{"push", "show"} {
		if code, out, _ := runCLI(t, "rules", sub, "--help"); code != 0 || !strings.Contains(out, "Usage: xlimit rules "+sub) {
			t.Errorf("xlimit rules %s --help: code %d, stdout %q", sub, code, out)
		}
	}
}
