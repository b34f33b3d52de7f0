// Command load is the real-host scenarios' HTTP client: vegeta's attacker
// (open loop: requests leave at the rate whatever the answers do) with or
// without keep-alive, summarised as one JSON line: what was offered, what
// succeeded and its latency, and every failure classified by how the client
// learned of it: a reset or refusal (the kernel or xlimit answered), a
// timeout (the SYN or the request went unanswered), an HTTP error status.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Summary is the JSON line load prints.
type Summary struct {
	URL          string         `json:"url"`
	KeepAlive    bool           `json:"keepalive"`
	OfferedRate  float64        `json:"offered_rate"`  // requests/s asked of the pacer
	SentRate     float64        `json:"sent_rate"`     // requests/s that really left
	DurationS    float64        `json:"duration_s"`    // first request to last answer
	Requests     int            `json:"requests"`      // results received
	Success      int            `json:"success"`       // HTTP 2xx
	SuccessRate  float64        `json:"success_rate"`  // 2xx per second of the run
	SuccessShare float64        `json:"success_share"` // 2xx / requests
	P50ms        float64        `json:"p50_ms"`        // of the 2xx answers
	P99ms        float64        `json:"p99_ms"`
	MaxMs        float64        `json:"max_ms"`
	Reset        int            `json:"reset"`        // connection refused or reset
	ResetFastMs  float64        `json:"reset_p99_ms"` // p99 latency of those
	ResetWithin  int            `json:"reset_within_100ms"`
	Timeout      int            `json:"timeout"` // client timeout
	Status       map[int]int    `json:"status"`  // every HTTP status seen
	Other        map[string]int `json:"other"`   // other errors, shortened
}

func main() {
	url := flag.String("url", "", "target URL")
	rate := flag.Float64("rate", 100, "requests per second (open loop)")
	dur := flag.Duration("duration", 10*time.Second, "attack duration")
	keep := flag.Bool("keepalive", false, "reuse connections (HTTP/1.1 keep-alive)")
	timeout := flag.Duration("timeout", 5*time.Second, "per-request timeout")
	conns := flag.Int("connections", 64, "idle connections kept per host with -keepalive")
	workers := flag.Uint64("workers", 32, "initial vegeta workers")
	maxWorkers := flag.Uint64("max-workers", 4000, "most vegeta workers")
	flag.Parse()
	if *url == "" {
		slog.Error("load: -url is required")
		os.Exit(2)
	}
	s, err := run(*url, *rate, *dur, *keep, *timeout, *conns, *workers, *maxWorkers)
	if err != nil {
		slog.Error("load", "err", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(s); err != nil {
		slog.Error("load: encode summary", "err", err)
		os.Exit(1)
	}
}

func run(url string, rate float64, dur time.Duration, keep bool, timeout time.Duration, conns int, workers, maxWorkers uint64) (*Summary, error) {
	if rate <= 0 {
		return nil, errors.New("run attack: -rate must be > 0")
	}
	atk := vegeta.NewAttacker(vegeta.KeepAlive(keep), vegeta.Timeout(timeout),
		vegeta.Connections(conns), vegeta.Workers(workers), vegeta.MaxWorkers(maxWorkers),
		vegeta.Redirects(vegeta.NoFollow))
	tr := vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodGet, URL: url})
	// Per: one request every 1/rate seconds, exactly.
	pacer := vegeta.ConstantPacer{Freq: int(rate * 1000), Per: 1000 * time.Second}
	s := &Summary{URL: url, KeepAlive: keep, OfferedRate: rate, Status: map[int]int{}, Other: map[string]int{}}
	var ok, resets []float64
	var first, last time.Time
	for r := range atk.Attack(tr, pacer, dur, "realhost") {
		s.Requests++
		if first.IsZero() || r.Timestamp.Before(first) {
			first = r.Timestamp
		}
		if e := r.End(); e.After(last) {
			last = e
		}
		ms := float64(r.Latency) / float64(time.Millisecond)
		switch {
		case r.Error == "" || r.Code != 0:
			s.Status[int(r.Code)]++
			if r.Code >= 200 && r.Code < 300 {
				s.Success++
				ok = append(ok, ms)
			}
		case isReset(r.Error):
			s.Reset++
			resets = append(resets, ms)
			if ms <= 100 {
				s.ResetWithin++
			}
		case isTimeout(r.Error):
			s.Timeout++
		default:
			s.Other[shorten(r.Error)]++
		}
	}
	s.DurationS = last.Sub(first).Seconds()
	if s.DurationS > 0 {
		s.SuccessRate = float64(s.Success) / s.DurationS
	}
	if dur > 0 {
		s.SentRate = float64(s.Requests) / dur.Seconds()
	}
	if s.Requests > 0 {
		s.SuccessShare = float64(s.Success) / float64(s.Requests)
	}
	s.P50ms, s.P99ms, s.MaxMs = pct(ok, 0.50), pct(ok, 0.99), pct(ok, 1)
	s.ResetFastMs = pct(resets, 0.99)
	return s, nil
}

func isReset(e string) bool {
	return strings.Contains(e, "connection reset") || strings.Contains(e, "connection refused") ||
		strings.Contains(e, "broken pipe") || strings.HasSuffix(e, ": EOF") || strings.Contains(e, "server closed idle connection")
}

func isTimeout(e string) bool {
	return strings.Contains(e, "Timeout exceeded") || strings.Contains(e, "i/o timeout") ||
		strings.Contains(e, "deadline exceeded")
}

// shorten drops the addresses from an error so that equal causes add up.
func shorten(e string) string {
	if i := strings.LastIndex(e, ": "); i >= 0 && i+2 < len(e) {
		return e[i+2:]
	}
	return e
}

func pct(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	i := int(q*float64(len(v))+0.5) - 1
	i = max(0, min(i, len(v)-1))
	return float64(int(v[i]*100)) / 100
}
