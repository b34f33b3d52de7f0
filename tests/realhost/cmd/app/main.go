// Command app is the service behind nginx in the real-host scenarios: a Go
// net/http server with a bounded worker pool. Each request holds one of
// -workers slots for -work (a sleep plus a little CPU, so its capacity,
// workers/work requests per second, does not depend on how fast an
// emulated CPU is); requests beyond the pool wait for a slot up to
// -queue-timeout and are then answered 503, the overload a real service
// shows; a request whose client went away leaves the queue. /stats reports
// what it served, the requests waiting for a slot and the most that ever
// waited at once (/stats?reset=1 starts that maximum afresh).
package main

import (
	"encoding/json"
	"flag"
	"log/slog"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("listen", "127.0.0.1:8081", "listen address")
	workers := flag.Int("workers", 4, "requests served at once")
	work := flag.Duration("work", 20*time.Millisecond, "time one request holds a worker")
	queueTimeout := flag.Duration("queue-timeout", 2*time.Second, "longest wait for a worker before a 503")
	flag.Parse()
	slots := make(chan struct{}, *workers)
	var served, refused, inflight, waiting, maxWaiting atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/work", func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTimer(*queueTimeout)
		defer t.Stop()
		n := waiting.Add(1)
		for m := maxWaiting.Load(); n > m && !maxWaiting.CompareAndSwap(m, n); m = maxWaiting.Load() {
		}
		select {
		case slots <- struct{}{}:
			waiting.Add(-1)
		case <-t.C:
			waiting.Add(-1)
			refused.Add(1)
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		case <-r.Context().Done():
			waiting.Add(-1)
			return
		}
		inflight.Add(1)
		end := time.Now().Add(*work)
		for x := 0; x < 20000; x++ { // a little CPU, then the rest asleep
			_ = x * x
		}
		time.Sleep(time.Until(end))
		inflight.Add(-1)
		<-slots
		served.Add(1)
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		mw := maxWaiting.Load()
		if r.URL.Query().Get("reset") != "" {
			maxWaiting.Store(waiting.Load())
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"served": served.Load(), "refused": refused.Load(),
			"inflight": inflight.Load(), "waiting": waiting.Load(), "max_waiting": mw,
			"workers": *workers, "work_ms": work.Milliseconds(),
			"capacity_per_s": float64(*workers) / work.Seconds()})
	})
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	slog.Info("app listening", "addr", *addr, "workers", *workers, "work", *work)
	if err := srv.ListenAndServe(); err != nil {
		slog.Error("app: serve", "err", err)
		os.Exit(1)
	}
}
