//go:build linux

package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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

// TestConfirmSurvivesDaemon: a daemon stopped inside the confirmation
// window of `xlimit apply --confirm` leaves the deadline to the kernel:
// with no daemon running, the previous rules are back in force within the
// deadline + 1 s (the kernel keeps the deadline and the previous
// generation, as it keeps fail-static's); a daemon started after the
// deadline keeps them, and one started inside the window reverts at once.
// Flooded at 50 000 pkt/s throughout: the rates are what the socket
// received.
func TestConfirmSurvivesDaemon(t *testing.T) {
	rate := func(n int) string {
		return fmt.Sprintf("rules:\n  - name: udp-flood\n    protocol: udp\n    ports: [%d]\n    rate: %d\n", udpPort, n)
	}
	apply := func(e *env, file string, within string) time.Time {
		t.Helper()
		out, err := hostCmd(xlimitBin, "apply", "--confirm", within, "--api-socket", filepath.Join(e.dir, "api.sock"), file)
		if err != nil || !strings.Contains(string(out), "the previous rules return at") {
			t.Fatalf("apply --confirm: %v: %s", err, out)
		}
		return time.Now()
	}

	t.Run("stopped", func(t *testing.T) {
		e := newEnv(t)
		udp, _ := e.services(false)
		rules := e.writeRules("rules.yaml", rate(1000))
		d := e.startDaemon(rules)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		wait := e.flood(ctx, false, 50000, 16*time.Second)
		time.Sleep(1500 * time.Millisecond)

		applied := apply(e, e.writeRules("cut.yaml", rate(100)), "5s")
		deadline := applied.Add(5 * time.Second)
		time.Sleep(time.Second)
		if err := d.signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		stopped := time.Now()
		time.Sleep(time.Until(deadline.Add(3500 * time.Millisecond)))
		_, _, shown, _ := e.status().rule("udp-flood")

		// A daemon started after the deadline keeps the previous rules.
		d2 := e.startDaemon(rules)
		restarted := time.Now()
		sent := wait()
		udp.Settle(200*time.Millisecond, 2*time.Second)
		pending := rateBetween(udp, stopped.Add(500*time.Millisecond), deadline.Add(-200*time.Millisecond))
		first := rateBetween(udp, deadline.Add(200*time.Millisecond), deadline.Add(time.Second))
		back := rateBetween(udp, deadline.Add(time.Second), deadline.Add(3*time.Second))
		after := rateBetween(udp, restarted.Add(500*time.Millisecond), applied.Add(14*time.Second))
		t.Logf("e2e confirm without a daemon: offered %.0f pkt/s; 1000/s, then apply --confirm 5s of 100/s, SIGTERM 1 s later: %.1f pkt/s while pending with no daemon, %.1f pkt/s from the deadline + 0.2 s to + 1 s, %.1f pkt/s from + 1 s to + 3 s (no daemon; status shows %v/s); %.1f pkt/s after a restart",
			sent.PPS(), pending, first, back, shown, after)
		if !within(pending, 100, 0.1) {
			t.Errorf("while pending with no daemon: %.1f pkt/s, want the unconfirmed 100 within 10%%", pending)
		}
		if !within(first, 1000, 0.1) {
			t.Errorf("from the deadline + 0.2 s to + 1 s with no daemon: %.1f pkt/s, want the previous 1000 within 10%%", first)
		}
		if !within(back, 1000, 0.05) {
			t.Errorf("from the deadline + 1 s with no daemon: %.1f pkt/s, want the previous 1000 within 5%%", back)
		}
		if !within(shown, 1000, 1e-6) {
			t.Errorf("status with no daemon after the deadline: rate %v, want 1000", shown)
		}
		if !within(after, 1000, 0.05) {
			t.Errorf("after a restart past the deadline: %.1f pkt/s, want 1000 within 5%%", after)
		}
		_ = d2
	})

	t.Run("restarted", func(t *testing.T) {
		e := newEnv(t)
		udp, _ := e.services(false)
		rules := e.writeRules("rules.yaml", rate(1000))
		d := e.startDaemon(rules)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		wait := e.flood(ctx, false, 50000, 14*time.Second)
		time.Sleep(1500 * time.Millisecond)

		applied := apply(e, e.writeRules("cut.yaml", rate(100)), "10s")
		deadline := applied.Add(10 * time.Second)
		time.Sleep(time.Second)
		if err := d.signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		e.startDaemon(rules)
		restarted := time.Now()
		if restarted.After(deadline.Add(-3 * time.Second)) {
			t.Fatalf("the restart took until %v before the deadline: not inside the window", time.Until(deadline))
		}
		sent := wait()
		udp.Settle(200*time.Millisecond, 2*time.Second)
		inWindow := rateBetween(udp, restarted.Add(time.Second), deadline.Add(-200*time.Millisecond))
		past := rateBetween(udp, deadline.Add(200*time.Millisecond), applied.Add(12*time.Second))
		_, _, shown, _ := e.status().rule("udp-flood")
		t.Logf("e2e confirm, restart inside the window: offered %.0f pkt/s; %.1f pkt/s from the restart + 1 s to the deadline, %.1f pkt/s after it; status %v/s",
			sent.PPS(), inWindow, past, shown)
		if !within(inWindow, 1000, 0.05) || !within(past, 1000, 0.05) {
			t.Errorf("after a restart inside the window: %.1f then %.1f pkt/s, want the previous 1000 within 5%%", inWindow, past)
		}
		if !within(shown, 1000, 1e-6) {
			t.Errorf("status after the restart: %v, want 1000", shown)
		}
	})
}
