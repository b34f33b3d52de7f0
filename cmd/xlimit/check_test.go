package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestCheckStopsOnSignal: check of a large document ends as soon as its
// context does (SIGINT, SIGTERM), not when the compilation is done.
func TestCheckStopsOnSignal(t *testing.T) {
	var doc strings.Builder
	doc.WriteString("rules:\n")
	for r := range 64 {
		fmt.Fprintf(&doc, "  - name: r%d\n    protocol: tcp\n    ports: [%d]\n    rate: 1000\n", r, 1000+r)
		if r > 0 {
			doc.WriteString("    sources: *shared\n")
			continue
		}
		doc.WriteString("    sources: &shared\n")
		for i := range 65536 {
			fmt.Fprintf(&doc, "      - 10.%d.%d.0/24\n", i>>8, i&255)
		}
	}
	file := writeFile(t, "big.yaml", doc.String())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var o, e bytes.Buffer
	start := time.Now()
	code := mainWithArgs(ctx, &env{stdout: &o, stderr: &e}, []string{"check", file})
	took := time.Since(start)
	if code != 1 || !strings.Contains(e.String(), "interrupted") {
		t.Errorf("check with its context ended: code %d after %v, stdout %q, stderr %q", code, took, o.String(), e.String())
	}
	t.Logf("check of a %d-byte document, interrupted: returned after %v", doc.Len(), took)
}

// TestFailStaticBound: --fail-static-after has an upper bound, refused as
// a usage error before anything is touched.
func TestFailStaticBound(t *testing.T) {
	file := writeFile(t, "r.yaml", "rules:\n  - name: dns\n    protocol: udp\n    ports: [53]\n    rate: 100\n")
	code, _, errOut := runCLI(t, "run", "--config", file, "--iface", "xl-none0", "--metrics-addr", "", "--api-socket", "",
		"--state-dir", t.TempDir(), "--fail-static-after", "8760h")
	if code != 2 || !strings.Contains(errOut, "--fail-static-after 8760h0m0s: at most 1m0s") {
		t.Errorf("run --fail-static-after 8760h: code %d, stderr %q", code, errOut)
	}
}
