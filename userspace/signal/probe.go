package signal

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
)

// Prober measures a service from outside, for adaptive rules with `signal:
// probe`: every interval it opens a TCP connection (kind tcp) or makes an
// HTTP GET (kind http) and records the latency and whether it failed. It
// runs on its own goroutine; the control loop only reads the last result,
// so a slow service never slows the loop.
type Prober struct {
	spec   config.Probe
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	last   ProbeResult
	window []bool // outcomes of the recent probes, oldest first
}

// ProbeResult is a prober's latest measurement.
type ProbeResult struct {
	At        time.Time
	Latency   time.Duration // of the last successful probe
	OK        bool          // the last probe succeeded
	ErrorRate float64       // failed fraction of the last probeWindow probes
	Err       error
	// Seq counts the probes made so far: a reader that remembers it sees
	// whether a new probe completed since its last read.
	Seq uint64
}

const probeWindow = 20

// StartProber starts probing. Close stops it.
func StartProber(spec config.Probe) (*Prober, error) {
	if spec.Interval <= 0 || spec.Timeout <= 0 {
		return nil, fmt.Errorf("start prober: interval %v and timeout %v must be positive", spec.Interval, spec.Timeout)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Prober{spec: spec, cancel: cancel, done: make(chan struct{})}
	go p.run(ctx)
	return p, nil
}

// Spec is what the prober probes.
func (p *Prober) Spec() config.Probe { return p.spec }

// Close stops the prober and waits for it.
func (p *Prober) Close() {
	p.cancel()
	<-p.done
}

// Last returns the latest result and whether it is fresh (at most two
// intervals old).
func (p *Prober) Last(now time.Time) (ProbeResult, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last, !p.last.At.IsZero() && now.Sub(p.last.At) <= 2*p.spec.Interval
}

func (p *Prober) run(ctx context.Context) {
	defer close(p.done)
	client := &http.Client{
		Timeout: p.spec.Timeout,
		Transport: &http.Transport{
			DisableKeepAlives: true, // every probe a new connection, like a new client
			Proxy:             nil,
		},
		// Never follow a redirect: the probe policy checks only the
		// configured address, and a followed Location would let a rules
		// document point every host's daemon at a third party through a
		// local open redirect. A 3xx is the service's answer (status below
		// 500: the probe succeeded).
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	defer client.CloseIdleConnections()
	t := time.NewTicker(p.spec.Interval)
	defer t.Stop()
	for {
		start := time.Now()
		err := p.probe(ctx, client)
		lat := time.Since(start)
		if ctx.Err() != nil {
			return
		}
		p.record(start.Add(lat), lat, err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *Prober) probe(ctx context.Context, client *http.Client) error {
	ctx, cancel := context.WithTimeout(ctx, p.spec.Timeout)
	defer cancel()
	switch p.spec.Kind {
	case config.ProbeHTTP:
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.spec.Address+p.spec.Path, nil)
		if err != nil {
			return fmt.Errorf("build probe request: %w", err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("probe %s: %w", p.spec.Address, err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode >= 500 {
			return fmt.Errorf("probe %s: status %d", p.spec.Address, resp.StatusCode)
		}
		return nil
	default:
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", p.spec.Address)
		if err != nil {
			return fmt.Errorf("probe %s: %w", p.spec.Address, err)
		}
		return c.Close()
	}
}

func (p *Prober) record(at time.Time, lat time.Duration, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.window = append(p.window, err != nil)
	if len(p.window) > probeWindow {
		p.window = p.window[1:]
	}
	failed := 0
	for _, f := range p.window {
		if f {
			failed++
		}
	}
	p.last.At, p.last.OK, p.last.Err = at, err == nil, err
	p.last.Seq++
	p.last.ErrorRate = float64(failed) / float64(len(p.window))
	if err == nil {
		p.last.Latency = lat
	}
}
