//go:build linux

package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/xlimit/xlimit/userspace/control"
	"github.com/xlimit/xlimit/userspace/metrics"
)

// metricsTimeouts bound what a client of the metrics port can hold: a
// request's headers and whole read, the answer's write (a scrape is well
// under a second; a slow reader must not keep a goroutine and its
// buffers), and an idle keep-alive connection (Prometheus scrapes every
// 15 s or so; a connection left idle longer is closed).
var metricsTimeouts = struct{ header, read, write, idle time.Duration }{
	header: 5 * time.Second, read: 10 * time.Second, write: 30 * time.Second, idle: 2 * time.Minute,
}

// metricsServer serves Prometheus metrics on its own registry.
type metricsServer struct {
	collector *metrics.Collector
	safety    *metrics.Safety
	srv       *http.Server
	addr      string // where it listens
}

// startMetrics serves the metrics on addr: the kernel's of targets (read
// at each scrape, with monotonic the clock of the kernel's deadlines) and
// whether each configured interface is protected (attached).
func startMetrics(addr string, targets func() []metrics.Target, monotonic func() uint64, attached func() map[string]bool,
	log *slog.Logger) (*metricsServer, error) {
	c := metrics.NewCollector(targets, monotonic)
	reg := prometheus.NewRegistry()
	safety := metrics.NewSafety(attached)
	reg.MustRegister(c, safety, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	m := &metricsServer{collector: c, safety: safety, srv: &http.Server{Handler: mux,
		ReadHeaderTimeout: metricsTimeouts.header, ReadTimeout: metricsTimeouts.read,
		WriteTimeout: metricsTimeouts.write, IdleTimeout: metricsTimeouts.idle}}
	m.addr = ln.Addr().String()
	go func() {
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	log.Info("serving metrics", "addr", ln.Addr().String())
	return m, nil
}

// reload counts a reload; a nil *metricsServer (metrics off) ignores it.
func (m *metricsServer) reload(result string) {
	if m != nil {
		m.collector.Reload(result)
	}
}

// revert counts an attempt to revert for want of a confirmation, once
// over: result is success or failure. A nil *metricsServer ignores it.
func (m *metricsServer) revert(result string) {
	if m != nil {
		m.safety.Revert(result)
	}
}

// startReverts counts the reverts done at the start, before the metrics
// were served (a change left unconfirmed by a daemon that stopped).
func (m *metricsServer) startReverts(n int) {
	for range n {
		m.revert("success")
	}
}

// tick records a control tick; a nil *metricsServer ignores it.
func (m *metricsServer) tick(rep control.TickReport, period time.Duration) {
	if m == nil {
		return
	}
	rules := make([]metrics.RuleControl, 0, len(rep.Rules))
	for _, r := range rep.Rules {
		rules = append(rules, metrics.RuleControl{Rule: r.Name, State: r.State, Breaker: r.Breaker, Latency: r.Latency, Signal: r.Signal, Stale: r.Stale})
	}
	m.collector.ObserveTick(rep.Duration, period, rules)
}

func (m *metricsServer) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return m.srv.Shutdown(ctx)
}
