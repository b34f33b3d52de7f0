//go:build linux

package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestApplyConfirm: `xlimit apply --confirm` puts rules in force through
// the daemon's API and, without `xlimit confirm` in time, the daemon goes
// back to the previous rules by itself and says so; confirmed rules stay
// and are kept for a restart (router-style "commit confirmed").
func TestApplyConfirm(t *testing.T) {
	e := newEnv(t)
	rate := func(n int) string {
		return fmt.Sprintf("rules:\n  - name: udp-flood\n    protocol: udp\n    ports: [%d]\n    rate: %d\n", udpPort, n)
	}
	d := e.startDaemon(e.writeRules("rules.yaml", rate(1000)))
	sock := filepath.Join(e.dir, "api.sock")
	newer := e.writeRules("newer.yaml", rate(3000))
	inForce := func() float64 {
		_, _, r, ok := e.status().rule("udp-flood")
		if !ok {
			t.Fatal("no rule udp-flood in the status")
		}
		return r
	}
	waitRate := func(what string, want float64, limit time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < limit {
			if within(inForce(), want, 1e-6) {
				return time.Since(start)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s: rate %v after %v, want %v", what, inForce(), limit, want)
		return 0
	}

	// Not confirmed: back to the file's rules after the deadline.
	out, err := hostCmd(xlimitBin, "apply", "--confirm", "5s", "--api-socket", sock, newer)
	if err != nil || !strings.Contains(string(out), "the previous rules return at") {
		t.Fatalf("apply --confirm: %v: %s", err, out)
	}
	applied := time.Now()
	if r := inForce(); !within(r, 3000, 1e-6) {
		t.Fatalf("after apply --confirm: rate %v, want 3000", r)
	}
	took := waitRate("without a confirmation", 1000, 15*time.Second)
	back := time.Since(applied)
	d.waitLog("NO CONFIRMATION in time", 2*time.Second)
	if back < 5*time.Second {
		t.Errorf("reverted %v after the apply, before its 5 s deadline", back)
	}
	if data, err := os.ReadFile(filepath.Join(e.stateDir, "api.yaml")); err == nil {
		t.Errorf("unconfirmed rules were kept for a restart: %q", data)
	}

	// Confirmed: they stay past the deadline and are kept.
	if out, err := hostCmd(xlimitBin, "apply", "--confirm", "5s", "--api-socket", sock, newer); err != nil {
		t.Fatalf("apply --confirm: %v: %s", err, out)
	}
	if out, err := hostCmd(xlimitBin, "confirm", "--api-socket", sock); err != nil || !strings.Contains(string(out), "confirmed") {
		t.Fatalf("confirm: %v: %s", err, out)
	}
	time.Sleep(7 * time.Second)
	if r := inForce(); !within(r, 3000, 1e-6) {
		t.Errorf("confirmed rules: rate %v 7 s later, want 3000", r)
	}
	if data, err := os.ReadFile(filepath.Join(e.stateDir, "api.yaml")); err != nil || !strings.Contains(string(data), "rate: 3000") {
		t.Errorf("confirmed rules not kept for a restart: %q, %v", data, err)
	}
	if out, err := hostCmd(xlimitBin, "confirm", "--api-socket", sock); err == nil || !strings.Contains(string(out), "no rules are waiting") {
		t.Errorf("a second confirm: %v: %s", err, out)
	}
	t.Logf("e2e apply --confirm 5s: rate 3000 in force, back to 1000 %v after the apply (seen after %v of polling) with the log line; confirmed: 3000 still in force 7 s later", back.Round(100*time.Millisecond), took.Round(100*time.Millisecond))
}
