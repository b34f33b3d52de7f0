//go:build linux && !xlimit_demo

package main

import (
	"strings"
	"testing"
)

// TestDemoNotInRelease: a release build's `xlimit demo` fails (exit 1) and
// says why, before it needs root; its --help still works.
func TestDemoNotInRelease(t *testing.T) {
	code, out, errOut := runCLI(t, "demo")
	if code != 1 || !strings.Contains(errOut, "xlimit demo: not in this build") || !strings.Contains(errOut, "make build") || out != "" {
		t.Errorf("xlimit demo: code %d, stdout %q, stderr %q: want 1 and the refusal", code, out, errOut)
	}
	if code, _, _ := runCLI(t, "demo", "--help"); code != 0 {
		t.Errorf("xlimit demo --help: code %d, want 0", code)
	}
}
