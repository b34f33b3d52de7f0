//go:build linux

package loader

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// slowEcho serves TCP in ns: it answers each read after delay with what
// it read, over keep-alive connections.
func slowEcho(t *testing.T, ns *lab.NS, addr netip.AddrPort, delay time.Duration) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", addr.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					time.Sleep(delay)
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// The handshakes counted per rule (sock_ops) and the response time (XDP
// stamps, TCX egress times) on real connections through a veth, IPv4 and
// IPv6; the TCX link is pinned, adopted by a second attach and removed by
// Detach.
func TestResponseTimeOnRealConnections(t *testing.T) {
	l, bpffs := setup(t)
	a, err := attachIn(t, l, bpffs, ModeNative)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { a.Close() }()
	if a.RespTimeErr != nil {
		if errors.Is(a.RespTimeErr, ErrRespTimeKernel) {
			t.Skipf("this kernel cannot time responses: %v", a.RespTimeErr)
		}
		t.Fatalf("response timer not attached: %v", a.RespTimeErr)
	}
	if a.ConnCountErr != nil {
		t.Fatalf("connection counter not attached: %v", a.ConnCountErr)
	}
	const port, delay = 8080, 20 * time.Millisecond
	var plan *dataplane.Plan
	err = l.Server.Do(func() error {
		var err error
		plan, err = dataplane.Compile(&dataplane.Spec{Rules: []dataplane.RuleSpec{{
			Name: "web", Protocol: "tcp", Ports: []dataplane.PortRange{{Lo: port, Hi: port}}, SynOnly: true,
			Rate: 1e6, Burst: 1e6, ServiceRate: true, ResponseTime: true,
		}}}, nil)
		if err != nil {
			return err
		}
		return a.Tables().Apply(plan)
	})
	if err != nil {
		t.Fatal(err)
	}
	slot := plan.Slot("web")
	slowEcho(t, l.Server, netip.AddrPortFrom(l.ServerIP4, port), delay)
	slowEcho(t, l.Server, netip.AddrPortFrom(l.ServerIP6, port), delay)

	// 2 connections per family, 5 requests each on keep-alive.
	const conns, requests = 4, 5
	for i := range conns {
		to := l.ServerIP4
		if i%2 == 1 {
			to = l.ServerIP6
		}
		var c net.Conn
		if err := l.Client.Do(func() error {
			var err error
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(to, port).String(), 2*time.Second)
			return err
		}); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		msg := []byte("GET / HTTP/1.1\r\n\r\n")
		for range requests {
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, make([]byte, len(msg))); err != nil {
				t.Fatal(err)
			}
		}
		c.Close()
	}
	var h dataplane.RespHist
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if h, err = a.Tables().ResponseTimes(slot); err != nil {
			t.Fatal(err)
		}
		if h.Count >= conns*requests {
			break
		}
	}
	hs, err := a.Tables().Handshakes(slot)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("measured: %d handshakes, %d requests stamped, %d responses timed, mean %v, p50 %v, p99 %v",
		hs, h.Stamps, h.Count, h.Mean(), h.Quantile(0.5), h.Quantile(0.99))
	if hs != conns {
		t.Errorf("handshakes %d, want %d", hs, conns)
	}
	if h.Count != conns*requests || h.Stamps != conns*requests {
		t.Errorf("%d requests stamped, %d responses timed, want %d", h.Stamps, h.Count, conns*requests)
	}
	// Each response comes at least delay after its request; the median,
	// interpolated in its 19 %-wide bucket, near it.
	if m, p50 := h.Mean(), h.Quantile(0.5); m < delay || p50 < delay*8/10 || p50 > 2*delay {
		t.Errorf("mean response time %v, median %v for a service that answers after %v", m, p50, delay)
	}
	// Every flow was closed by FIN: none is followed any more.
	if p, err := a.Tables().PendingRequests(); err != nil || len(p) != 0 {
		t.Errorf("flows still followed after their FINs: %v (%v)", p, err)
	}

	// A second attach adopts the pinned TCX link; Detach removes it.
	pin := filepath.Join(a.Dir, respTimePin)
	if _, err := os.Stat(pin); err != nil {
		t.Fatalf("TCX link not pinned: %v", err)
	}
	a.Close()
	if a, err = attachIn(t, l, bpffs, ModeNative); err != nil {
		t.Fatal(err)
	}
	if a.RespTimeErr != nil {
		t.Fatalf("re-attach: %v", a.RespTimeErr)
	}
	if h2, err := a.Tables().ResponseTimes(slot); err != nil || h2.Count != h.Count {
		t.Errorf("after re-attach the histogram has %d responses (%v), want the %d kept", h2.Count, err, h.Count)
	}
	a.Close()
	if err := Detach(bpffs, l.ServerIf); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("TCX link pin after detach: %v", err)
	}
}
