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

// rateBurstRules limits the UDP port to rate packets/s with a burst of
// 1000 packets whatever the rate (issue 26's setting).
func rateBurstRules(rate int) string {
	return fmt.Sprintf("rules:\n  - name: udp-flood\n    protocol: udp\n    ports: [%d]\n    rate: %d\n    burst: 1000\n", udpPort, rate)
}

// TestRateChangeUnderFlood: a flood held at 100/s (burst 1000), then a
// SIGHUP to 1000/s (burst 1000): the first full second after the reload
// admits at least 900 (not nothing until the old rule's 10 s of debt has
// drained, issue 26); then back to 100/s: at most 110 in the first
// second (not the new tolerance's 9 s as a fresh burst). The rates are
// what the socket received (kernel receive timestamps).
func TestRateChangeUnderFlood(t *testing.T) {
	e := newEnv(t)
	udp, _ := e.services(false)
	rules := e.writeRules("rules.yaml", rateBurstRules(100))
	d := e.startDaemon(rules)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wait := e.flood(ctx, false, 5000, 12*time.Second)

	reload := func(rate int) time.Time {
		t.Helper()
		if err := os.WriteFile(rules, []byte(rateBurstRules(rate)), 0o600); err != nil {
			t.Fatal(err)
		}
		n := strings.Count(d.Log(), "msg=reloaded")
		sent := time.Now()
		if err := d.signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for strings.Count(d.Log(), "msg=reloaded") == n {
			if time.Since(sent) > 10*time.Second {
				t.Fatalf("no reload to %d/s logged within 10 s:\n%s", rate, d.Log())
			}
			time.Sleep(20 * time.Millisecond)
		}
		return time.Now()
	}

	// The first burst is spent in a fifth of a second; 4 s at 100/s.
	time.Sleep(4 * time.Second)
	up := reload(1000)
	time.Sleep(3 * time.Second)
	down := reload(100)
	sent := wait()
	udp.Settle(200*time.Millisecond, 2*time.Second)

	held := udp.CountBetween(up.Add(-3*time.Second), up.Add(-time.Second))
	raised := udp.CountBetween(up, up.Add(time.Second))
	raised2 := udp.CountBetween(up.Add(time.Second), up.Add(2*time.Second))
	cut := udp.CountBetween(down, down.Add(time.Second))
	cut2 := udp.CountBetween(down.Add(time.Second), down.Add(2*time.Second))
	t.Logf("e2e rate change under a %.0f pkt/s flood, burst 1000: held at 100/s: %d in 2 s; SIGHUP to 1000/s: %d in the first second after the reload, %d in the next; SIGHUP back to 100/s: %d in the first second, %d in the next",
		sent.PPS(), held, raised, raised2, cut, cut2)
	if sent.PPS() < 2500 {
		t.Fatalf("the flood reached only %.0f pkt/s: not a flood", sent.PPS())
	}
	if held > 2*110 {
		t.Errorf("held at 100/s: %d in 2 s, want at most 220", held)
	}
	if raised < 900 {
		t.Errorf("first second after the raise to 1000/s: %d admitted, want at least 900", raised)
	}
	if cut > 110 {
		t.Errorf("first second after the cut back to 100/s: %d admitted, want at most 110", cut)
	}
}

// TestRateChangeConfirmRevert: the rules file says 1000/s (burst 1000);
// `apply --confirm 5s` of 100/s under a flood, not confirmed: the cut
// holds at once (at most 110 in its first second) and the revert to
// 1000/s admits at least 900 in the first second after the deadline
// (issue 26: 0/s for 2 s).
func TestRateChangeConfirmRevert(t *testing.T) {
	e := newEnv(t)
	udp, _ := e.services(false)
	d := e.startDaemon(e.writeRules("rules.yaml", rateBurstRules(1000)))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wait := e.flood(ctx, false, 5000, 11*time.Second)

	time.Sleep(2 * time.Second)
	out, err := hostCmd(xlimitBin, "apply", "--confirm", "5s", "--api-socket", filepath.Join(e.dir, "api.sock"),
		e.writeRules("cut.yaml", rateBurstRules(100)))
	if err != nil || !strings.Contains(string(out), "the previous rules return at") {
		t.Fatalf("apply --confirm: %v: %s", err, out)
	}
	applied := time.Now()
	deadline := applied.Add(5 * time.Second)
	sent := wait()
	udp.Settle(200*time.Millisecond, 2*time.Second)
	d.waitLog("NO CONFIRMATION in time", 2*time.Second)

	cut := udp.CountBetween(applied, applied.Add(time.Second))
	pending := udp.CountBetween(applied.Add(time.Second), deadline.Add(-100*time.Millisecond))
	// From 0.1 s after the deadline (the kernel's revert; the apply's
	// reply came a moment after the daemon set it).
	reverted := udp.CountBetween(deadline.Add(100*time.Millisecond), deadline.Add(1100*time.Millisecond))
	reverted2 := udp.CountBetween(deadline.Add(1100*time.Millisecond), deadline.Add(2100*time.Millisecond))
	t.Logf("e2e confirm revert under a %.0f pkt/s flood, burst 1000: 1000/s, then apply --confirm 5s of 100/s: %d in its first second, %d in the %.1f s after; reverted to 1000/s: %d in the first second after the deadline, %d in the next",
		sent.PPS(), cut, pending, deadline.Add(-100*time.Millisecond).Sub(applied.Add(time.Second)).Seconds(), reverted, reverted2)
	if sent.PPS() < 2500 {
		t.Fatalf("the flood reached only %.0f pkt/s: not a flood", sent.PPS())
	}
	if cut > 110 {
		t.Errorf("first second of the unconfirmed 100/s: %d admitted, want at most 110", cut)
	}
	if reverted < 900 {
		t.Errorf("first second after the revert to 1000/s: %d admitted, want at least 900", reverted)
	}
}
