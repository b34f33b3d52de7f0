//go:build linux

package lab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Stamp is one datagram of SendStamped as a StampedReceiver saw it.
type Stamp struct {
	Seq  uint32
	Sent time.Time // the sender's clock when it sent the datagram
	Recv time.Time // the receiving socket's kernel timestamp
}

// Wait is how long the datagram took from send to receipt.
func (s Stamp) Wait() time.Duration { return s.Recv.Sub(s.Sent) }

const stampLen = 12 // sequence (4 bytes), send time in Unix ns (8 bytes)

// StampedReceiver records the sequence number, send time and kernel receive
// time of every datagram SendStamped sends to it. Sender and receiver share
// the host's clock (namespaces do not change CLOCK_REALTIME), so Wait is the
// time a datagram spent between the two sockets, queues included.
type StampedReceiver struct {
	conn *net.UDPConn
	done chan struct{}

	mu     sync.Mutex
	stamps []Stamp
	err    error
}

// ListenStamped opens a UDP socket on addr inside ns and records what
// arrives until Close.
func ListenStamped(ns *NS, addr netip.AddrPort) (*StampedReceiver, error) {
	var conn *net.UDPConn
	err := ns.Do(func() error {
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		conn = c
		return err
	})
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("listen udp %s in %s: %w", addr, ns.Name, err)
	}
	raw, err := conn.SyscallConn()
	if err == nil {
		cerr := raw.Control(func(fd uintptr) {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, udpRcvBuf); e != nil {
				err = fmt.Errorf("set SO_RCVBUFFORCE: %w", e)
				return
			}
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS_NEW, 1); e != nil {
				err = fmt.Errorf("set SO_TIMESTAMPNS_NEW: %w", e)
			}
		})
		err = errors.Join(err, cerr)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("configure udp socket: %w", err)
	}
	r := &StampedReceiver{conn: conn, done: make(chan struct{})}
	go r.readLoop()
	return r, nil
}

func (r *StampedReceiver) readLoop() {
	defer close(r.done)
	buf := make([]byte, 2048)
	oob := make([]byte, udpOOBSize)
	for {
		n, oobn, _, _, err := r.conn.ReadMsgUDP(buf, oob)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				r.mu.Lock()
				r.err = fmt.Errorf("read udp: %w", err)
				r.mu.Unlock()
			}
			return
		}
		if n < stampLen {
			continue
		}
		recv := cmsgTimestamp(oob[:oobn])
		if recv == 0 {
			recv = time.Now().UnixNano()
		}
		s := Stamp{
			Seq:  binary.BigEndian.Uint32(buf[0:4]),
			Sent: time.Unix(0, int64(binary.BigEndian.Uint64(buf[4:12]))),
			Recv: time.Unix(0, recv),
		}
		r.mu.Lock()
		r.stamps = append(r.stamps, s)
		r.mu.Unlock()
	}
}

// Stamps returns a copy of what arrived so far, in arrival order.
func (r *StampedReceiver) Stamps() []Stamp {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Stamp(nil), r.stamps...)
}

// Count is the number of datagrams received so far.
func (r *StampedReceiver) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.stamps)
}

// Reset forgets what arrived so far.
func (r *StampedReceiver) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stamps = nil
}

// Close closes the socket and returns the first read error, if any.
func (r *StampedReceiver) Close() error {
	err := r.conn.Close()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(err, r.err)
}

// SendStamped sends n datagrams of size bytes (at least 12) from a UDP
// socket inside ns to addr, spread evenly over spread (0: back to back),
// each carrying its sequence number (0…n-1) and its send time. It paces
// against the clock, sleeping for gaps of a millisecond or more and
// spinning below, and returns the send times.
func SendStamped(ns *NS, addr netip.AddrPort, n int, spread time.Duration, size int) ([]time.Time, error) {
	size = max(size, stampLen)
	var conn *net.UDPConn
	err := ns.Do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		conn = c
		return err
	})
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("dial udp %s in %s: %w", addr, ns.Name, err)
	}
	defer conn.Close()
	buf := make([]byte, size)
	sent := make([]time.Time, 0, n)
	start := time.Now()
	for i := range n {
		if n > 1 && spread > 0 {
			due := start.Add(time.Duration(int64(spread) * int64(i) / int64(n)))
			for {
				left := time.Until(due)
				if left <= 0 {
					break
				}
				if left >= time.Millisecond {
					time.Sleep(left - 500*time.Microsecond)
				}
			}
		}
		now := time.Now()
		binary.BigEndian.PutUint32(buf[0:4], uint32(i))
		binary.BigEndian.PutUint64(buf[4:12], uint64(now.UnixNano()))
		if _, err := conn.Write(buf); err != nil {
			return sent, fmt.Errorf("send datagram %d: %w", i, err)
		}
		sent = append(sent, now)
	}
	return sent, nil
}
