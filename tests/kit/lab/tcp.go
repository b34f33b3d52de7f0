//go:build linux

package lab

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
)

const (
	echoMaxLine     = 4096
	echoIdleTimeout = 30 * time.Second
	probeDefaultTO  = 2 * time.Second
	probeMaxErrs    = 16
)

// TCPEcho is a line-echo TCP server inside a namespace: every line received
// on a connection is written back unchanged.
type TCPEcho struct {
	ln   *net.TCPListener
	addr netip.AddrPort
	wg   sync.WaitGroup

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closed   bool
	accepted int
	lines    int

	closeOnce sync.Once
	closeErr  error
}

// ListenTCPEcho starts a line-echo server on addr inside ns. Each connection
// is closed after echoIdleTimeout (30 s) without a complete line or when a
// line exceeds 4096 bytes.
func ListenTCPEcho(ns *NS, addr netip.AddrPort) (*TCPEcho, error) {
	network := "tcp6"
	if addr.Addr().Unmap().Is4() {
		network = "tcp4"
		addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	}
	var ln *net.TCPListener
	err := ns.Do(func() error {
		l, err := net.ListenTCP(network, net.TCPAddrFromAddrPort(addr))
		if err != nil {
			return fmt.Errorf("listen tcp %s in %s: %w", addr, ns.Name, err)
		}
		ln = l
		return nil
	})
	if err != nil {
		if ln != nil {
			ln.Close() // fn succeeded but leaving the namespace failed
		}
		return nil, err
	}
	e := &TCPEcho{
		ln:    ln,
		addr:  ln.Addr().(*net.TCPAddr).AddrPort(),
		conns: make(map[net.Conn]struct{}),
	}
	e.wg.Add(1)
	go e.acceptLoop()
	return e, nil
}

// Addr is the address the server listens on (with the actual port when port
// 0 was requested).
func (e *TCPEcho) Addr() netip.AddrPort { return e.addr }

// Accepted is the number of connections accepted so far.
func (e *TCPEcho) Accepted() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.accepted
}

// Lines is the number of lines echoed so far.
func (e *TCPEcho) Lines() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lines
}

func (e *TCPEcho) acceptLoop() {
	defer e.wg.Done()
	for {
		c, err := e.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// Transient accept errors (e.g. EMFILE): back off briefly.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			c.Close()
			return
		}
		e.conns[c] = struct{}{}
		e.accepted++
		e.wg.Add(1)
		e.mu.Unlock()
		go e.serve(c)
	}
}

func (e *TCPEcho) serve(c net.Conn) {
	defer e.wg.Done()
	defer func() {
		e.mu.Lock()
		delete(e.conns, c)
		e.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReaderSize(c, echoMaxLine)
	for {
		if err := c.SetReadDeadline(time.Now().Add(echoIdleTimeout)); err != nil {
			return
		}
		line, err := r.ReadSlice('\n')
		if err != nil {
			return // EOF, timeout, closed or line too long
		}
		// Count before replying, so a client that got its echo sees it.
		e.mu.Lock()
		e.lines++
		e.mu.Unlock()
		if _, err := c.Write(line); err != nil {
			return
		}
	}
}

// Close stops the server, closes all its connections and waits for its
// goroutines.
func (e *TCPEcho) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		err := e.ln.Close()
		for c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
		if err != nil {
			e.closeErr = fmt.Errorf("close tcp echo: %w", err)
		}
	})
	return e.closeErr
}

// ProbeResult summarises a TCPProbe run.
type ProbeResult struct {
	Attempts  int
	Successes int
	Failures  int
	Latencies []time.Duration // of the successful probes: connect + request + response
	Errors    []error         // the first failures (at most 16)
}

// LatencyPercentile returns the q-quantile (0..1) of the successful probes'
// latencies, or 0 without successes.
func (r ProbeResult) LatencyPercentile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	s := slices.Clone(r.Latencies)
	slices.Sort(s)
	i := int(q * float64(len(s)-1))
	return s[max(0, min(len(s)-1, i))]
}

// TCPProbe connects from ns to addr (a TCPEcho), one request/response per
// connection; see TCPProbeFrom.
func TCPProbe(ctx context.Context, ns *NS, addr netip.AddrPort, n int, interval, timeout time.Duration) (ProbeResult, error) {
	return TCPProbeFrom(ctx, ns, netip.Addr{}, addr, n, interval, timeout)
}

// TCPProbeFrom connects from ns to addr, optionally from source address src,
// and checks one line echo per connection. It makes n probes (n <= 0: until
// ctx ends), started every interval (0: back to back; a slow probe delays
// the next one, which then starts at once), each limited to timeout (0: 2 s)
// for connect, request and response together. When ctx ends early it returns
// the results so far and, if n > 0, ctx's error.
func TCPProbeFrom(ctx context.Context, ns *NS, src netip.Addr, addr netip.AddrPort, n int, interval, timeout time.Duration) (ProbeResult, error) {
	var res ProbeResult
	if n <= 0 && ctx.Done() == nil {
		return res, errors.New("tcp probe: n <= 0 needs a cancellable context")
	}
	if timeout <= 0 {
		timeout = probeDefaultTO
	}
	var local *net.TCPAddr
	if src.IsValid() {
		local = net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
	}
	start := time.Now()
	for i := 0; n <= 0 || i < n; i++ {
		if interval > 0 {
			if err := sleepCtx(ctx, time.Until(start.Add(time.Duration(i)*interval))); err != nil {
				break
			}
		}
		if ctx.Err() != nil {
			break
		}
		lat, err := probeOnce(ctx, ns, local, addr, i, timeout)
		if err != nil && ctxEnded(ctx) {
			break // cut short by the caller, not a failed probe
		}
		res.Attempts++
		if err != nil {
			res.Failures++
			if len(res.Errors) < probeMaxErrs {
				res.Errors = append(res.Errors, err)
			}
			continue
		}
		res.Successes++
		res.Latencies = append(res.Latencies, lat)
	}
	if n > 0 && res.Attempts < n {
		return res, fmt.Errorf("tcp probe %s: %w", addr, ctx.Err())
	}
	return res, nil
}

// ctxEnded reports whether ctx is done or its deadline has passed (a socket
// deadline derived from it can fire before ctx itself reports done).
func ctxEnded(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// probeOnce dials addr from inside ns, sends one line and checks the echo.
func probeOnce(ctx context.Context, ns *NS, local *net.TCPAddr, addr netip.AddrPort, seq int, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	t0 := time.Now()
	var conn net.Conn
	err := ns.Do(func() error {
		d := net.Dialer{LocalAddr: local}
		c, err := d.DialContext(ctx, "tcp", addr.String())
		if err != nil {
			return fmt.Errorf("dial %s: %w", addr, err)
		}
		conn = c
		return nil
	})
	if err != nil {
		if conn != nil {
			conn.Close() // fn succeeded but leaving the namespace failed
		}
		return 0, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return 0, fmt.Errorf("set deadline: %w", err)
	}
	req := fmt.Appendf(nil, "xlimit-probe %d\n", seq)
	if _, err := conn.Write(req); err != nil {
		return 0, fmt.Errorf("write %s: %w", addr, err)
	}
	resp, err := bufio.NewReader(conn).ReadSlice('\n')
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", addr, err)
	}
	if !bytes.Equal(resp, req) {
		return 0, fmt.Errorf("read %s: got %q, want %q", addr, resp, req)
	}
	return time.Since(t0), nil
}
