//go:build linux

package lab

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/frame"
)

// FloodSpec describes a stream of identical raw frames (except for the source
// address with RandomSources) sent by Flood.
type FloodSpec struct {
	NS             *NS    // namespace holding Ifname
	Ifname         string // interface to send on
	SrcMAC, DstMAC net.HardwareAddr
	Src, Dst       netip.Addr   // both IPv4 or both IPv6
	RandomSources  netip.Prefix // optional: a random source within this prefix per packet (Src may then be left zero)
	Proto          string       // ProtoUDP (default), ProtoTCPSYN
	DstPort        uint16
	SrcPort        uint16 // 0 means 40000
	PayloadLen     int
	VLANs          []frame.VLAN // optional VLAN tags, outermost first
	// IPv4OptionWords adds that many words of IPv4 NOP options (an IPv4
	// flood only; frame.Spec's).
	IPv4OptionWords int
	// TCPDataOffset, when not 0, is written as the SYN's TCP data offset
	// (the header built stays 20 bytes): 15 makes a SYN whose header runs
	// past the frame, which Linux discards before its checksum is
	// checked (the checksum stays the one of the header as built).
	TCPDataOffset uint8
	Rate          float64 // packets per second; 0 sends as fast as possible
	Duration      time.Duration
	Count         int // packets to attempt; Flood ends at Duration or Count, whichever comes first
	// MaxBurst limits catching up after the sender fell behind (a stall of
	// the process): at most this many overdue packets are sent back to back,
	// the rest of the backlog is skipped (FloodResult.Skipped) and counts
	// against Count. 0 catches up fully, which keeps the total exact but
	// sends the backlog as one burst. Values below the pacing batch
	// (Rate/1000 packets, at most 256) are raised to it.
	MaxBurst int
}

// FloodResult is what Flood did. Sent+Errors+Skipped is the number of
// packet slots used.
type FloodResult struct {
	Sent    int           // packets the kernel accepted
	Elapsed time.Duration // from the first send to the end
	Errors  int           // packets the kernel refused (e.g. ENOBUFS)
	Skipped int           // overdue packets dropped by FloodSpec.MaxBurst
}

// PPS is the achieved rate of accepted packets per second.
func (r FloodResult) PPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Sent) / r.Elapsed.Seconds()
}

const (
	floodMaxBatch = 256     // messages per sendmmsg
	floodSndBuf   = 4 << 20 // SO_SNDBUF for the packet socket
)

// Flood sends raw Ethernet frames on s.Ifname inside s.NS through an
// AF_PACKET socket with PACKET_QDISC_BYPASS, in sendmmsg batches. With
// s.Rate > 0 it paces against the monotonic clock: it sleeps between batches
// and always sends what is due by now, so oversleeping or a stall of the
// process does not lower the total (see MaxBurst). It ends after s.Duration
// or s.Count packets, whichever comes first, or when ctx ends (which is not
// an error). At least one of Duration, Count or a cancellable ctx is
// required.
func Flood(ctx context.Context, s FloodSpec) (FloodResult, error) {
	var res FloodResult
	switch {
	case s.NS == nil || s.Ifname == "":
		return res, errors.New("flood: namespace and interface are required")
	case s.Duration <= 0 && s.Count <= 0 && ctx.Done() == nil:
		return res, errors.New("flood: neither Duration, Count nor a cancellable context bounds the flood")
	case s.Proto != "" && s.Proto != ProtoUDP && s.Proto != ProtoTCPSYN:
		return res, fmt.Errorf("flood: unsupported protocol %q", s.Proto)
	case s.Rate < 0 || s.Count < 0 || s.MaxBurst < 0:
		return res, fmt.Errorf("flood: negative rate %v, count %d or burst %d", s.Rate, s.Count, s.MaxBurst)
	}
	src := s.Src
	var rnd *sourceRand
	if s.RandomSources.IsValid() {
		p := s.RandomSources.Masked()
		if p.Addr().Is4() != s.Dst.Unmap().Is4() {
			return res, fmt.Errorf("flood: random source prefix %s does not match destination %s", p, s.Dst)
		}
		rnd = newSourceRand(p)
		src = p.Addr()
	}
	srcPort := s.SrcPort
	if srcPort == 0 {
		srcPort = 40000
	}
	fs := s
	fs.Src, fs.SrcPort = src, srcPort
	tmpl, lay, err := floodFrame(fs)
	if err != nil {
		return res, fmt.Errorf("flood: %w", err)
	}

	fd, err := openPacketSocket(s.NS, s.Ifname)
	if err != nil {
		return res, err
	}
	defer unix.Close(fd)

	// One buffer per batch slot when sources vary, otherwise every message
	// points at the same frame.
	nbuf := 1
	if rnd != nil {
		nbuf = floodMaxBatch
	}
	bufs := make([][]byte, nbuf)
	for i := range bufs {
		bufs[i] = append([]byte(nil), tmpl...)
	}
	iovs := make([]unix.Iovec, floodMaxBatch)
	msgs := make([]unix.Mmsghdr, floodMaxBatch)
	for i := range msgs {
		b := bufs[i%nbuf]
		iovs[i].Base = &b[0]
		iovs[i].SetLen(len(b))
		msgs[i].Hdr.Iov = &iovs[i]
		msgs[i].Hdr.SetIovlen(1)
	}

	// Pacing: send in batches of about a millisecond worth of packets.
	pace, maxBurst := 0, 0
	if s.Rate > 0 {
		pace = max(1, min(floodMaxBatch, int(s.Rate/1000)))
		if s.MaxBurst > 0 {
			maxBurst = max(s.MaxBurst, pace)
		}
	}
	// Packets scheduled before Duration ends (packet i is due at i/Rate).
	total := -1
	if s.Rate > 0 && s.Duration > 0 {
		total = int(math.Ceil(s.Rate * s.Duration.Seconds()))
	}
	start := time.Now()
	attempted := 0
	for {
		if ctx.Err() != nil {
			break
		}
		elapsed := time.Since(start)
		final := false
		if s.Duration > 0 && elapsed >= s.Duration {
			// Time is up. A paced flood still sends (or, with MaxBurst,
			// skips) what was due before the end but is late because the
			// process stalled, so the total stays exact.
			if total < 0 || attempted >= total {
				break
			}
			final = true
		}
		n := floodMaxBatch
		if s.Count > 0 {
			if attempted >= s.Count {
				break
			}
			n = min(n, s.Count-attempted)
		}
		if s.Rate > 0 {
			due := int(s.Rate*elapsed.Seconds()) + 1 // packets due by now, packet 0 at t=0
			if final || (total >= 0 && due > total) {
				due = total
			}
			if due <= attempted {
				// Sleep until a pacing batch is due (or the flood ends).
				next := time.Duration(float64(attempted+pace-1) / s.Rate * float64(time.Second))
				if s.Duration > 0 {
					next = min(next, s.Duration)
				}
				if err := sleepCtx(ctx, next-elapsed); err != nil {
					break
				}
				continue
			}
			if behind := due - attempted; maxBurst > 0 && behind > maxBurst {
				skip := behind - maxBurst
				if s.Count > 0 {
					skip = min(skip, s.Count-attempted)
				}
				res.Skipped += skip
				attempted += skip
				continue
			}
			n = min(n, due-attempted)
		}
		if rnd != nil {
			for i := range n {
				lay.SetSource(bufs[i], rnd.next())
			}
		}
		sent, failed, err := sendBatch(fd, msgs[:n])
		res.Sent += sent
		res.Errors += failed
		attempted += sent + failed
		if err != nil {
			res.Elapsed = time.Since(start)
			return res, fmt.Errorf("flood %s: %w", s.Ifname, err)
		}
	}
	res.Elapsed = time.Since(start)
	runtime.KeepAlive(bufs)
	return res, nil
}

// openPacketSocket opens an AF_PACKET socket inside ns bound to ifname that
// only sends (protocol 0: nothing is delivered to it).
func openPacketSocket(ns *NS, ifname string) (int, error) {
	fd := -1
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("find interface %s in %s: %w", ifname, ns.Name, err)
		}
		s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open packet socket: %w", err)
		}
		if err := unix.SetsockoptInt(s, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
			unix.Close(s)
			return fmt.Errorf("set PACKET_QDISC_BYPASS: %w", err)
		}
		if err := unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, floodSndBuf); err != nil {
			if err := unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_SNDBUF, floodSndBuf); err != nil {
				unix.Close(s)
				return fmt.Errorf("set SO_SNDBUF: %w", err)
			}
		}
		if err := unix.Bind(s, &unix.SockaddrLinklayer{Ifindex: ifi.Index}); err != nil {
			unix.Close(s)
			return fmt.Errorf("bind packet socket to %s: %w", ifname, err)
		}
		fd = s
		return nil
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd) // fn succeeded but leaving the namespace failed
		}
		return -1, err
	}
	return fd, nil
}

// sendBatch sends msgs with sendmmsg, retrying after partial sends. A message
// refused with a transient error (ENOBUFS, EAGAIN) is counted as failed and
// skipped; any other error is returned.
func sendBatch(fd int, msgs []unix.Mmsghdr) (sent, failed int, err error) {
	for off := 0; off < len(msgs); {
		r, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd),
			uintptr(unsafe.Pointer(&msgs[off])), uintptr(len(msgs)-off), 0, 0, 0)
		switch errno {
		case 0:
			sent += int(r)
			off += int(r)
		case unix.EINTR:
		case unix.ENOBUFS, unix.EAGAIN:
			failed++
			off++
			time.Sleep(20 * time.Microsecond)
		default:
			return sent, failed, fmt.Errorf("sendmmsg: %w", errno)
		}
	}
	runtime.KeepAlive(msgs)
	return sent, failed, nil
}

// sleepCtx sleeps for d or until ctx ends (then it returns ctx.Err()).
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// sourceRand draws uniformly random addresses within a prefix.
type sourceRand struct {
	rng            *rand.Rand
	hi, lo         uint64 // prefix bits (IPv4 in lo's low 32 bits)
	hostHi, hostLo uint64 // host bit masks
	v4             bool
}

func newSourceRand(p netip.Prefix) *sourceRand {
	r := &sourceRand{rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), v4: p.Addr().Is4()}
	if r.v4 {
		a := p.Addr().As4()
		r.lo = uint64(a[0])<<24 | uint64(a[1])<<16 | uint64(a[2])<<8 | uint64(a[3])
		r.hostLo = uint64(1)<<(32-p.Bits()) - 1
		return r
	}
	a := p.Addr().As16()
	for i := range 8 {
		r.hi = r.hi<<8 | uint64(a[i])
		r.lo = r.lo<<8 | uint64(a[8+i])
	}
	switch bits := p.Bits(); {
	case bits >= 64:
		r.hostLo = ^uint64(0) >> (bits - 64) // 0 for a /128
	default:
		r.hostHi = ^uint64(0) >> bits
		r.hostLo = ^uint64(0)
	}
	return r
}

func (r *sourceRand) next() netip.Addr {
	if r.v4 {
		v := r.lo | r.rng.Uint64()&r.hostLo
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	hi := r.hi | r.rng.Uint64()&r.hostHi
	lo := r.lo | r.rng.Uint64()&r.hostLo
	var a [16]byte
	for i := range 8 {
		a[i] = byte(hi >> (56 - 8*i))
		a[8+i] = byte(lo >> (56 - 8*i))
	}
	return netip.AddrFrom16(a)
}
