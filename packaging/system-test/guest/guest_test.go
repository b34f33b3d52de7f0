//go:build linux

// Package guest is the part of `make system-test` that runs inside the
// booted Debian 12 guest (systemd as PID 1, its own network namespace):
// packaging/system-test/run.sh builds the guest, copies this test binary and
// the .deb in, and boots it; a oneshot unit runs TestSystem and powers the
// guest off. Every step fails the test on its own; the steps run in order
// and stop at the first failure. See packaging/README.md.
package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
)

// The guest's lab: xlg0 in the guest's own network namespace (where
// xlimit.service runs) and its peer xlf0 in the namespace xlflood, where
// the flood comes from. Both exist only inside the guest.
const (
	guestIf   = "xlg0"
	floodIf   = "xlf0"
	floodNS   = "xlflood"
	floodPort = 9000
	rateLimit = 1000 // the flood rule's rate, packets per second
	burst     = 100
	promURL   = "http://127.0.0.1:9090"
	metrics   = "http://127.0.0.1:9542/metrics"
	unit      = "xlimit.service"
)

var (
	guestIP = netip.MustParseAddr("198.18.7.1")
	floodIP = netip.MustParseAddr("198.18.7.2")
)

// rules is the rules file under test: a rule for each kind of panel of the
// dashboard (limited, shadow, adaptive with a probe and on an accept
// queue (its in-flight cap), concurrency, kernel
// queue, SYN cookies, a fleet budget), so that every query has a series to
// return.
const rules = `interfaces: [xlg0]
rules:
  - name: flood
    protocol: udp
    ports: [9000]
    rate: 1000
    burst: 100
  - name: shadow
    protocol: udp
    ports: [9001]
    rate: 100
    burst: 10
    shadow: true
  - name: api
    protocol: tcp
    ports: [8080]
    rate: 2000
    behavior: adaptive
    adaptive: {target_latency: 25ms, min_rate: 1000, max_rate: 12000, signal: probe, probe: {kind: http, address: "127.0.0.1:9090", path: /-/healthy}}
  - name: accepts
    protocol: tcp
    ports: [8082]
    syn_only: true
    rate: 1000
    behavior: adaptive
    adaptive: {target_latency: 25ms, min_rate: 100, max_rate: 5000, signal: accept_queue}
  - name: conns
    protocol: tcp
    ports: [8081]
    rate: 1000
    concurrency: {soft: 50, max: 100}
  - name: paced
    protocol: udp
    ports: [9002]
    rate: 500
    behavior: paced
    paced: {max_queueing_time: 200ms, queue: kernel}
  - name: web
    protocol: tcp
    ports: [8443]
    syn_only: true
    rate: 500
    syn_cookies: auto
  - name: shared
    protocol: udp
    ports: [9003]
    rate: 2000
    fleet: {rate: 3000, safe_rate: 1000}
`

// badRules does not validate (line 4: a reversed port range).
const badRules = `interfaces: [xlg0]
rules:
  - name: flood
    protocol: udp
    ports: ["9000-8000"]
    rate: 1000
`

func TestSystem(t *testing.T) {
	if os.Getenv("XLIMIT_SYSTEM_TEST_GUEST") != "1" {
		t.Skip("runs only inside the system-test guest (make system-test)")
	}
	deb := os.Getenv("XLIMIT_DEB")
	if deb == "" {
		t.Fatal("XLIMIT_DEB (the .deb to install) is not set")
	}
	steps := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"0_lab", setupLab},
		{"1_dpkg_install", func(t *testing.T) { stepInstall(t, deb) }},
		{"2_start_ready_after_attach", stepStart},
		{"3_flood_held_at_limit", func(t *testing.T) { floodHeld(t, "daemon running") }},
		{"4_reload_bad_file_keeps_rules", stepBadReload},
		{"5_watchdog_restarts_hung_daemon", stepWatchdog},
		{"6_stop_keeps_protection", stepStop},
		{"7_journal_structured", stepJournal},
		{"8_prometheus_scrapes_dashboard_queries", stepPrometheus},
		{"9_daemon_down_alert_fires", stepDownAlert},
	}
	// Upgrades from earlier versions' packages under a flood come first,
	// after the lab (XLIMIT_OLD_DEBS, upgrade_test.go); each ends with a
	// purge, so the install step is a first install still.
	all := steps[:1:1]
	for i, old := range strings.Fields(os.Getenv("XLIMIT_OLD_DEBS")) {
		name := fmt.Sprintf("0_upgrade_%d_from_%s", i+1, strings.TrimSuffix(filepath.Base(old), ".deb"))
		all = append(all, struct {
			name string
			fn   func(t *testing.T)
		}{name, func(t *testing.T) { stepUpgrade(t, old, deb) }})
	}
	steps = append(all, steps[1:]...)
	for _, s := range steps {
		if !t.Run(s.name, s.fn) {
			t.Fatalf("step %s failed: the later steps do not run", s.name)
		}
	}
}

// run runs a command and returns its combined output; a failure fails the
// test with the output.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// try runs a command and returns its output and error.
func try(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

func show(t *testing.T, prop string) string {
	t.Helper()
	return strings.TrimSpace(run(t, "systemctl", "show", "--value", "-p", prop, unit))
}

// waitFor polls cond every 200 ms until it returns nil or the timeout
// passes, then fails with cond's last error.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func setupLab(t *testing.T) {
	// The bpffs: systemd mounts it at boot on a host or VM, but not in a
	// container, and refuses a mount unit for it (an "API file system");
	// the guest mounts its own instance here (run.sh gives it the mount
	// point).
	if out, _ := try("findmnt", "-n", "-o", "FSTYPE", "/sys/fs/bpf"); strings.TrimSpace(lastLine(out)) != "bpf" {
		run(t, "mount", "-t", "bpf", "-o", "mode=0700", "bpf", "/sys/fs/bpf")
	}
	for _, c := range [][]string{
		{"ip", "netns", "add", floodNS},
		{"ip", "link", "add", guestIf, "type", "veth", "peer", "name", floodIf, "netns", floodNS},
		{"ip", "addr", "add", guestIP.String() + "/24", "dev", guestIf},
		{"ip", "-n", floodNS, "addr", "add", floodIP.String() + "/24", "dev", floodIf},
		{"ip", "link", "set", guestIf, "up"},
		{"ip", "-n", floodNS, "link", "set", "lo", "up"},
		{"ip", "-n", floodNS, "link", "set", floodIf, "up"},
	} {
		run(t, c[0], c[1:]...)
	}
	waitFor(t, "veth up", 5*time.Second, func() error {
		out, err := try("ip", "-br", "link", "show", guestIf)
		if err != nil || !strings.Contains(out, "UP") {
			return fmt.Errorf("%s: %v", strings.TrimSpace(out), err)
		}
		return nil
	})
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func stepInstall(t *testing.T, deb string) {
	out := run(t, "dpkg", "-i", deb)
	t.Logf("dpkg -i:\n%s", out)
	// A first install enables and starts nothing.
	if s, _ := try("systemctl", "is-enabled", unit); strings.TrimSpace(s) != "disabled" {
		t.Errorf("after a first install, %s is %q, want disabled", unit, strings.TrimSpace(s))
	}
	if s, _ := try("systemctl", "is-active", unit); strings.TrimSpace(s) != "inactive" {
		t.Errorf("after a first install, %s is %q, want inactive", unit, strings.TrimSpace(s))
	}
	// The default rules file protects nothing and validates.
	run(t, "xlimit", "check", "/etc/xlimit/rules.yaml")
	if out := run(t, "dpkg-query", "-W", "-f", "${Conffiles}", "xlimit"); !strings.Contains(out, "/etc/xlimit/rules.yaml") {
		t.Errorf("/etc/xlimit/rules.yaml is not a conffile: %q", out)
	}
	for _, f := range []string{"/usr/share/xlimit/prometheus/xlimit-alerts.yaml", "/usr/share/xlimit/grafana/xlimit-dashboard.json",
		"/usr/share/man/man8/xlimit.8.gz", "/lib/systemd/system/xlimit.service"} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the package did not install %s: %v", f, err)
		}
	}
	// The version the package says is the one the binary says.
	pv := strings.TrimSpace(run(t, "dpkg-query", "-W", "-f", "${Version}", "xlimit"))
	if bv := strings.TrimSpace(run(t, "xlimit", "version")); bv != "xlimit "+pv {
		t.Errorf("xlimit version says %q, the package is %q", bv, pv)
	}
	// Starting it as installed fails clearly (no interface) and attaches
	// nothing.
	if out, err := try("systemctl", "start", unit); err == nil {
		t.Errorf("systemctl start with the default rules succeeded: %s", out)
	}
	if out := run(t, "journalctl", "-u", unit, "--no-pager", "-o", "cat"); !strings.Contains(out, "no interfaces") {
		t.Errorf("the journal does not say why the default rules do not start:\n%s", out)
	}
	if _, err := os.Stat("/sys/fs/bpf/xlimit/" + guestIf); err == nil {
		t.Errorf("the default rules attached to %s", guestIf)
	}
	run(t, "systemctl", "stop", unit)
	_, _ = try("systemctl", "reset-failed", unit) // fails when the unit is not in the failed state
}

func stepStart(t *testing.T) {
	if err := os.WriteFile("/etc/xlimit/rules.yaml", []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	run(t, "systemctl", "enable", "--now", unit)
	t.Logf("systemctl enable --now returned after %s", time.Since(t0).Round(time.Millisecond))
	// systemctl start returns at READY=1: at that moment the program is
	// attached and pinned and the daemon serves metrics.
	if s := show(t, "ActiveState"); s != "active" {
		t.Fatalf("ActiveState %q right after start, want active", s)
	}
	if out := run(t, "ip", "-d", "link", "show", guestIf); !strings.Contains(out, "xdp") {
		t.Errorf("%s has no XDP program right after systemctl start returned:\n%s", guestIf, out)
	}
	if _, err := os.Stat("/sys/fs/bpf/xlimit/" + guestIf + "/link"); err != nil {
		t.Errorf("no pinned link right after systemctl start returned: %v", err)
	}
	if _, err := scrape(); err != nil {
		t.Errorf("metrics right after systemctl start returned: %v", err)
	}
	// The journal has the daemon's "attached" and "rules from the rules
	// file" lines (the attach, then the first apply) before systemd's
	// "Started" (READY=1; the daemon logs "enforcing" just after sending
	// it). journald may write systemd's line a moment later: poll.
	waitFor(t, "attached and applied before Started in the journal", 5*time.Second, func() error {
		out, _ := try("journalctl", "-u", unit, "--no-pager", "-o", "cat")
		att, app, started := strings.LastIndex(out, "msg=attached iface=xlg0"), strings.LastIndex(out, `msg="rules from the rules file"`), strings.LastIndex(out, "Started xlimit.service")
		if att < 0 || app < 0 || started < 0 || att > app || app > started {
			return fmt.Errorf("want attached < rules applied < Started, at %d, %d, %d:\n%s", att, app, started, tail(out, 15))
		}
		return nil
	})
	t.Logf("status:\n%s", run(t, "xlimit", "status"))
}

// flood sends UDP to the flood port from the flood namespace for d at
// offered pps, and returns the datagrams that reached a socket in the
// guest and the flood's result.
func flood(t *testing.T, d time.Duration, pps float64) (int, lab.FloodResult) {
	t.Helper()
	guest := &lab.NS{Name: "guest", Path: "/proc/1/ns/net"}
	c, err := lab.ListenUDPCounter(guest, netip.AddrPortFrom(guestIP, floodPort))
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer c.Close()
	gmac := mac(t, "", guestIf)
	fmac := mac(t, floodNS, floodIf)
	res, err := lab.Flood(context.Background(), lab.FloodSpec{
		NS: &lab.NS{Name: floodNS, Path: "/run/netns/" + floodNS}, Ifname: floodIf,
		SrcMAC: fmac, DstMAC: gmac, Src: floodIP, Dst: guestIP,
		DstPort: floodPort, PayloadLen: 64, Rate: pps, Duration: d,
	})
	if err != nil {
		t.Fatalf("flood: %v", err)
	}
	n := c.Settle(200*time.Millisecond, 2*time.Second)
	return n, res
}

func mac(t *testing.T, ns, ifname string) []byte {
	t.Helper()
	args := []string{"-j", "link", "show", ifname}
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	var links []struct {
		Address string `json:"address"`
	}
	if err := json.Unmarshal([]byte(run(t, "ip", args...)), &links); err != nil || len(links) != 1 {
		t.Fatalf("ip link show %s: %v", ifname, err)
	}
	hw, err := parseMAC(links[0].Address)
	if err != nil {
		t.Fatal(err)
	}
	return hw
}

func parseMAC(s string) ([]byte, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 6 {
		return nil, fmt.Errorf("parse MAC %q", s)
	}
	b := make([]byte, 6)
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 16, 8)
		if err != nil {
			return nil, fmt.Errorf("parse MAC %q: %w", s, err)
		}
		b[i] = byte(v)
	}
	return b, nil
}

// floodHeld floods at 10 times the limit for 3 s and checks that what
// reached the guest's socket is the limit's worth (rate × time + burst),
// within 15 %. It logs the offered rate it really got.
func floodHeld(t *testing.T, when string) {
	t.Helper()
	const d = 3 * time.Second
	got, res := flood(t, d, 10*rateLimit)
	secs := res.Elapsed.Seconds()
	want := rateLimit*secs + burst
	t.Logf("%s: offered %d packets in %.2fs (%.0f pps, %d send errors); received %d, limit's worth %.0f (ratio %.3f)",
		when, res.Sent, secs, res.PPS(), res.Errors, got, want, float64(got)/want)
	if res.PPS() < 3*rateLimit {
		t.Fatalf("%s: the flood offered only %.0f pps, not enough to test a limit of %d/s", when, res.PPS(), rateLimit)
	}
	if r := float64(got) / want; r < 0.85 || r > 1.15 {
		t.Errorf("%s: received %d, want %.0f ± 15%% (held at %d/s + burst %d)", when, got, want, rateLimit, burst)
	}
}

func stepBadReload(t *testing.T) {
	good, err := os.ReadFile("/etc/xlimit/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pid := show(t, "MainPID")
	failures0 := metricValue(t, `xlimit_config_reloads_total{result="failure"}`)
	if err := os.WriteFile("/etc/xlimit/rules.yaml", []byte(badRules), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := try("systemctl", "reload", unit)
	if err == nil {
		t.Errorf("systemctl reload of a bad file succeeded: %s", out)
	} else {
		t.Logf("systemctl reload (bad file) failed as it should: %v: %s", err, strings.TrimSpace(out))
	}
	// The journal has the file's error, FILE:LINE: field: problem.
	waitFor(t, "the error in the journal", 5*time.Second, func() error {
		j, _ := try("journalctl", "-u", unit, "--no-pager", "-o", "cat")
		if !regexp.MustCompile(`/etc/xlimit/rules.yaml:5: rules\[0\]\.ports\[0\]: reversed range`).MatchString(j) {
			return errors.New("no FILE:LINE: rules[0].ports[0]: reversed range line")
		}
		return nil
	})
	// The daemon also saw the file change (its watch) and refused it.
	waitFor(t, "the failure counted", 5*time.Second, func() error {
		if v := metricValue(t, `xlimit_config_reloads_total{result="failure"}`); v <= failures0 {
			return fmt.Errorf("failures %v, was %v", v, failures0)
		}
		return nil
	})
	if p := show(t, "MainPID"); p != pid || show(t, "ActiveState") != "active" {
		t.Errorf("the daemon did not survive the bad file (pid %s -> %s)", pid, p)
	}
	// The running rules are the good ones, all five.
	st := run(t, "xlimit", "status", "--json")
	for _, r := range []string{"flood", "shadow", "api", "conns", "paced"} {
		if !strings.Contains(st, `"`+r+`"`) {
			t.Errorf("rule %s no longer in force after the bad reload", r)
		}
	}
	floodHeld(t, "after the bad reload")
	// Back to the good file; a reload succeeds.
	if err := os.WriteFile("/etc/xlimit/rules.yaml", good, 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "systemctl", "reload", unit)
}

func stepWatchdog(t *testing.T) {
	pid := show(t, "MainPID")
	restarts, _ := strconv.Atoi(show(t, "NRestarts"))
	t.Logf("hanging the daemon (pid %s) with SIGSTOP; WatchdogSec=%s", pid, show(t, "WatchdogUSec"))
	run(t, "kill", "-STOP", pid)
	t0 := time.Now()
	// While it hangs, the kernel keeps enforcing.
	floodHeld(t, "daemon hung")
	waitFor(t, "systemd restarts the hung daemon", 60*time.Second, func() error {
		n, _ := strconv.Atoi(show(t, "NRestarts"))
		p := show(t, "MainPID")
		if n <= restarts || p == pid || p == "0" || show(t, "ActiveState") != "active" {
			return fmt.Errorf("NRestarts %d, MainPID %s, %s", n, p, show(t, "ActiveState"))
		}
		return nil
	})
	t.Logf("restarted after %s: pid %s -> %s, NRestarts %d -> %s", time.Since(t0).Round(100*time.Millisecond), pid, show(t, "MainPID"), restarts, show(t, "NRestarts"))
	j := run(t, "journalctl", "-u", unit, "--no-pager", "-o", "cat")
	if !strings.Contains(j, "Watchdog timeout") {
		t.Errorf("the journal has no 'Watchdog timeout' from systemd:\n%s", tail(j, 30))
	}
	// The new daemon adopted the pins (no detach, no fresh attach).
	if !strings.Contains(j, "adopt") {
		t.Logf("note: no line mentioning adoption in the journal")
	}
	floodHeld(t, "after the watchdog restart")
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func stepStop(t *testing.T) {
	run(t, "systemctl", "stop", unit)
	if s := show(t, "ActiveState"); s != "inactive" {
		t.Fatalf("ActiveState %q after stop, want inactive", s)
	}
	if out := run(t, "ip", "-d", "link", "show", guestIf); !strings.Contains(out, "xdp") {
		t.Errorf("%s lost its XDP program when the service stopped:\n%s", guestIf, out)
	}
	floodHeld(t, "service stopped")
	t.Logf("status from the pins, no daemon:\n%s", run(t, "xlimit", "status"))
	// Started again, it adopts the pins.
	run(t, "systemctl", "start", unit)
	floodHeld(t, "started again")
}

func stepJournal(t *testing.T) {
	out := run(t, "journalctl", "-u", unit, "--no-pager", "-o", "json", "_COMM=xlimit")
	n, structured := 0, 0
	levels := map[string]int{}
	re := regexp.MustCompile(`^time=\S+ level=(\w+) msg=`)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("journalctl -o json: %v: %s", err, line)
		}
		n++
		msg, _ := e["MESSAGE"].(string)
		if m := re.FindStringSubmatch(msg); m != nil {
			structured++
			levels[m[1]]++
		}
		if e["_SYSTEMD_UNIT"] != unit {
			t.Errorf("entry of unit %v, want %s", e["_SYSTEMD_UNIT"], unit)
		}
	}
	t.Logf("%d journal entries of the daemon, %d with time=, level= and msg= fields; by level %v", n, structured, levels)
	if structured == 0 || levels["INFO"] == 0 {
		t.Errorf("no structured entries (time=... level=... msg=...) in the journal")
	}
	// A field can be searched for: the enforcing line has its interfaces.
	j := run(t, "journalctl", "-u", unit, "--no-pager", "-o", "cat", "--grep", `msg=enforcing .*interfaces=\[xlg0\]`)
	if !strings.Contains(j, "interfaces=[xlg0]") {
		t.Errorf("no enforcing line with interfaces=[xlg0]:\n%s", j)
	}
}

// Prometheus: the test's configuration scrapes the daemon every second
// (job xlimit, as the alerting rules expect) and loads the packaged alerts.
const promConfig = `global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - /usr/share/xlimit/prometheus/xlimit-alerts.yaml
scrape_configs:
  - job_name: xlimit
    static_configs:
      - targets: ['127.0.0.1:9542']
`

func stepPrometheus(t *testing.T) {
	if err := os.WriteFile("/etc/prometheus/prometheus.yml", []byte(promConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "systemctl", "restart", "prometheus.service")
	waitFor(t, "prometheus scrapes xlimit", 60*time.Second, func() error {
		v, err := promQuery(`up{job="xlimit"}`)
		if err != nil {
			return err
		}
		if len(v) != 1 || v[0].Value[1] != "1" {
			return fmt.Errorf("up = %v", v)
		}
		return nil
	})
	// The rules source panels need a daemon that follows Redis.
	redisPhase(t)

	// Traffic for every panel: a flood (drops, shadow), a TCP connection
	// held open (concurrency), UDP through the kernel queue.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			floodPorts(t, []uint16{9000, 9001, 9002}, time.Second)
		}
	}()
	defer func() { close(stop); <-done }()
	conn := holdConn(t, 8081)
	defer conn()
	time.Sleep(5 * time.Second) // several scrapes with traffic

	queries := dashboardQueries(t)
	for _, q := range queries {
		var v []promSample
		var err error
		// waitFor fails the step on a query that returns nothing.
		waitFor(t, "query "+q.title+": "+q.expr, 20*time.Second, func() error {
			v, err = promQuery(q.expr)
			if err != nil {
				return err
			}
			if len(v) == 0 {
				return errors.New("no data")
			}
			return nil
		})
		t.Logf("panel %q: %d series, e.g. %v = %s", q.title, len(v), v[0].Metric, v[0].Value[1])
	}
	t.Logf("%d dashboard queries, all returned data", len(queries))
}

// redisPhase switches the daemon to follow the rules in the guest's Redis
// (a drop-in on ExecStart, as an operator would with systemctl edit), and
// checks the rules source is up through Prometheus. The restart adopts the
// pins.
func redisPhase(t *testing.T) {
	src := "redis://127.0.0.1:6379/0?key=xlimit:rules"
	waitFor(t, "redis answers", 30*time.Second, func() error {
		_, err := try("redis-cli", "ping")
		return err
	})
	run(t, "xlimit", "rules", "push", "--redis", src, "/etc/xlimit/rules.yaml")
	dir := "/etc/systemd/system/xlimit.service.d"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dropin := "[Service]\nExecStart=\nExecStart=/usr/bin/xlimit run --config /etc/xlimit/rules.yaml --rules-source " + src +
		" --fleet redis://127.0.0.1:6379/1 --node-name guest --state-dir /var/lib/xlimit --api-socket /run/xlimit/api.sock\n"
	if err := os.WriteFile(filepath.Join(dir, "rules-source.conf"), []byte(dropin), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "systemctl", "daemon-reload")
	run(t, "systemctl", "restart", unit)
	waitFor(t, "rules source up in prometheus", 30*time.Second, func() error {
		v, err := promQuery(`xlimit_rules_source_up`)
		if err != nil {
			return err
		}
		if len(v) != 1 || v[0].Value[1] != "1" {
			return fmt.Errorf("xlimit_rules_source_up = %v", v)
		}
		return nil
	})
	floodHeld(t, "following Redis")
}

func floodPorts(t *testing.T, ports []uint16, d time.Duration) {
	gmac := mac(t, "", guestIf)
	fmac := mac(t, floodNS, floodIf)
	for _, p := range ports {
		_, _ = lab.Flood(context.Background(), lab.FloodSpec{
			NS: &lab.NS{Name: floodNS, Path: "/run/netns/" + floodNS}, Ifname: floodIf,
			SrcMAC: fmac, DstMAC: gmac, Src: floodIP, Dst: guestIP,
			DstPort: p, PayloadLen: 64, Rate: 3000, Duration: d / time.Duration(len(ports)),
		})
	}
}

// holdConn opens a TCP connection from the flood namespace to a listener
// on port in the guest and keeps it open until the returned func is called.
func holdConn(t *testing.T, port int) func() {
	t.Helper()
	ln, err := lab.ListenTCPEcho(&lab.NS{Name: "guest", Path: "/proc/1/ns/net"}, netip.AddrPortFrom(guestIP, uint16(port)))
	if err != nil {
		t.Fatalf("listen on %d: %v", port, err)
	}
	// bash, not sh: Debian's sh (dash) has no /dev/tcp.
	cmd := exec.Command("ip", "netns", "exec", floodNS, "bash", "-c",
		fmt.Sprintf("exec 3<>/dev/tcp/%s/%d; sleep 600", guestIP, port))
	if err := cmd.Start(); err != nil {
		t.Fatalf("connect: %v", err)
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = ln.Close()
	}
}

type panelQuery struct{ title, expr string }

// dashboardQueries reads every target of the packaged dashboard, with
// Grafana's variables replaced as "All" selects them.
func dashboardQueries(t *testing.T) []panelQuery {
	data, err := os.ReadFile("/usr/share/xlimit/grafana/xlimit-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string            `json:"title"`
		Panels  []json.RawMessage `json:"panels"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	repl := strings.NewReplacer(`"$instance"`, `".*"`, `"$iface"`, `".*"`, `"$rule"`, `".*"`, "$__rate_interval", "1m")
	var qs []panelQuery
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatal(err)
			}
			walk(p.Panels)
			for _, tg := range p.Targets {
				if tg.Expr != "" {
					qs = append(qs, panelQuery{p.Title, repl.Replace(tg.Expr)})
				}
			}
		}
	}
	walk(d.Panels)
	if len(qs) == 0 {
		t.Fatal("no queries in the dashboard")
	}
	return qs
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func promQuery(q string) ([]promSample, error) {
	resp, err := http.Get(promURL + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string       `json:"resultType"`
			Result     []promSample `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("query %s: %v: %s", q, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", q, r.Error)
	}
	for i := range r.Data.Result {
		if s, ok := r.Data.Result[i].Value[1].(string); ok {
			r.Data.Result[i].Value[1] = s
		}
	}
	return r.Data.Result, nil
}

func scrape() (string, error) {
	resp, err := http.Get(metrics)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("GET %s: %s", metrics, resp.Status)
	}
	return string(b), err
}

// metricValue reads one series from the daemon's metrics (0 when absent).
func metricValue(t *testing.T, series string) float64 {
	t.Helper()
	body, err := scrape()
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("parse %q: %v", line, err)
			}
			return f
		}
	}
	return 0
}

func stepDownAlert(t *testing.T) {
	run(t, "systemctl", "stop", unit)
	t0 := time.Now()
	var states []string
	last := ""
	waitFor(t, "XlimitDaemonDown fires", 150*time.Second, func() error {
		resp, err := http.Get(promURL + "/api/v1/alerts")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var r struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return err
		}
		for _, a := range r.Data.Alerts {
			if a.Labels["alertname"] == "XlimitDaemonDown" {
				if a.State != last {
					last = a.State
					states = append(states, fmt.Sprintf("%s at %s", a.State, time.Since(t0).Round(time.Second)))
				}
				if a.State == "firing" {
					return nil
				}
			}
		}
		return fmt.Errorf("not firing yet (%d alerts)", len(r.Data.Alerts))
	})
	t.Logf("XlimitDaemonDown after the stop: %s (for: 1m)", strings.Join(states, ", "))
	floodHeld(t, "daemon down, alert firing")
	var buf bytes.Buffer
	buf.WriteString(run(t, "xlimit", "status"))
	t.Logf("pins still enforcing:\n%s", buf.String())
}
