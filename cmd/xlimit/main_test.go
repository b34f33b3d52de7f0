package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = mainWithArgs(context.Background(), &env{stdout: &o, stderr: &e}, args)
	return code, o.String(), e.String()
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheck(t *testing.T) {
	good := writeFile(t, "good.yaml", "rules:\n  - name: dns\n    protocol: udp\n    ports: [53]\n    rate: 100\n")
	code, out, errOut := runCLI(t, "check", good)
	if code != 0 || !strings.Contains(out, "ok (1 rules)") {
		t.Errorf("check good: code %d, stdout %q, stderr %q", code, out, errOut)
	}

	bad := writeFile(t, "bad.yaml", "rules:\n  - name: dns\n    protocol: udp\n    ports: [0]\n    rate: 100\n    syn_only: true\n")
	code, _, errOut = runCLI(t, "check", bad)
	if code != 1 {
		t.Errorf("check bad: code %d, want 1", code)
	}
	for _, want := range []string{bad + ":4: rules[0].ports[0]:", bad + ":6: rules[0].syn_only:"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("check bad: stderr lacks %q:\n%s", want, errOut)
		}
	}

	code, _, errOut = runCLI(t, "check", filepath.Join(t.TempDir(), "missing.yaml"))
	if code != 1 || !strings.Contains(errOut, "missing.yaml") {
		t.Errorf("check missing: code %d, stderr %q", code, errOut)
	}

	unenforced := writeFile(t, "slow.yaml", "rules:\n  - name: w\n    protocol: tcp\n    rate: 10\n    circuit_breaker: {slow_latency: 100ms, slow_ratio: 0.5}\n")
	code, _, errOut = runCLI(t, "check", unenforced)
	if code != 0 || !strings.Contains(errOut, "not enforced by this version: rule w (line 2): circuit_breaker slow_ratio without a probe") {
		t.Errorf("check slow_ratio without a probe: code %d, stderr %q: want a not-enforced warning", code, errOut)
	}
	conc := writeFile(t, "conc.yaml", "rules:\n  - name: w\n    protocol: tcp\n    rate: 10\n    concurrency: {max: 5}\n")
	code, _, errOut = runCLI(t, "check", conc)
	if code != 0 || strings.Contains(errOut, "not enforced") {
		t.Errorf("check concurrency: code %d, stderr %q: concurrency limits are enforced", code, errOut)
	}
	warm := writeFile(t, "warm.yaml", "rules:\n  - name: w\n    protocol: tcp\n    rate: 10\n    behavior: warm_up\n    warm_up: {period: 10s}\n")
	code, _, errOut = runCLI(t, "check", warm)
	if code != 0 || strings.Contains(errOut, "not enforced") {
		t.Errorf("check warm_up: code %d, stderr %q: warm-up is enforced", code, errOut)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"nonsense"},
		{"check"},
		{"check", "a", "b"},
		{"run"},
		{"run", "--config", "x", "--xdp-mode", "offload"},
		{"status", "--bogus"},
		{"detach"},
	} {
		if code, _, errOut := runCLI(t, args...); code != 2 {
			t.Errorf("xlimit %v: code %d, want 2 (stderr %q)", args, code, errOut)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, c := range commands() {
		code, out, _ := runCLI(t, c.name, "--help")
		if code != 0 || strings.Count(out, "Usage: xlimit "+c.name) != 1 || !strings.Contains(out, "--help") {
			t.Errorf("xlimit %s --help: code %d, stdout %q: want the usage once", c.name, code, out)
		}
	}
	code, out, _ := runCLI(t, "--help")
	if code != 0 || !strings.Contains(out, "demo") {
		t.Errorf("xlimit --help: code %d, stdout %q", code, out)
	}
	if code, out, _ := runCLI(t, "version"); code != 0 || !strings.HasPrefix(out, "xlimit ") {
		t.Errorf("xlimit version: code %d, stdout %q", code, out)
	}
}

// docs/examples/http-service.yaml, the recommended file for an HTTP
// service (docs/control.md), passes `xlimit check` with everything enforced
// and says what the docs say of it: port 80, response_time, target 30 ms,
// resets. (Warnings about this machine's interfaces may come: the file
// names eth0.)
func TestCheckHTTPServiceExample(t *testing.T) {
	const file = "../../docs/examples/http-service.yaml"
	code, out, errOut := runCLI(t, "check", file)
	if code != 0 || !strings.Contains(out, "ok (1 rules)") || strings.Contains(errOut, "not enforced") || strings.Contains(errOut, "ignored") {
		t.Fatalf("check %s: code %d, stdout %q, stderr %q", file, code, out, errOut)
	}
	cfg, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Rules[0]
	if len(r.Ports) != 1 || r.Ports[0] != (dataplane.PortRange{Lo: 80, Hi: 80}) || !r.SynOnly || r.Refuse != dataplane.RefuseReset ||
		r.Behavior != config.BehaviorAdaptive || r.Adaptive.Signal != config.SignalResponseTime || r.Adaptive.TargetLatency != 30*time.Millisecond {
		t.Errorf("%s: rule %+v, adaptive %+v: want port 80, syn_only, refuse reset, adaptive on response_time at 30ms", file, r, r.Adaptive)
	}
}
