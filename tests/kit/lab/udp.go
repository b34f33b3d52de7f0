//go:build linux

package lab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	udpRcvBuf   = 64 << 20 // SO_RCVBUF(FORCE) for UDPCounter
	udpBatch    = 64       // datagrams per recvmmsg
	udpBufSize  = 2048     // bytes kept per datagram (longer ones are truncated, still counted)
	udpOOBSize  = 128
	udpMaxNoted = 1 << 16 // distinct sources tracked per counter
	udpMaxStamp = 1 << 24 // receive timestamps kept (8 bytes each, 128 MiB)
)

// UDPCounter counts the datagrams arriving on a UDP socket inside a
// namespace, with kernel receive timestamps and per-source counts.
type UDPCounter struct {
	conn *net.UDPConn
	raw  syscall.RawConn
	addr netip.AddrPort
	done chan struct{}

	mu      sync.Mutex
	count   int
	stamps  []int64 // kernel receive time, Unix nanoseconds, in read order; the first udpMaxStamp only
	sources map[netip.Addr]int
	bytes   int64
	readErr error

	closeOnce sync.Once
	closeErr  error
}

// ListenUDPCounter opens a UDP socket on addr inside ns and starts counting.
// The socket gets a 64 MiB receive buffer (SO_RCVBUFFORCE) so that it does
// not drop under floods; Drops reports the socket's drops anyway.
func ListenUDPCounter(ns *NS, addr netip.AddrPort) (*UDPCounter, error) {
	network := "udp6"
	if addr.Addr().Unmap().Is4() {
		network = "udp4"
		addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	}
	var conn *net.UDPConn
	err := ns.Do(func() error {
		c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(addr))
		if err != nil {
			return fmt.Errorf("listen udp %s in %s: %w", addr, ns.Name, err)
		}
		conn = c
		return nil
	})
	if err != nil {
		if conn != nil {
			conn.Close() // fn succeeded but leaving the namespace failed
		}
		return nil, err
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("get raw conn: %w", err)
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, udpRcvBuf); e != nil {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, udpRcvBuf); e != nil {
				serr = fmt.Errorf("set SO_RCVBUF: %w", e)
				return
			}
		}
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS_NEW, 1); e != nil {
			serr = fmt.Errorf("set SO_TIMESTAMPNS_NEW: %w", e)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("configure udp socket: %w", err)
	}
	c := &UDPCounter{
		conn:    conn,
		raw:     raw,
		addr:    conn.LocalAddr().(*net.UDPAddr).AddrPort(),
		done:    make(chan struct{}),
		sources: make(map[netip.Addr]int),
	}
	go c.readLoop()
	return c, nil
}

// Addr is the local address the counter listens on (with the actual port
// when port 0 was requested).
func (c *UDPCounter) Addr() netip.AddrPort { return c.addr }

// readLoop receives in recvmmsg batches until the socket is closed.
func (c *UDPCounter) readLoop() {
	defer close(c.done)
	var (
		msgs  [udpBatch]unix.Mmsghdr
		iovs  [udpBatch]unix.Iovec
		names [udpBatch]unix.RawSockaddrInet6
		bufs  = make([]byte, udpBatch*udpBufSize)
		oobs  = make([]byte, udpBatch*udpOOBSize)
	)
	for i := range msgs {
		iovs[i].Base = &bufs[i*udpBufSize]
		iovs[i].SetLen(udpBufSize)
		msgs[i].Hdr.Iov = &iovs[i]
		msgs[i].Hdr.SetIovlen(1)
		msgs[i].Hdr.Name = (*byte)(unsafe.Pointer(&names[i]))
		msgs[i].Hdr.Control = &oobs[i*udpOOBSize]
	}
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			for i := range msgs {
				msgs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
				msgs[i].Hdr.SetControllen(udpOOBSize)
				msgs[i].Hdr.Flags = 0
				msgs[i].Len = 0
			}
			r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&msgs[0])),
				udpBatch, unix.MSG_DONTWAIT, 0, 0)
			switch errno {
			case 0:
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false // wait for readability
			default:
				c.mu.Lock()
				c.readErr = fmt.Errorf("recvmmsg: %w", errno)
				c.mu.Unlock()
				return true
			}
			now := time.Now().UnixNano()
			c.mu.Lock()
			for i := range int(r) {
				m := &msgs[i]
				ts := cmsgTimestamp(oobs[i*udpOOBSize : i*udpOOBSize+int(m.Hdr.Controllen)])
				if ts == 0 {
					ts = now
				}
				if len(c.stamps) < udpMaxStamp {
					c.stamps = append(c.stamps, ts)
				}
				c.count++
				c.bytes += int64(m.Len)
				if src, ok := sockaddrAddr(&names[i], m.Hdr.Namelen); ok {
					if _, seen := c.sources[src]; seen || len(c.sources) < udpMaxNoted {
						c.sources[src]++
					}
				}
			}
			c.mu.Unlock()
		}
	})
	runtime.KeepAlive(bufs)
	runtime.KeepAlive(oobs)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		c.mu.Lock()
		c.readErr = fmt.Errorf("read udp: %w", err)
		c.mu.Unlock()
	}
}

// cmsgTimestamp extracts an SCM_TIMESTAMPNS_NEW timestamp (Unix ns) from a
// control buffer, or returns 0.
func cmsgTimestamp(oob []byte) int64 {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return 0
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SO_TIMESTAMPNS_NEW && l >= unix.CmsgLen(16) {
			d := oob[unix.CmsgLen(0):]
			sec := int64(binary.NativeEndian.Uint64(d[0:8]))
			nsec := int64(binary.NativeEndian.Uint64(d[8:16]))
			return sec*1e9 + nsec
		}
		sp := unix.CmsgSpace(l - unix.CmsgLen(0))
		if sp > len(oob) {
			return 0
		}
		oob = oob[sp:]
	}
	return 0
}

// sockaddrAddr converts a received sockaddr to an address (IPv4-mapped
// addresses unmapped).
func sockaddrAddr(sa *unix.RawSockaddrInet6, n uint32) (netip.Addr, bool) {
	switch sa.Family {
	case unix.AF_INET:
		if n < unix.SizeofSockaddrInet4 {
			return netip.Addr{}, false
		}
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrFrom4(sa4.Addr), true
	case unix.AF_INET6:
		if n < unix.SizeofSockaddrInet6 {
			return netip.Addr{}, false
		}
		return netip.AddrFrom16(sa.Addr).Unmap(), true
	}
	return netip.Addr{}, false
}

// Count is the number of datagrams received so far.
func (c *UDPCounter) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count
}

// Bytes is the payload bytes received so far (truncated at 2048 per datagram).
func (c *UDPCounter) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

// CountBetween is the number of datagrams whose kernel receive timestamp t
// satisfies t0 <= t < t1. The timestamps are wall-clock (CLOCK_REALTIME).
// Only the first 16 Mi datagrams since creation or Reset keep a timestamp.
func (c *UDPCounter) CountBetween(t0, t1 time.Time) int {
	a, b := t0.UnixNano(), t1.UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, ts := range c.stamps {
		if ts >= a && ts < b {
			n++
		}
	}
	return n
}

// CountFrom is the number of datagrams received from src (only the first
// 65536 distinct sources are tracked).
func (c *UDPCounter) CountFrom(src netip.Addr) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sources[src.Unmap()]
}

// Sources returns a copy of the per-source counts (at most 65536 sources).
func (c *UDPCounter) Sources() map[netip.Addr]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[netip.Addr]int, len(c.sources))
	for k, v := range c.sources {
		m[k] = v
	}
	return m
}

// Timestamps returns a copy of the receive timestamps in read order (the
// first 16 Mi datagrams).
func (c *UDPCounter) Timestamps() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ts := make([]time.Time, len(c.stamps))
	for i, n := range c.stamps {
		ts[i] = time.Unix(0, n)
	}
	return ts
}

// Reset forgets everything counted so far.
func (c *UDPCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stamps = nil
	c.count = 0
	c.bytes = 0
	clear(c.sources)
}

// Settle waits until no datagram arrived for quiet (or until limit passed)
// and returns the count then. Use it after a flood to let the tail arrive.
func (c *UDPCounter) Settle(quiet, limit time.Duration) int {
	deadline := time.Now().Add(limit)
	last, lastChange := c.Count(), time.Now()
	for {
		time.Sleep(min(quiet/4+time.Millisecond, 50*time.Millisecond))
		n := c.Count()
		now := time.Now()
		if n != last {
			last, lastChange = n, now
		}
		if now.Sub(lastChange) >= quiet || now.After(deadline) {
			return n
		}
	}
}

// Drops is the number of datagrams the kernel dropped at this socket
// (receive buffer full and similar; SK_MEMINFO_DROPS).
func (c *UDPCounter) Drops() (int, error) {
	var drops int
	var serr error
	err := c.raw.Control(func(fd uintptr) {
		var mi [unix.SK_MEMINFO_VARS]uint32
		l := uint32(unsafe.Sizeof(mi))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
			uintptr(unsafe.Pointer(&mi[0])), uintptr(unsafe.Pointer(&l)), 0)
		if errno != 0 {
			serr = errno
			return
		}
		drops = int(mi[unix.SK_MEMINFO_DROPS])
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return 0, fmt.Errorf("get SO_MEMINFO: %w", err)
	}
	return drops, nil
}

// Err reports a receive error that stopped counting, if any.
func (c *UDPCounter) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.readErr
}

// Close stops counting and closes the socket. Counts stay readable.
func (c *UDPCounter) Close() error {
	c.closeOnce.Do(func() {
		if err := c.conn.Close(); err != nil {
			c.closeErr = fmt.Errorf("close udp counter: %w", err)
		}
		<-c.done
	})
	return c.closeErr
}
