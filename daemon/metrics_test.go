//go:build linux

package daemon

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/metrics"
)

// TestMetricsTimeouts: the metrics server closes a keep-alive connection
// left idle and one whose request never completes, instead of holding
// them (and their goroutines) for ever.
func TestMetricsTimeouts(t *testing.T) {
	saved := metricsTimeouts
	t.Cleanup(func() { metricsTimeouts = saved })
	metricsTimeouts.header, metricsTimeouts.read, metricsTimeouts.write, metricsTimeouts.idle =
		300*time.Millisecond, 300*time.Millisecond, time.Second, 300*time.Millisecond
	m, err := startMetrics("127.0.0.1:0", func() []metrics.Target { return nil }, maps.MonotonicNS,
		func() map[string]bool { return nil }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer m.close()
	addr := m.addr

	closedWithin := func(c net.Conn, limit time.Duration) bool {
		_ = c.SetReadDeadline(time.Now().Add(limit))
		_, err := io.Copy(io.Discard, c)
		return err == nil // EOF: the server closed it; a timeout is an error
	}

	// Idle after one scrape.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !closedWithin(c, 3*time.Second) {
		t.Error("an idle keep-alive connection is still open 3 s after its scrape (idle timeout 300ms)")
	}

	// A request that never ends (slowloris).
	s, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := io.WriteString(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n"); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(s, 3*time.Second) {
		t.Error("a request whose headers never end is still open after 3 s (header timeout 300ms)")
	}
}
