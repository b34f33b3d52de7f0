//go:build linux

package daemon_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xlimit/xlimit/daemon"
	"github.com/xlimit/xlimit/userspace/api"
)

// confirmMetricsAddr is where the confirm tests' daemons serve metrics,
// in their lab's own server namespace.
const confirmMetricsAddr = "127.0.0.1:19101"

// heldPrepare is a hook where documents are prepared that holds them
// while hold is set, until release.
type heldPrepare struct {
	hold    atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func newHeldPrepare() *heldPrepare {
	return &heldPrepare{held: make(chan struct{}, 16), release: make(chan struct{})}
}

func (h *heldPrepare) hook() {
	if h.hold.Load() {
		h.held <- struct{}{}
		<-h.release
	}
}

// waitHeld waits for a document to be held in its preparation.
func (h *heldPrepare) waitHeld(t *testing.T, d *inProcess) {
	t.Helper()
	select {
	case <-h.held:
	case <-time.After(10 * time.Second):
		t.Fatalf("no document reached its preparation\n%s", d.logs.String())
	}
}

// confirmDaemon starts an in-process daemon on rules("1000") with the
// hook, metrics on confirmMetricsAddr, and an API client.
func confirmDaemon(t *testing.T, h *heldPrepare, edit func(*daemon.Options)) (*inProcess, *api.Client, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(rules("1000")), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startInProcess(t, file, func(o *daemon.Options) {
		o.MetricsAddr = confirmMetricsAddr
		if h != nil {
			daemon.SetBeforePrepare(o, h.hook)
		}
		if edit != nil {
			edit(o)
		}
	})
	t.Cleanup(func() {
		if h != nil && h.hold.Swap(false) {
			close(h.release)
		}
	})
	c := api.NewClient(d.o.APISocket)
	t.Cleanup(c.Close)
	return d, c, file
}

// putConfirm applies text for within through the API and returns its
// deadline.
func putConfirm(t *testing.T, c *api.Client, text string, within time.Duration) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.PutRulesConfirm(ctx, []byte(text), within)
	if err != nil {
		t.Fatalf("PUT ?confirm=%v: %v", within, err)
	}
	return res.RevertAt
}

// reverts reads xlimit_rules_reverts_total from the daemon's metrics, by
// result ("" for a sample without one).
func (d *inProcess) reverts(t *testing.T) map[string]float64 {
	t.Helper()
	var body string
	err := d.l.Server.Do(func() error {
		conn, err := net.DialTimeout("tcp", confirmMetricsAddr, 2*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, "GET /metrics HTTP/1.0\r\nHost: xlimit\r\n\r\n"); err != nil {
			return err
		}
		b, err := io.ReadAll(conn)
		body = string(b)
		return err
	})
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	out := map[string]float64{}
	s := bufio.NewScanner(strings.NewReader(body))
	for s.Scan() {
		line := s.Text()
		if !strings.HasPrefix(line, "xlimit_rules_reverts_total") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		res := ""
		if _, l, ok := strings.Cut(name, `result="`); ok {
			res, _, _ = strings.Cut(l, `"`)
		}
		out[res] += v
	}
	return out
}

func readState(t *testing.T, d *inProcess, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(d.stateDir, name))
	if os.IsNotExist(err) {
		return ""
	} else if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestRevertOrderedWithDocumentsInFlight: the revert for want of a
// confirmation happens when its deadline comes, whatever document is
// being prepared meanwhile; those are applied after it, as any later
// document: what runs in the end is what a restart loads, and a confirm
// keeps what runs.
func TestRevertOrderedWithDocumentsInFlight(t *testing.T) {
	t.Run("a file change in preparation", func(t *testing.T) {
		h := newHeldPrepare()
		d, c, file := confirmDaemon(t, h, nil)
		deadline := putConfirm(t, c, rules("3000"), 5*time.Second)
		d.waitRate(t, "the change waiting for its confirmation", 3000)
		h.hold.Store(true)
		if err := os.WriteFile(file, []byte(rules("2000")), 0o600); err != nil {
			t.Fatal(err)
		}
		h.waitHeld(t, d)
		time.Sleep(time.Until(deadline.Add(1500 * time.Millisecond)))
		if got := d.rate(t); !near(got, 1000) {
			t.Errorf("1.5 s past the deadline, with a document in preparation: rate %v, want the previous 1000", got)
		}
		h.hold.Store(false)
		close(h.release)
		d.waitRate(t, "the file's change after the revert", 2000)
		time.Sleep(time.Second)
		if got := d.rate(t); !near(got, 2000) {
			t.Errorf("a second later the rate is %v: something applied behind the file's change; want 2000\n%s", got, d.logs.String())
		}
		if got := readState(t, d, "last-good.yaml"); got != rules("2000") {
			t.Errorf("a restart would load %q, not the rules in force", got)
		}
	})

	t.Run("a second apply --confirm in preparation", func(t *testing.T) {
		h := newHeldPrepare()
		d, c, _ := confirmDaemon(t, h, nil)
		deadline := putConfirm(t, c, rules("3000"), 5*time.Second)
		d.waitRate(t, "the first change", 3000)
		h.hold.Store(true)
		second := make(chan time.Time, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := c.PutRulesConfirm(ctx, []byte(rules("4000")), 5*time.Second)
			if err != nil {
				t.Errorf("second PUT ?confirm: %v", err)
			}
			second <- res.RevertAt
		}()
		h.waitHeld(t, d)
		time.Sleep(time.Until(deadline.Add(time.Second)))
		h.hold.Store(false)
		close(h.release)
		<-second
		d.waitRate(t, "the second change", 4000)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Confirm(ctx); err != nil {
			t.Fatalf("confirm: %v", err)
		}
		time.Sleep(time.Second)
		if got, kept := d.rate(t), readState(t, d, api.StateFile); !near(got, 4000) || kept != rules("4000") {
			t.Errorf("after the confirmation: rate %v and kept for a restart %q; want the confirmed 4000 in force and kept\n%s", got, kept, d.logs.String())
		}
	})

	t.Run("a second apply --confirm returns to the rules of before the first", func(t *testing.T) {
		d, c, _ := confirmDaemon(t, nil, nil)
		putConfirm(t, c, rules("3000"), 5*time.Second)
		d.waitRate(t, "the first change", 3000)
		deadline := putConfirm(t, c, rules("4000"), 5*time.Second)
		d.waitRate(t, "the second change", 4000)
		time.Sleep(time.Until(deadline.Add(time.Second)))
		if got := d.rate(t); !near(got, 1000) {
			t.Errorf("past the second deadline: rate %v, want the rules of before the first change, 1000", got)
		}
	})

	t.Run("the counter counts what happened", func(t *testing.T) {
		h := newHeldPrepare()
		d, c, _ := confirmDaemon(t, h, nil)
		deadline := putConfirm(t, c, rules("3000"), 5*time.Second)
		d.waitRate(t, "the change waiting for its confirmation", 3000)
		// Whatever goes through the preparer from now on is held.
		h.hold.Store(true)
		time.Sleep(time.Until(deadline.Add(1500 * time.Millisecond)))
		n, rate := d.reverts(t), d.rate(t)
		counted := n[""] + n["success"]
		if counted > 0 && !near(rate, 1000) {
			t.Errorf("%v reverts counted while the rate is still the unconfirmed %v", counted, rate)
		}
		if counted != 1 || n["failure"] != 0 || !near(rate, 1000) {
			t.Errorf("1.5 s past the deadline: reverts %v, rate %v; want one success and the previous 1000", n, rate)
		}
	})
}

// TestFailedRevertRetried: a revert whose attempts fail is tried again
// until one succeeds; each attempt is counted by its result. The kernel
// has the previous rules back from the deadline meanwhile.
func TestFailedRevertRetried(t *testing.T) {
	var fails atomic.Int32
	fails.Store(2)
	d, c, _ := confirmDaemon(t, nil, func(o *daemon.Options) {
		daemon.SetRevertFault(o, func() error {
			if fails.Add(-1) >= 0 {
				return fmt.Errorf("injected revert failure")
			}
			return nil
		})
	})
	deadline := putConfirm(t, c, rules("3000"), 5*time.Second)
	d.waitRate(t, "the change waiting for its confirmation", 3000)
	time.Sleep(time.Until(deadline.Add(500 * time.Millisecond)))
	if got := d.rate(t); !near(got, 1000) {
		t.Errorf("with the daemon's revert failing, 0.5 s past the deadline: rate %v, want the kernel's previous 1000", got)
	}
	time.Sleep(3 * time.Second)
	n := d.reverts(t)
	if n["failure"] != 2 || n["success"] != 1 {
		t.Errorf("after two failed attempts: reverts %v, want 2 failures then 1 success\n%s", n, d.logs.String())
	}
	if got := d.rate(t); !near(got, 1000) {
		t.Errorf("after the retries: rate %v, want 1000", got)
	}
	if !strings.Contains(d.logs.String(), "REVERT FAILED") || !strings.Contains(d.logs.String(), "reverted to the previous rules") {
		t.Errorf("the log does not tell the failed attempts and the success:\n%s", d.logs.String())
	}
}
