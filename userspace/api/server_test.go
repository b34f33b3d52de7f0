//go:build linux

package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// socketPath returns a socket path in a directory that does not exist yet.
func socketPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "run", "api.sock")
}

func start(t *testing.T, path string, d Daemon) *Server {
	t.Helper()
	s, err := Start(path, d, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

func TestServeOnSocket(t *testing.T) {
	path := socketPath(t)
	f := newFake()
	s := start(t, path, f)

	for p, want := range map[string]os.FileMode{filepath.Dir(path): os.ModeDir | 0o700, path: os.ModeSocket | 0o600} {
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", p, fi.Mode(), err, want)
		}
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 2 { // api.sock, api.sock.lock
		t.Errorf("directory holds %v", ents)
	}

	c := NewClient(path)
	defer c.Close()
	ctx := context.Background()
	rep, err := c.Status(ctx)
	if err != nil || len(rep.Interfaces) != 2 || rep.Interfaces[0].Rules[0].Counters.Packets["drop"] != 2 {
		t.Fatalf("status over the socket: %+v %v", rep, err)
	}
	doc, err := c.Rules(ctx)
	if err != nil || doc.Text != goodRules {
		t.Fatalf("rules: %+v %v", doc, err)
	}
	res, err := c.PutRules(ctx, []byte(goodRules+"# v2\n"), doc.SHA256)
	if err != nil || !res.Applied {
		t.Fatalf("put rules: %+v %v", res, err)
	}
	_, err = c.PutRules(ctx, []byte(goodRules), doc.SHA256)
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 412 {
		t.Errorf("put with a stale If-Match: %v", err)
	}
	_, err = c.PutRules(ctx, []byte(badRules), "")
	if !errors.As(err, &se) || se.Code != 400 || len(se.Errors) != 2 || !strings.Contains(err.Error(), "api:4: rules[0].ports[0]") {
		t.Errorf("put bad rules: %v", err)
	}
	if err := c.Feedback(ctx, Feedback{Rule: "web", QueueingDelayMS: 3, Requests: 10}); err != nil {
		t.Errorf("feedback: %v", err)
	}
	if err := c.Feedback(ctx, Feedback{Rule: "nope"}); !errors.As(err, &se) || se.Code != 404 {
		t.Errorf("feedback for an unknown rule: %v", err)
	}

	// A second daemon on the same socket is refused, and the first keeps
	// serving.
	if _, err := Start(path, f, nil); !errors.Is(err, ErrInUse) {
		t.Errorf("second Start: %v, want ErrInUse", err)
	}
	if _, err := c.Status(ctx); err != nil {
		t.Errorf("first server after the refused second: %v", err)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("socket left after Close: %v", err)
	}
	if _, err := NewClient(path).Status(ctx); !errors.Is(err, ErrUnavailable) {
		t.Errorf("status without a daemon: %v, want ErrUnavailable", err)
	}
	// The lock is released: a new daemon starts.
	start(t, path, f)
}

func TestStaleSocketReplaced(t *testing.T) {
	path := socketPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	// A daemon that died leaves its socket file behind.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("stale socket not left: %v", err)
	}
	var logs bytes.Buffer
	s, err := Start(path, newFake(), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatalf("start over a stale socket: %v", err)
	}
	defer s.Close()
	if !strings.Contains(logs.String(), "replacing a stale API socket") {
		t.Errorf("no log about the stale socket: %s", logs.String())
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode() != os.ModeSocket|0o600 {
		t.Errorf("socket mode %v %v", fi.Mode(), err)
	}
	if _, err := NewClient(path).Status(context.Background()); err != nil {
		t.Errorf("status: %v", err)
	}
}

func TestRefusesLiveForeignListener(t *testing.T) {
	path := socketPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	// Something (an older daemon without the lock) answers on the socket.
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := Start(path, newFake(), nil); !errors.Is(err, ErrInUse) {
		t.Fatalf("Start over a live socket: %v, want ErrInUse", err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("the live socket was removed: %v", err)
	}
}

func TestRefusesToReplaceNonSocket(t *testing.T) {
	path := socketPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(path, newFake(), nil); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Start over a regular file: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
		t.Errorf("the file was touched: %q %v", b, err)
	}
	// The failed Start released its lock.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	start(t, path, newFake())
}

func TestCloseLeavesAReplacedSocket(t *testing.T) {
	path := socketPath(t)
	s, err := Start(path, newFake(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Someone removed our socket and another one now lives at the path.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	other, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Errorf("Close removed a socket that was not its own: %v", err)
	}
}

func TestCloseWaitsForRequestsAndRefusesNewOnes(t *testing.T) {
	path := socketPath(t)
	s, err := Start(path, newFake(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// A slow client that sends half a request must not hold Close up
	// beyond the shutdown timeout.
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET /v1/status HTTP/1.1\r\nHost: x\r\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	t0 := time.Now()
	_ = s.Close()
	if d := time.Since(t0); d > shutdownTimeout+time.Second {
		t.Errorf("Close took %v", d)
	}
	if _, err := net.Dial("unix", path); err == nil {
		t.Error("socket still accepts after Close")
	}
}

func TestSocketPathTooLong(t *testing.T) {
	path := filepath.Join(t.TempDir(), strings.Repeat("x", 120), "api.sock")
	if _, err := Start(path, newFake(), nil); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("long path: %v", err)
	}
}

// TestPeerCredentials: even with the socket opened up to everyone, a peer
// that is neither root nor the daemon's user gets no answer.
func TestPeerCredentials(t *testing.T) {
	if os.Getenv("XLIMIT_API_PEER_SOCKET") != "" {
		return // the child's side runs in peerHelper
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: connects as another user (CI runs it as root)")
	}
	// t.TempDir's parent is private; this directory must be reachable by
	// the other user.
	dir, err := os.MkdirTemp("", "xlimit-api-peer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "api.sock")
	start(t, path, newFake())
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "api.test")
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestPeerHelper$", "-test.v")
	cmd.Env = append(os.Environ(), "XLIMIT_API_PEER_SOCKET="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as uid 65534: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "PEER: refused") {
		t.Errorf("a foreign peer was answered:\n%s", out)
	}
}

// TestPeerHelper is the child of TestPeerCredentials.
func TestPeerHelper(t *testing.T) {
	path := os.Getenv("XLIMIT_API_PEER_SOCKET")
	if path == "" {
		t.Skip("helper of TestPeerCredentials")
	}
	_, err := NewClient(path).Status(context.Background())
	switch {
	case err == nil:
		fmt.Println("PEER: answered")
	case errors.Is(err, ErrUnavailable):
		fmt.Println("PEER: cannot connect:", err)
	default:
		fmt.Println("PEER: refused:", err)
	}
}
