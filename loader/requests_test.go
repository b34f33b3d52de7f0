//go:build linux

package loader

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The refusal of a request over its rule's cap on requests in flight
// (bpf/request.h, bpf/request_tc.h) on real connections through a veth:
// with a cap of 1 and one request held by the service, a second client's
// next request on its kept-alive connection fails at once with a reset,
// and the service's socket of that connection is reset too (its read
// fails instead of waiting for a request that never comes); the held
// request is answered, and the kernel counts one refusal.
func TestRequestRefusalOnRealConnections(t *testing.T) {
	l, bpffs := setup(t)
	a, err := attachIn(t, l, bpffs, ModeNative)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { a.Close() }()
	if a.RespTimeErr != nil {
		if errors.Is(a.RespTimeErr, ErrRespTimeKernel) {
			t.Skipf("this kernel has no TCX: %v", a.RespTimeErr)
		}
		t.Fatalf("response timer or request refusal not attached: %v", a.RespTimeErr)
	}
	const port, hold = 8080, 300 * time.Millisecond
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

	// The service: answers each read with what it read, after hold for
	// a request "slow", at once otherwise; reports how each connection's
	// reading ended.
	var ln net.Listener
	if err := l.Server.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(l.ServerIP4, port).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ended := make(chan error, 8)
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
						ended <- err
						return
					}
					if string(buf[:n]) == "slow" {
						time.Sleep(hold)
					}
					if _, err := c.Write(buf[:n]); err != nil {
						ended <- err
						return
					}
				}
			}()
		}
	}()

	dial := func() net.Conn {
		t.Helper()
		var c net.Conn
		if err := l.Client.Do(func() error {
			var err error
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(l.ServerIP4, port).String(), 2*time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	exchange := func(c net.Conn, msg string) error {
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := io.ReadFull(c, make([]byte, len(msg)))
		return err
	}
	c1, c2 := dial(), dial()
	defer c1.Close()
	defer c2.Close()
	// Both connections kept alive after a first request each, under no cap.
	for _, c := range []net.Conn{c1, c2} {
		if err := exchange(c, "hello"); err != nil {
			t.Fatalf("first request: %v", err)
		}
	}

	// The cap: 1 request in flight, fresh for a minute.
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	b, err := dataplane.NewBucket(1e6, 1e6, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Tables().SetLimit(slot, dataplane.Limit{Bucket: b, DeadlineNS: uint64(ts.Nano()) + 60e9,
		Epoch: plan.Rules[slot].Epoch, ReqCap: 1}); err != nil {
		t.Fatal(err)
	}

	held := make(chan error, 1)
	go func() { held <- exchange(c1, "slow") }()
	// c1's request is in flight once the kernel counts it.
	for deadline := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
		r, err := a.Tables().Requests(slot)
		if err != nil {
			t.Fatal(err)
		}
		if r.InFlight == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("c1's request never counted in flight: %+v", r)
		}
	}
	start := time.Now()
	err = exchange(c2, "again")
	took := time.Since(start)
	t.Logf("measured: the refused request failed after %v with %v", took, err)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the request over the cap: %v, want a reset (ECONNRESET)", err)
	}
	if took > hold/2 {
		t.Errorf("the refused request failed after %v: not at once (the held request takes %v)", took, hold)
	}
	// The service's side of c2 is reset too.
	select {
	case err := <-ended:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("the service's socket of the refused connection ended with %v, want ECONNRESET", err)
		}
	case <-time.After(hold / 2):
		t.Error("the service's socket of the refused connection is still open")
	}
	if err := <-held; err != nil {
		t.Errorf("the request under the cap: %v", err)
	}
	if r, err := a.Tables().Requests(slot); err != nil || r.Refused != 1 || r.InFlight != 0 {
		t.Errorf("kernel counts %+v (%v), want 1 refused, 0 in flight", r, err)
	}
}
