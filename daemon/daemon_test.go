//go:build linux

package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/daemon"
	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/loader/pinstatus"
	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// syncBuffer is a log sink safe for the daemon's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// near: the kernel keeps rates in fixed point.
func near(got, want float64) bool { return math.Abs(got-want) <= want*1e-9 }

func rules(rate string) string {
	return "rules:\n  - name: udp\n    protocol: udp\n    ports: [9000]\n    rate: " + rate + "\n"
}

// inProcess is a daemon running in this process on a veth of a lab
// namespace (startInProcess).
type inProcess struct {
	l        *lab.Lab
	o        daemon.Options
	bpffs    string
	stateDir string
	logs     *syncBuffer
	notified chan string
	stop     func() error
}

// startInProcess starts the daemon in this process with file's rules, on
// the server's veth of a new lab, and waits for READY. edit, when not nil,
// changes the options first. Everything is removed at the test's end.
func startInProcess(t *testing.T, file string, edit func(*daemon.Options)) *inProcess {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("daemon: skipping the in-process daemon test: it needs root (namespaces, XDP, bpffs); CI runs it as root")
	}
	l, err := lab.New(lab.Options{Prefix: "xldm"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	dir := t.TempDir()
	bpffs := filepath.Join(dir, "bpffs")
	if err := loader.EnsureBPFFS(bpffs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := loader.Detach(bpffs, l.ServerIf); err != nil {
			t.Errorf("detach: %v", err)
		}
		if err := unix.Unmount(bpffs, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs: %v", err)
		}
	})
	stateDir := filepath.Join(dir, "state")
	logs := &syncBuffer{}
	notified := make(chan string, 64)
	o := daemon.Options{
		Config: file, Interfaces: []string{l.ServerIf}, Mode: loader.ModeGeneric,
		APISocket: filepath.Join(dir, "api.sock"), BPFFS: bpffs, StateDir: stateDir,
		Period: 50 * time.Millisecond, FailStatic: time.Second,
		Logger:      slog.New(slog.NewTextHandler(logs, nil)),
		Notify:      func(state string) { notified <- state },
		HostSignals: func() (daemon.HostSignals, error) { return nil, errors.New("no host signals in this test") },
	}
	if edit != nil {
		edit(&o)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		// The daemon's own goroutine stays on a thread of the server's
		// namespace: it attaches there and reads the service's signals
		// there, as `ip netns exec` would have it.
		done <- l.Server.Do(func() error { return daemon.Run(ctx, o) })
	}()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			return errors.New("the daemon did not stop within 10s")
		}
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	select {
	case s := <-notified:
		if s != "READY=1" {
			t.Fatalf("first notification %q, want READY=1", s)
		}
	case err := <-done:
		t.Fatalf("the daemon stopped before READY: %v\n%s", err, logs.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("no READY within 20s\n%s", logs.String())
	}
	return &inProcess{l: l, o: o, bpffs: bpffs, stateDir: stateDir, logs: logs, notified: notified, stop: stop}
}

// rate is the kernel's rate of the only rule.
func (d *inProcess) rate(t *testing.T) float64 {
	t.Helper()
	st, err := pinstatus.Read(d.bpffs, d.l.ServerIf)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	if len(st.Rules) != 1 {
		t.Fatalf("status has %d rules, want 1: %+v", len(st.Rules), st.Rules)
	}
	return st.Rules[0].Rate
}

// waitRate waits up to 10 s for the only rule's rate to be want.
func (d *inProcess) waitRate(t *testing.T, what string, want float64) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if near(d.rate(t), want) {
			return
		}
	}
	t.Fatalf("%s: rate %v, want %v\n%s", what, d.rate(t), want, d.logs.String())
}

// TestRunInProcess runs the daemon in this process, on a veth of a lab
// namespace, with its dependencies injected (systemd's notify socket and
// the host's signals), and sends it rules documents of every runtime
// origin: the startup file, the API, the file watch, a bad file. Each takes
// the one rules path: the kernel's rate changes for a good document, the
// persisted state follows its origin, and a bad document changes nothing.
func TestRunInProcess(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(rules("1000")), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startInProcess(t, file, nil)
	o, stateDir, logs, notified, stop, bpffs, l := d.o, d.stateDir, d.logs, d.notified, d.stop, d.bpffs, d.l
	rate := func() float64 { t.Helper(); return d.rate(t) }
	waitRate := func(what string, want float64) { t.Helper(); d.waitRate(t, what, want) }
	readState := func(name string) string {
		data, err := os.ReadFile(filepath.Join(stateDir, name))
		if errors.Is(err, os.ErrNotExist) {
			return ""
		} else if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}

	waitRate("startup file", 1000)
	if got := readState("last-good.yaml"); got != rules("1000") {
		t.Errorf("after start, last good rules %q, want the file's", got)
	}

	c := api.NewClient(o.APISocket)
	defer c.Close()
	actx, acancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer acancel()
	if _, err := c.PutRules(actx, []byte(rules("3000")), ""); err != nil {
		t.Fatalf("PUT rules: %v", err)
	}
	waitRate("API", 3000)
	if got := readState(api.StateFile); got != rules("3000") {
		t.Errorf("API rules kept as %q", got)
	}
	if got := readState("last-good.yaml"); got != rules("3000") {
		t.Errorf("after the API, last good rules %q", got)
	}
	doc, err := c.Rules(actx)
	if err != nil || doc.Source != "api" {
		t.Errorf("GET rules: source %q, %v; want api", doc.Source, err)
	}

	// The file watch: the file takes over again and the API's rules go.
	if err := os.WriteFile(file, []byte(rules("2000")), 0o600); err != nil {
		t.Fatal(err)
	}
	waitRate("file watch", 2000)
	for end := time.Now().Add(5 * time.Second); readState(api.StateFile) != "" && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
	}
	if got := readState(api.StateFile); got != "" {
		t.Errorf("the API's rules stayed after the file took over: %q", got)
	}

	// A bad file changes nothing and says where it is wrong.
	if err := os.WriteFile(file, []byte(strings.Replace(rules("2000"), "ports: [9000]", "ports: [0]", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), "reload failed") && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
	}
	if !strings.Contains(logs.String(), "reload failed") || !strings.Contains(logs.String(), "rules.yaml:4") {
		t.Fatalf("no rejection of the bad file in the log:\n%s", logs.String())
	}
	if got := rate(); !near(got, 2000) {
		t.Errorf("a bad file changed the rate to %v", got)
	}
	if got := readState("last-good.yaml"); got != rules("2000") {
		t.Errorf("a bad file became the last good rules: %q", got)
	}

	if err := stop(); err != nil {
		t.Fatalf("stop: %v\n%s", err, logs.String())
	}
	if s := <-notified; s != "STOPPING=1" {
		t.Errorf("last notification %q, want STOPPING=1", s)
	}
	// Protection outlives the daemon.
	ls, err := loader.Inspect(bpffs, l.ServerIf)
	if err != nil || !ls.Attached {
		t.Errorf("after stop: %+v, %v; want still attached", ls, err)
	}
	if got := rate(); !near(got, 2000) {
		t.Errorf("after stop the rate is %v, want 2000", got)
	}
}

// TestPrepareOffLoop: a document that takes long to prepare (held here by
// a hook where it is prepared) does not stop the control loop: its ticks
// go on and so do the watchdog's pings, and the document is applied when
// its preparation ends.
func TestPrepareOffLoop(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "100000") // a ping at most every 50 ms, one per tick
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(rules("1000")), 0o600); err != nil {
		t.Fatal(err)
	}
	held, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	d := startInProcess(t, file, func(o *daemon.Options) {
		daemon.SetBeforePrepare(o, func() {
			held <- struct{}{}
			<-release
		})
	})
	defer once.Do(func() { close(release) })
	c := api.NewClient(d.o.APISocket)
	defer c.Close()
	put := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.PutRules(ctx, []byte(rules("3000")), "")
		put <- err
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatalf("the document never reached its preparation\n%s", d.logs.String())
	}
	// Drain what came before, then count the pings while it is held.
	for len(d.notified) > 0 {
		<-d.notified
	}
	pings := 0
	for deadline := time.After(5 * time.Second); pings < 5; {
		select {
		case s := <-d.notified:
			if s == "WATCHDOG=1" {
				pings++
			}
		case <-deadline:
			t.Fatalf("%d watchdog pings in 5 s while a document was being prepared: the loop is stuck\n%s", pings, d.logs.String())
		}
	}
	once.Do(func() { close(release) })
	if err := <-put; err != nil {
		t.Fatalf("PUT rules: %v", err)
	}
	d.waitRate(t, "the API's document after its long preparation", 3000)
	// Keep the loop's pings from filling the channel until the stop.
	go func() {
		for range d.notified {
		}
	}()
}

// TestGuardOverAPI: the rules file's allow list and management section
// stay in force when a document from the API would take them away (one
// that denies every source and limits every TCP port).
func TestGuardOverAPI(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	local := "allow: [192.0.2.0/24]\nmanagement:\n  tcp_ports: [22]\n" + rules("1000")
	if err := os.WriteFile(file, []byte(local), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startInProcess(t, file, nil)
	c := api.NewClient(d.o.APISocket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hostile := "deny: [0.0.0.0/0]\nrules:\n  - name: udp\n    protocol: tcp\n    rate: 1\n"
	if _, err := c.PutRules(ctx, []byte(hostile), ""); err != nil {
		t.Fatalf("PUT rules: %v", err)
	}
	d.waitRate(t, "the API's rules", 1)
	tb, err := maps.OpenPinned(loader.PinDir(d.bpffs, d.l.ServerIf), true)
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	plan, err := tb.ReadPlan()
	if err != nil {
		t.Fatal(err)
	}
	e := plan.Lookup(netip.MustParseAddr("192.0.2.9"))
	if e == nil || e.Flags&dataplane.PrefixAllow == 0 {
		t.Errorf("192.0.2.9 after the API's document: entry %+v, want the rules file's allow", e)
	}
	if m := plan.Ports[dataplane.PortKey(dataplane.ProtoTCP, 22)]; m != 0 {
		t.Errorf("tcp/22 after the API's document: rules %b, want none (management port)", m)
	}
	if m := plan.Ports[dataplane.PortKey(dataplane.ProtoTCP, 80)]; m == 0 {
		t.Errorf("tcp/80 after the API's document: no rule, want the API's rule")
	}
}

// TestSIGHUPAtReady: a SIGHUP as soon as the daemon says READY=1 (what
// systemd's ExecReload may send then) reloads the rules; it does not end
// the process, which is SIGHUP's default action while nothing catches it.
// Were the signal caught only once the loop runs, this test binary would
// die of it.
func TestSIGHUPAtReady(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(rules("1000")), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startInProcess(t, file, func(o *daemon.Options) {
		notify := o.Notify
		o.Notify = func(state string) {
			if state == "READY=1" {
				if err := unix.Kill(os.Getpid(), unix.SIGHUP); err != nil {
					t.Errorf("send SIGHUP: %v", err)
				}
			}
			notify(state)
		}
	})
	for end := time.Now().Add(10 * time.Second); !strings.Contains(d.logs.String(), "origin=sighup"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no reload on the SIGHUP sent at READY within 10 s:\n%s", d.logs.String())
		}
	}
	d.waitRate(t, "after the SIGHUP", 1000)
}
