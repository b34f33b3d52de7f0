// Command load is the real-host scenarios' and make bench-http's HTTP
// client: vegeta's attacker (open loop: requests leave at the rate whatever
// the answers do) with or without keep-alive, summarised as one JSON line:
// what was offered, what succeeded and its latency, and every failure
// classified by how the client learned of it: a reset or refusal (the
// kernel or xlimit answered), a timeout (the SYN or the request went
// unanswered), an HTTP error status. With -phases the rate changes in
// steps and each step gets a summary of its own (the requests that left
// during it).
//
// The client is a net/http client of its own, handed to vegeta: its dial
// has a timeout (-dial-timeout; Go's dialer has none, and a dial may
// otherwise outlive its request), and -max-connections caps the
// connections per host as a real client's pool does (0: no cap).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Summary is the JSON line load prints.
type Summary struct {
	URL          string         `json:"url"`
	KeepAlive    bool           `json:"keepalive"`
	MaxConns     int            `json:"max_connections,omitempty"` // the client's cap on connections (0: none)
	OfferedRate  float64        `json:"offered_rate"`              // requests/s asked of the pacer
	SentRate     float64        `json:"sent_rate"`                 // requests/s that really left
	DurationS    float64        `json:"duration_s"`                // first request to last answer
	Requests     int            `json:"requests"`                  // results received
	Success      int            `json:"success"`                   // HTTP 2xx
	SuccessRate  float64        `json:"success_rate"`              // 2xx per second of the run
	SuccessShare float64        `json:"success_share"`             // 2xx / requests
	P50ms        float64        `json:"p50_ms"`                    // of the 2xx answers
	P99ms        float64        `json:"p99_ms"`
	MaxMs        float64        `json:"max_ms"`
	Reset        int            `json:"reset"`        // connection refused or reset
	ResetFastMs  float64        `json:"reset_p99_ms"` // p99 latency of those
	ResetWithin  int            `json:"reset_within_100ms"`
	Timeout      int            `json:"timeout"` // client timeout
	Status       map[int]int    `json:"status"`  // every HTTP status seen
	Other        map[string]int `json:"other"`   // other errors, shortened
	Phases       []*Phase       `json:"phases,omitempty"`
}

// Phase summarises the requests that left during one step of -phases.
type Phase struct {
	Rate      float64        `json:"rate"`       // offered requests/s
	DurationS float64        `json:"duration_s"` // the step's length
	Sent      int            `json:"sent"`       // requests that left in the step
	SentRate  float64        `json:"sent_rate"`  // sent / duration: the offered rate achieved
	Success   int            `json:"success"`    // HTTP 2xx
	Goodput   float64        `json:"goodput"`    // success / duration
	P50ms     float64        `json:"p50_ms"`     // of the 2xx answers
	P99ms     float64        `json:"p99_ms"`
	MaxMs     float64        `json:"max_ms"`
	Reset     int            `json:"reset"`          // connection refused, reset, closed
	E503      int            `json:"status_503"`     // HTTP 503
	Refused   int            `json:"refused"`        // resets + 5xx: told they were refused
	RefusedMs float64        `json:"refused_p99_ms"` // p99 time until a refused request failed
	Timeout   int            `json:"timeout"`        // client timeouts (the dial's included)
	Status    map[int]int    `json:"status"`
	Other     map[string]int `json:"other"`
	ok, ref   []float64
}

type step struct {
	rate float64
	dur  time.Duration
}

func main() {
	url := flag.String("url", "", "target URL")
	rate := flag.Float64("rate", 100, "requests per second (open loop)")
	dur := flag.Duration("duration", 10*time.Second, "attack duration")
	phases := flag.String("phases", "", "steps RATE:DURATION,... (overrides -rate and -duration), e.g. 183:5s,732:10s,183:5s")
	keep := flag.Bool("keepalive", false, "reuse connections (HTTP/1.1 keep-alive)")
	timeout := flag.Duration("timeout", 5*time.Second, "per-request timeout")
	dialTimeout := flag.Duration("dial-timeout", 0, "connect timeout (0: the request timeout)")
	conns := flag.Int("connections", 64, "idle connections kept per host with -keepalive")
	maxConns := flag.Int("max-connections", 0, "most connections per host at once, the client's pool (0: no cap)")
	workers := flag.Uint64("workers", 32, "initial vegeta workers")
	maxWorkers := flag.Uint64("max-workers", 4000, "most vegeta workers")
	flag.Parse()
	if *url == "" {
		slog.Error("load: -url is required")
		os.Exit(2)
	}
	steps := []step{{*rate, *dur}}
	if *phases != "" {
		var err error
		if steps, err = parsePhases(*phases); err != nil {
			slog.Error("load", "err", err)
			os.Exit(2)
		}
	}
	if *dialTimeout <= 0 {
		*dialTimeout = *timeout
	}
	client := &http.Client{
		Timeout: *timeout,
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: *dialTimeout, KeepAlive: 30 * time.Second}).DialContext,
			DisableKeepAlives:   !*keep,
			MaxIdleConnsPerHost: *conns,
			MaxConnsPerHost:     *maxConns,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	s, err := run(*url, steps, client, *keep, *maxConns, *workers, *maxWorkers)
	if err != nil {
		slog.Error("load", "err", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(s); err != nil {
		slog.Error("load: encode summary", "err", err)
		os.Exit(1)
	}
}

func parsePhases(v string) ([]step, error) {
	var out []step
	for _, f := range strings.Split(v, ",") {
		r, d, ok := strings.Cut(f, ":")
		if !ok {
			return nil, fmt.Errorf("parse phases: %q: want RATE:DURATION", f)
		}
		rate, err := strconv.ParseFloat(r, 64)
		if err != nil || rate <= 0 {
			return nil, fmt.Errorf("parse phases: rate %q: want a positive number", r)
		}
		dur, err := time.ParseDuration(d)
		if err != nil || dur <= 0 {
			return nil, fmt.Errorf("parse phases: duration %q: want a positive duration", d)
		}
		out = append(out, step{rate, dur})
	}
	return out, nil
}

// stepPacer sends at each step's rate in turn: the k-th request leaves at
// the time the steps' cumulative count reaches k.
type stepPacer []step

func (p stepPacer) Pace(elapsed time.Duration, hits uint64) (time.Duration, bool) {
	due, ok := p.at(hits + 1)
	if !ok {
		return 0, true
	}
	if due <= elapsed {
		return 0, false
	}
	return due - elapsed, false
}

// at is when the k-th request (from 1) is due; false past the last step.
func (p stepPacer) at(k uint64) (time.Duration, bool) {
	var start time.Duration
	left := float64(k)
	for _, s := range p {
		n := s.rate * s.dur.Seconds()
		if left <= n {
			return start + time.Duration((left-1)/s.rate*float64(time.Second)), true
		}
		left -= n
		start += s.dur
	}
	return 0, false
}

func (p stepPacer) Rate(elapsed time.Duration) float64 {
	var start time.Duration
	for _, s := range p {
		if elapsed < start+s.dur {
			return s.rate
		}
		start += s.dur
	}
	return 0
}

func run(url string, steps []step, client *http.Client, keep bool, maxConns int, workers, maxWorkers uint64) (*Summary, error) {
	var total time.Duration
	var offered float64
	for _, s := range steps {
		if s.rate <= 0 {
			return nil, errors.New("run attack: rates must be > 0")
		}
		total += s.dur
		offered += s.rate * s.dur.Seconds()
	}
	atk := vegeta.NewAttacker(vegeta.Workers(workers), vegeta.MaxWorkers(maxWorkers), vegeta.Client(client))
	tr := vegeta.NewStaticTargeter(vegeta.Target{Method: http.MethodGet, URL: url})
	s := &Summary{URL: url, KeepAlive: keep, MaxConns: maxConns, OfferedRate: offered / total.Seconds(),
		Status: map[int]int{}, Other: map[string]int{}}
	if len(steps) > 1 {
		for _, st := range steps {
			s.Phases = append(s.Phases, &Phase{Rate: st.rate, DurationS: st.dur.Seconds(), Status: map[int]int{}, Other: map[string]int{}})
		}
	}
	var ok, resets []float64
	var first, last time.Time
	began := time.Now()
	for r := range atk.Attack(tr, stepPacer(steps), total, "load") {
		s.Requests++
		if first.IsZero() || r.Timestamp.Before(first) {
			first = r.Timestamp
		}
		if e := r.End(); e.After(last) {
			last = e
		}
		ph := phaseOf(s.Phases, steps, r.Timestamp.Sub(began))
		if ph != nil {
			ph.Sent++
		}
		ms := float64(r.Latency) / float64(time.Millisecond)
		switch {
		case r.Error == "" || r.Code != 0:
			s.Status[int(r.Code)]++
			if r.Code >= 200 && r.Code < 300 {
				s.Success++
				ok = append(ok, ms)
			}
			if ph != nil {
				ph.Status[int(r.Code)]++
				switch {
				case r.Code >= 200 && r.Code < 300:
					ph.Success++
					ph.ok = append(ph.ok, ms)
				case r.Code >= 500:
					ph.Refused++
					ph.ref = append(ph.ref, ms)
					if r.Code == http.StatusServiceUnavailable {
						ph.E503++
					}
				}
			}
		case isReset(r.Error):
			s.Reset++
			resets = append(resets, ms)
			if ms <= 100 {
				s.ResetWithin++
			}
			if ph != nil {
				ph.Reset++
				ph.Refused++
				ph.ref = append(ph.ref, ms)
			}
		case isTimeout(r.Error):
			s.Timeout++
			if ph != nil {
				ph.Timeout++
			}
		default:
			s.Other[shorten(r.Error)]++
			if ph != nil {
				ph.Other[shorten(r.Error)]++
			}
		}
	}
	s.DurationS = last.Sub(first).Seconds()
	if s.DurationS > 0 {
		s.SuccessRate = float64(s.Success) / s.DurationS
	}
	if total > 0 {
		s.SentRate = float64(s.Requests) / total.Seconds()
	}
	if s.Requests > 0 {
		s.SuccessShare = float64(s.Success) / float64(s.Requests)
	}
	s.P50ms, s.P99ms, s.MaxMs = pct(ok, 0.50), pct(ok, 0.99), pct(ok, 1)
	s.ResetFastMs = pct(resets, 0.99)
	for _, ph := range s.Phases {
		ph.SentRate = float64(ph.Sent) / ph.DurationS
		ph.Goodput = float64(ph.Success) / ph.DurationS
		ph.P50ms, ph.P99ms, ph.MaxMs = pct(ph.ok, 0.50), pct(ph.ok, 0.99), pct(ph.ok, 1)
		ph.RefusedMs = pct(ph.ref, 0.99)
	}
	return s, nil
}

// phaseOf is the phase a request that left at offset d belongs to (nil
// without phases).
func phaseOf(phases []*Phase, steps []step, d time.Duration) *Phase {
	if len(phases) == 0 {
		return nil
	}
	var start time.Duration
	for i, st := range steps {
		start += st.dur
		if d < start {
			return phases[i]
		}
	}
	return phases[len(phases)-1]
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
