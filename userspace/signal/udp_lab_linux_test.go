//go:build linux

package signal

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// ReceiveQueues on real UDP sockets in a lab namespace: datagrams that no
// one reads fill the receive memory, a small buffer drops the excess and
// counts it, reading empties the queue, and the namespace's InDatagrams
// counts what was read (not what arrived). Sockets on other ports are not
// reported.
func TestReceiveQueuesLab(t *testing.T) {
	l := newLab(t)
	const port = 9400
	var d *Diag
	var ns *NetStat
	var conn *net.UDPConn
	var other *net.UDPConn
	err := l.Server.Do(func() error {
		var err error
		if d, err = NewDiag(); err != nil {
			return err
		}
		if ns, err = OpenNetStat(); err != nil {
			return err
		}
		if conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IP(l.ServerIP4.AsSlice()), Port: port}); err != nil {
			return err
		}
		other, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IP(l.ServerIP4.AsSlice()), Port: port + 1})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(); ns.Close(); conn.Close(); other.Close() })
	// The smallest receive buffer (the kernel doubles it and keeps a
	// floor), so that a few hundred datagrams overflow it.
	raw, _ := conn.SyscallConn()
	_ = raw.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })

	ranges := []dataplane.PortRange{{Lo: port, Hi: port}}
	read := func() SocketQueue {
		t.Helper()
		q, err := d.ReceiveQueues(context.Background(), ranges)
		if err != nil || len(q) != 1 {
			t.Fatalf("ReceiveQueues = %+v, %v", q, err)
		}
		return q[0]
	}
	q0 := read()
	if q0.Sockets != 1 || q0.Queued != 0 || q0.Limit == 0 {
		t.Fatalf("idle socket: %+v", q0)
	}
	send := func(n int) {
		t.Helper()
		err := l.Client.Do(func() error {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IP(l.ServerIP4.AsSlice()), Port: port})
			if err != nil {
				return err
			}
			defer c.Close()
			for range n {
				if _, err := c.Write(make([]byte, 100)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	c0, err := ns.Read()
	if err != nil {
		t.Fatal(err)
	}
	send(5)
	time.Sleep(100 * time.Millisecond)
	q1 := read()
	if q1.Queued == 0 || q1.Drops != q0.Drops {
		t.Errorf("5 unread datagrams: %+v", q1)
	}
	send(500)
	time.Sleep(100 * time.Millisecond)
	q2 := read()
	if q2.Drops == q0.Drops || q2.Queued < q1.Queued {
		t.Errorf("500 more into a small buffer: %+v, want drops", q2)
	}
	// Read everything queued.
	n := 0
	buf := make([]byte, 2048)
	for {
		_ = conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := conn.Read(buf); err != nil {
			break
		}
		n++
	}
	q3 := read()
	c1, err := ns.Read()
	if err != nil {
		t.Fatal(err)
	}
	dc, _ := c1.Sub(c0)
	t.Logf("receive queue: idle %+v; 5 unread %+v; 505 unread %+v; after reading %d: %+v; InDatagrams +%d, RcvbufErrors +%d",
		q0, q1, q2, n, q3, dc.UDPInDatagrams, dc.UDPRcvbufErrors)
	if q3.Queued != 0 {
		t.Errorf("after reading everything: %+v", q3)
	}
	if dc.UDPInDatagrams != uint64(n) {
		t.Errorf("InDatagrams +%d, read %d: it should count what the service read", dc.UDPInDatagrams, n)
	}
	if uint64(n)+(q2.Drops-q0.Drops) != 505 {
		t.Errorf("read %d + dropped %d ≠ 505 sent", n, q2.Drops-q0.Drops)
	}
}
