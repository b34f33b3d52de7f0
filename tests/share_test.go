//go:build linux

package tests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/tests/kit/xdpcount"
	"github.com/xlimit/xlimit/tests/kit/xdppass"
)

// Sharing the interface with another XDP program through libxdp's
// dispatcher (issue 43): Debian's xdp-tools (xdp-loader) loads the test kit's
// counting program, xlimit runs beside it, in either order; both see the
// traffic, xlimit's limit holds, and removing either leaves the other.

// requireFreplace skips where the kernel refuses freplace programs: there
// libxdp's dispatcher cannot run (xdp-loader falls back to attaching its
// program alone, and xlimit says why it cannot join; see
// TestForeignProgramNamed).
func requireFreplace(t *testing.T) {
	t.Helper()
	requireRoot(t)
	if err := loader.FreplaceSupported(); errors.Is(err, unix.EPERM) {
		t.Skipf("SKIP, not a pass: this kernel refuses freplace programs, which libxdp's dispatcher needs: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
}

// TestForeignProgramNamed: a program attached without libxdp's dispatcher
// (as `ip link set dev IFACE xdp obj ...` does) holds the interface. xlimit
// run, whatever --xdp-share says, refuses with an error that names the
// program (its id and name) and the choices, and leaves it attached.
func TestForeignProgramNamed(t *testing.T) {
	e := newEnv(t)
	var id uint32
	var remove func() error
	err := e.lab.Server.Do(func() error {
		var err error
		id, remove, err = xdppass.AttachNetlink(e.lab.ServerIf, "other_xdp")
		return err
	})
	if err != nil {
		t.Fatalf("attach the other program: %v", err)
	}
	t.Cleanup(func() {
		if err := e.lab.Server.Do(remove); err != nil {
			t.Errorf("cleanup: remove the other program: %v", err)
		}
	})
	rules := e.writeRules("rules.yaml", limitRules())
	for _, share := range []string{"auto", "always", "never"} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		out, err := e.lab.Server.Command(ctx, xlimitBin, "run", "--config", rules, "--iface", e.lab.ServerIf, "--bpffs", e.bpffs,
			"--state-dir", e.stateDir, "--metrics-addr", "", "--api-socket", "", "--xdp-share", share).CombinedOutput()
		cancel()
		t.Logf("e2e foreign program, --xdp-share %s: exit %v: %s", share, err, strings.TrimSpace(string(out)))
		if err == nil {
			t.Errorf("--xdp-share %s: xlimit run succeeded with another program on the interface", share)
		}
		want := fmt.Sprintf("already runs XDP program %d (other_xdp)", id)
		if !strings.Contains(string(out), want) || !strings.Contains(string(out), "xdp-loader") {
			t.Errorf("--xdp-share %s: the error does not say %q and the choices", share, want)
		}
		if got := e.serverXDP(); got != id {
			t.Fatalf("--xdp-share %s: the other program (id %d) was replaced or removed: now %d", share, id, got)
		}
	}
}

// sharer is the counting program loaded by xdp-loader on the server's veth.
type sharer struct {
	e      *env
	pinDir string // where xdp-loader pinned its counter
	id     string // its program id, as xdp-loader status shows it
}

// xdpLoader runs xdp-loader in the server's namespace, with libxdp's pins
// under the test's bpffs (LIBXDP_BPFFS), where xlimit pins its own.
func (e *env) xdpLoader(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := e.lab.Server.Command(ctx, "xdp-loader", args...)
	cmd.Env = append(os.Environ(), "LIBXDP_BPFFS="+e.bpffs)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// loadSharer loads xdpcount with xdp-loader (native mode, its counter
// pinned), and removes it when the test ends if it is still there.
func (e *env) loadSharer() *sharer {
	e.t.Helper()
	if _, err := exec.LookPath("xdp-loader"); err != nil {
		e.t.Fatalf("xdp-loader is not installed (make deps installs xdp-tools): %v", err)
	}
	obj, err := xdpcount.WriteObject(e.dir)
	if err != nil {
		e.t.Fatal(err)
	}
	s := &sharer{e: e, pinDir: filepath.Join(e.bpffs, "xdpcount")}
	if err := os.MkdirAll(s.pinDir, 0o700); err != nil {
		e.t.Fatal(err)
	}
	out, err := e.xdpLoader("load", "-m", "native", "-p", s.pinDir, e.lab.ServerIf, obj)
	if err != nil {
		e.t.Fatalf("xdp-loader load: %v: %s", err, out)
	}
	s.id = s.programID()
	if s.id == "" {
		e.t.Fatalf("xdp-loader status does not list xdpcount after the load:\n%s", s.status())
	}
	e.t.Cleanup(func() {
		if id := s.programID(); id != "" {
			if out, err := e.xdpLoader("unload", e.lab.ServerIf, "-i", id); err != nil {
				e.t.Errorf("cleanup: xdp-loader unload %s: %v: %s", id, err, out)
			}
		}
		_ = os.RemoveAll(s.pinDir)
	})
	return s
}

func (s *sharer) status() string {
	out, err := s.e.xdpLoader("status", s.e.lab.ServerIf)
	if err != nil {
		return fmt.Sprintf("xdp-loader status: %v: %s", err, out)
	}
	return out
}

// programID is the id xdp-loader status gives xdpcount, or "".
func (s *sharer) programID() string {
	for _, line := range strings.Split(s.status(), "\n") {
		f := strings.Fields(line)
		for i, w := range f {
			if w != "xdpcount" {
				continue
			}
			for _, v := range f[i+1:] {
				if _, err := fmt.Sscan(v, new(uint32)); err == nil && strings.Trim(v, "0123456789") == "" {
					return v
				}
			}
		}
	}
	return ""
}

func (s *sharer) count() uint64 {
	s.e.t.Helper()
	n, err := xdpcount.Count(s.pinDir)
	if err != nil {
		s.e.t.Fatal(err)
	}
	return n
}

// shareRun is one flood at the limited port with both programs in place:
// what the socket received beyond the burst, what xdpcount counted, and
// xlimit's pass and drop counters over it.
type shareRun struct {
	sent          uint64
	pps, admitted float64
	received      int
	counted       uint64
	pass, drop    uint64
}

func (e *env) shareFlood(ctx context.Context, s *sharer, udp *lab.UDPCounter, d time.Duration) shareRun {
	e.t.Helper()
	udp.Reset()
	var c0 uint64
	if s != nil {
		c0 = s.count()
	}
	p0, d0, _, _ := e.status().rule("udp-flood")
	res := e.flood(ctx, false, 20000, d)()
	udp.Settle(200*time.Millisecond, 2*time.Second)
	r := shareRun{sent: uint64(res.Sent), pps: res.PPS(), received: udp.Count(), admitted: admittedRate(udp.Count(), limitPPS, res.Elapsed)}
	if s != nil {
		r.counted = s.count() - c0
	}
	p1, d1, _, _ := e.status().rule("udp-flood")
	r.pass, r.drop = p1-p0, d1-d0
	return r
}

func (r shareRun) String() string {
	return fmt.Sprintf("offered %.0f pkt/s (%d sent), the socket received %d = burst + %.1f pkt/s (limit %d), xlimit pass %d drop %d, xdpcount saw %d",
		r.pps, r.sent, r.received, r.admitted, limitPPS, r.pass, r.drop, r.counted)
}

// check: xlimit held the limit (within 2 %), and xdpcount, which runs after
// it, saw every frame xlimit passed to the socket.
func (r shareRun) check(t *testing.T, what string) {
	t.Helper()
	t.Logf("e2e share, %s: %v", what, r)
	if r.pps < 5*limitPPS {
		t.Fatalf("%s: the flood reached only %.0f pkt/s: not a flood", what, r.pps)
	}
	if !within(r.admitted, limitPPS, 0.02) {
		t.Errorf("%s: received %.1f pkt/s beyond the burst, want %d within 2%%", what, r.admitted, limitPPS)
	}
	if r.drop == 0 {
		t.Errorf("%s: xlimit dropped nothing", what)
	}
	if r.counted < uint64(r.received) || r.counted > r.pass+r.pass/10+50 {
		t.Errorf("%s: xdpcount saw %d frames, want at least the %d the socket received and about xlimit's %d passes (it runs after xlimit)", what, r.counted, r.received, r.pass)
	}
}

// TestShareLoaderFirst: xdp-loader loads a program, then xlimit runs on the
// same interface (the default --xdp-share auto joins libxdp's dispatcher).
// Both run; xdp-loader removing its program leaves xlimit enforcing.
func TestShareLoaderFirst(t *testing.T) {
	requireFreplace(t)
	e := newEnv(t)
	udp, _ := e.services(false)
	s := e.loadSharer()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	d := e.startDaemon(e.writeRules("rules.yaml", limitRules()))
	t.Logf("xdp-loader status with both:\n%s", s.status())
	if s.programID() != s.id {
		t.Errorf("xdpcount is gone or replaced after xlimit attached (id %s, was %s):\n%s", s.programID(), s.id, s.status())
	}
	e.shareFlood(ctx, s, udp, 4*time.Second).check(t, "xdp-loader first, both attached")

	if out, err := e.xdpLoader("unload", e.lab.ServerIf, "-i", s.id); err != nil {
		t.Fatalf("xdp-loader unload %s: %v: %s", s.id, err, out)
	}
	if e.serverXDP() == 0 {
		t.Fatalf("removing xdpcount removed xlimit too")
	}
	r := e.shareFlood(ctx, nil, udp, 4*time.Second)
	t.Logf("e2e share, xdpcount removed: %v", r)
	if !within(r.admitted, limitPPS, 0.02) || r.drop == 0 {
		t.Errorf("after xdpcount was removed xlimit does not enforce: %v", r)
	}
	if !strings.Contains(d.Log(), "msg=enforcing") {
		t.Errorf("daemon log lacks enforcing")
	}
}

// TestShareXlimitFirst: xlimit attaches through a dispatcher of its own
// (--xdp-share always), then xdp-loader adds a program beside it. Both run;
// `xlimit detach` leaves the other program attached and running.
func TestShareXlimitFirst(t *testing.T) {
	requireFreplace(t)
	e := newEnv(t)
	udp, _ := e.services(false)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	d := e.startDaemon(e.writeRules("rules.yaml", limitRules()), "--xdp-share", "always")
	s := e.loadSharer()
	t.Logf("xdp-loader status with both:\n%s", s.status())
	e.shareFlood(ctx, s, udp, 4*time.Second).check(t, "xlimit first, both attached")

	if err := d.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if out, err := e.xlimit("detach", "--iface", e.lab.ServerIf); err != nil {
		t.Fatalf("xlimit detach: %v: %s", err, out)
	}
	if s.programID() != s.id {
		t.Fatalf("xlimit detach removed xdpcount (id now %q, was %s):\n%s", s.programID(), s.id, s.status())
	}
	c0 := s.count()
	udp.Reset()
	res := e.flood(ctx, false, 5000, 2*time.Second)()
	udp.Settle(200*time.Millisecond, 2*time.Second)
	seen := s.count() - c0
	t.Logf("e2e share, xlimit detached: sent %d, the socket received %d, xdpcount saw %d", res.Sent, udp.Count(), seen)
	if seen < uint64(udp.Count()) || udp.Count() < int(res.Sent)*9/10 {
		t.Errorf("after xlimit detach: sent %d, received %d, xdpcount saw %d: want everything through and counted", res.Sent, udp.Count(), seen)
	}
}

// TestShareUpgradeUnderFlood: with xdp-loader's program beside it, xlimit
// is restarted (a new daemon replaces its slot: a new dispatcher swapped
// in) during a flood. No second admits more than 1.05 x the limit, and the
// other program is the same one, still counting.
func TestShareUpgradeUnderFlood(t *testing.T) {
	requireFreplace(t)
	e := newEnv(t)
	udp, _ := e.services(false)
	s := e.loadSharer()
	rules := e.writeRules("rules.yaml", limitRules())
	d := e.startDaemon(rules)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Let the burst go first: the seconds measured are at the limit.
	e.flood(ctx, false, 20000, 2*time.Second)()
	udp.Reset()
	c0 := s.count()
	start := time.Now()
	wait := e.flood(ctx, false, 20000, 8*time.Second)
	time.Sleep(3 * time.Second)
	if err := d.signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	e.startDaemon(rules)
	upgraded := time.Since(start)
	res := wait()
	udp.Settle(200*time.Millisecond, 2*time.Second)
	worst := 0.0
	for i := 0; i < 7; i++ {
		t0 := start.Add(time.Duration(i) * time.Second)
		r := rateBetween(udp, t0, t0.Add(time.Second))
		worst = max(worst, r)
	}
	seen := s.count() - c0
	t.Logf("e2e share upgrade under flood: offered %.0f pkt/s; the new daemon was enforcing %v into the flood; the worst second admitted %.0f pkt/s (limit %d); xdpcount saw %d, the socket received %d",
		res.PPS(), upgraded.Round(time.Millisecond), worst, limitPPS, seen, udp.Count())
	if res.PPS() < 5*limitPPS {
		t.Fatalf("the flood reached only %.0f pkt/s: not a flood", res.PPS())
	}
	if worst > 1.05*limitPPS {
		t.Errorf("a second admitted %.0f pkt/s across the upgrade, want at most 1.05 x %d", worst, limitPPS)
	}
	if s.programID() != s.id {
		t.Errorf("the other program changed across xlimit's upgrade (id %q, was %s)", s.programID(), s.id)
	}
	if seen < uint64(udp.Count()) {
		t.Errorf("xdpcount saw %d frames, fewer than the %d xlimit passed to the socket", seen, udp.Count())
	}
}
