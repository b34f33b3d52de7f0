//go:build linux

package tests

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// notifySocket is a test stand-in for systemd's notification socket.
type notifySocket struct {
	conn    *net.UnixConn
	mu      sync.Mutex
	msgs    []notifyMsg
	readErr error // why the reader stopped, other than the socket being closed
}

type notifyMsg struct {
	at   time.Time
	text string
}

func newNotifySocket(t *testing.T) (*notifySocket, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifySocket{conn: conn}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					n.mu.Lock()
					n.readErr = err
					n.mu.Unlock()
				}
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, notifyMsg{time.Now(), string(buf[:k])})
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return n, path
}

func (n *notifySocket) times(text string) []time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	var ts []time.Time
	for _, m := range n.msgs {
		if strings.Contains(m.text, text) {
			ts = append(ts, m.at)
		}
	}
	return ts
}

// waitFor waits until a message containing text has arrived and returns
// every arrival of it. The daemon sends before it logs, but this reader is
// a goroutine of its own: a message in the socket's queue may not have been
// read yet when the test looks (the race behind a once-seen failure).
func (n *notifySocket) waitFor(t *testing.T, text string, timeout time.Duration) []time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if ts := n.times(text); len(ts) > 0 {
			return ts
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q on the notify socket within %v; received: %s", text, timeout, n.summary())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// summary lists what arrived, for failure messages.
func (n *notifySocket) summary() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.msgs) == 0 && n.readErr == nil {
		return "nothing"
	}
	var b strings.Builder
	for _, m := range n.msgs {
		fmt.Fprintf(&b, "%q at %s; ", m.text, m.at.Format("15:04:05.000"))
	}
	if n.readErr != nil {
		fmt.Fprintf(&b, "reader stopped: %v", n.readErr)
	}
	return b.String()
}

// TestSystemdNotify: READY=1 comes after the program is attached and the
// rules applied; WATCHDOG=1 comes from the control loop at half the
// interval systemd asks for, and stops when the loop hangs while the
// process lives on.
func TestSystemdNotify(t *testing.T) {
	e := newEnv(t)
	n, sock := newNotifySocket(t)
	const watchdog = 400 * time.Millisecond
	os.Setenv("NOTIFY_SOCKET", sock)
	os.Setenv("WATCHDOG_USEC", "400000")
	t.Cleanup(func() {
		os.Unsetenv("NOTIFY_SOCKET")
		os.Unsetenv("WATCHDOG_USEC")
	})
	const stallAfter = 3 * time.Second
	d := e.startDaemon(e.writeRules("rules.yaml", limitRules()), "--test-stall-loop-after", stallAfter.String())
	started := time.Now()

	n.waitFor(t, "READY=1", 5*time.Second)
	if st := e.status(); !st.Interfaces[0].Attached || len(st.Interfaces[0].Rules) != 1 {
		t.Fatalf("READY=1 but not attached with the rules: %+v", st)
	}
	d.waitLog("the control loop hangs now", 10*time.Second)
	time.Sleep(4 * watchdog)
	select {
	case <-d.exited:
		t.Fatalf("the daemon exited while its loop hung: %v", d.exitErr)
	default:
	}
	if ready := n.times("READY=1"); len(ready) != 1 {
		t.Errorf("READY=1 sent %d times, want once; received: %s", len(ready), n.summary())
	}

	pings := n.times("WATCHDOG=1")
	var before, after int
	for _, p := range pings {
		if p.Before(started.Add(stallAfter - 100*time.Millisecond)) {
			before++
		} else if p.After(started.Add(stallAfter + watchdog)) {
			after++
		}
	}
	// Half the interval: about 2.5 pings a second over the healthy spell.
	want := int(stallAfter / (watchdog / 2))
	t.Logf("e2e systemd: READY=1 once, %d WATCHDOG=1 pings while healthy (about %d expected), %d after the loop hung", before, want, after)
	if before < want*2/3 || before > want+2 {
		t.Errorf("%d pings in %v with WATCHDOG_USEC=%v, want about %d; received: %s", before, stallAfter, watchdog, want, n.summary())
	}
	if after != 0 {
		t.Errorf("%d pings after the control loop hung; received: %s", after, n.summary())
	}
}
