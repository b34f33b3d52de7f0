//go:build linux

package signal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
	"golang.org/x/sys/unix"
)

// ListenQueue is the accept-queue state of the LISTEN sockets whose local
// port lies in Ports, IPv4 and IPv6 together (a dual-stack [::] listener is
// an IPv6 socket and counted once).
type ListenQueue struct {
	Ports dataplane.PortRange
	// Listeners is the number of LISTEN sockets found (several with
	// SO_REUSEPORT or per address).
	Listeners int
	// Queued is the sum of their accept-queue lengths: connections that
	// completed the handshake and wait for accept() (sk_ack_backlog,
	// idiag_rqueue of a LISTEN socket).
	Queued uint64
	// Limit is the sum of their backlog limits (sk_max_ack_backlog,
	// idiag_wqueue): listen()'s backlog capped by net.core.somaxconn. The
	// kernel declares a queue full only when it holds more than its limit,
	// so a queue can reach Limit+1.
	Limit uint64
}

// ConnCount counts the connections of the local ports in Ports, IPv4 and
// IPv6 together.
type ConnCount struct {
	Ports dataplane.PortRange
	// SynRecv counts handshakes in progress (request sockets, which the
	// kernel reports in state SYN_RECV). Connections answered with SYN
	// cookies have no request socket and are not counted.
	SynRecv int
	// Established counts sockets in state ESTABLISHED, including those
	// still waiting in an accept queue.
	Established int
}

// TCP states (include/net/tcp_states.h).
const (
	tcpEstablished = 1
	tcpSynRecv     = 3
	tcpListen      = 10
	tcpAllStates   = 0xfff
)

// inet_diag constants (include/uapi/linux/inet_diag.h).
const (
	inetDiagReqBytecode = 1 // INET_DIAG_REQ_BYTECODE
	inetDiagBcJmp       = 1 // INET_DIAG_BC_JMP
	inetDiagBcSGe       = 2 // INET_DIAG_BC_S_GE
	inetDiagBcSLe       = 3 // INET_DIAG_BC_S_LE

	sizeofDiagReq = 56 // struct inet_diag_req_v2
	sizeofDiagMsg = 72 // struct inet_diag_msg
	sizeofNlAttr  = 4

	// Offsets in struct inet_diag_msg.
	diagMsgState  = 1
	diagMsgSport  = 4 // id.idiag_sport, network byte order
	diagMsgRqueue = 56
	diagMsgWqueue = 60

	// sizeofRangeFilter is one range's bytecode: S_GE and S_LE, each an op
	// followed by an op holding the port; sizeofJmp is the JMP between two
	// ranges.
	sizeofRangeFilter = 16
	sizeofJmp         = 4

	// MaxPortRanges bounds the ranges of one request: the bytecode's jump
	// offsets are 16 bits.
	MaxPortRanges = 1024

	// DefaultDiagTimeout bounds one Diag request when the context has no
	// earlier deadline.
	DefaultDiagTimeout = 100 * time.Millisecond

	diagRecvBuf = 32 << 10 // the kernel fills dump skbs up to 32 KiB
)

// ErrDumpInterrupted reports that the kernel's socket tables changed during
// a dump (NLM_F_DUMP_INTR): a socket may have been missed or seen twice, so
// the counts are unreliable for this tick.
var ErrDumpInterrupted = errors.New("sock_diag dump interrupted")

// Diag is a NETLINK_SOCK_DIAG socket for narrow TCP socket queries. It is
// bound to the network namespace of the thread that called [NewDiag] (see
// the package documentation); the daemon opens it once at startup. A Diag
// is safe for concurrent use; requests are serialised.
type Diag struct {
	mu      sync.Mutex
	fd      int
	seq     uint32
	pending uint32 // seq of an abandoned dump still to drain; 0 for none
	closed  bool
	buf     []byte
	req     []byte
}

// NewDiag opens a NETLINK_SOCK_DIAG socket in the calling thread's network
// namespace.
func NewDiag() (*Diag, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("open sock_diag socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("bind sock_diag socket: %w", err)
	}
	return &Diag{
		fd:  fd,
		seq: uint32(time.Now().UnixNano()) | 1,
		buf: make([]byte, diagRecvBuf),
	}, nil
}

// Close closes the socket. It is idempotent.
func (d *Diag) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if err := unix.Close(d.fd); err != nil {
		return fmt.Errorf("close sock_diag socket: %w", err)
	}
	return nil
}

// AcceptQueue reports, for each range in ranges, the LISTEN sockets of that
// local port range and their accept queues. It sends one request per
// address family, for state LISTEN only and with a bytecode filter on the
// local port, so the kernel walks only its listening hash and returns only
// the matching sockets. A listener whose port lies in several ranges counts
// in each. The call takes at most until ctx's deadline or
// DefaultDiagTimeout, whichever is earlier.
func (d *Diag) AcceptQueue(ctx context.Context, ranges []dataplane.PortRange) ([]ListenQueue, error) {
	out := make([]ListenQueue, len(ranges))
	for i, r := range ranges {
		out[i].Ports = r
	}
	err := d.query(ctx, ranges, 1<<tcpListen, func(state uint8, port uint16, rq, wq uint32) {
		if state != tcpListen {
			return
		}
		for i := range out {
			if out[i].Ports.Contains(port) {
				out[i].Listeners++
				out[i].Queued += uint64(rq)
				out[i].Limit += uint64(wq)
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("read accept queues: %w", err)
	}
	return out, nil
}

// Connections counts, for each range in ranges, the SYN_RECV and
// ESTABLISHED sockets of that local port range, with one filtered request
// per address family. Unlike AcceptQueue this makes the kernel walk its
// whole established hash table (every bucket, skipping empty ones), so its
// cost grows with the table size and the number of connections on the host,
// whichever ports they use; see the package benchmarks.
func (d *Diag) Connections(ctx context.Context, ranges []dataplane.PortRange) ([]ConnCount, error) {
	out := make([]ConnCount, len(ranges))
	for i, r := range ranges {
		out[i].Ports = r
	}
	err := d.query(ctx, ranges, 1<<tcpSynRecv|1<<tcpEstablished, func(state uint8, port uint16, _, _ uint32) {
		for i := range out {
			if !out[i].Ports.Contains(port) {
				continue
			}
			switch state {
			case tcpSynRecv:
				out[i].SynRecv++
			case tcpEstablished:
				out[i].Established++
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("count connections: %w", err)
	}
	return out, nil
}

// SocketQueue is the receive-queue state of the UDP sockets whose local
// port lies in Ports, IPv4 and IPv6 together.
type SocketQueue struct {
	Ports dataplane.PortRange
	// Sockets is the number of UDP sockets found (several with
	// SO_REUSEPORT, per address, or connected ones).
	Sockets int
	// Queued is the sum of their receive-queue memory in bytes
	// (sk_rmem_alloc: the datagrams' buffers, not their payload).
	Queued uint64
	// Limit is the sum of their receive buffers (sk_rcvbuf) in bytes.
	Limit uint64
	// Drops is the sum of their drop counters (sk_drops: datagrams
	// refused by a full receive buffer, and other socket-level drops),
	// cumulative since each socket was created.
	Drops uint64
}

// inet_diag extensions and sk_meminfo indexes (include/uapi/linux/
// inet_diag.h, sock_diag.h).
const (
	inetDiagSkMeminfo  = 7 // INET_DIAG_SKMEMINFO
	skMeminfoRmemAlloc = 0
	skMeminfoRcvbuf    = 1
	skMeminfoDrops     = 8
)

// ReceiveQueues reports, for each range in ranges, the UDP sockets of that
// local port range, their receive queues and their drops, with one
// filtered request per address family asking for the sk_meminfo
// extension. The kernel walks its UDP hash table (its size is that of the
// established one's UDP counterpart, small on most hosts).
func (d *Diag) ReceiveQueues(ctx context.Context, ranges []dataplane.PortRange) ([]SocketQueue, error) {
	out := make([]SocketQueue, len(ranges))
	for i, r := range ranges {
		out[i].Ports = r
	}
	if len(ranges) == 0 {
		return out, nil
	}
	bc, err := portFilter(ranges)
	if err != nil {
		return nil, fmt.Errorf("read receive queues: %w", err)
	}
	deadline := requestDeadline(ctx)
	var bad error
	fn := func(_ uint8, port uint16, rq, _ uint32, attrs []byte) {
		mem, ok := skMeminfo(attrs)
		if !ok {
			bad = errors.New("no sk_meminfo in the answer")
			return
		}
		for i := range out {
			if out[i].Ports.Contains(port) {
				out[i].Sockets++
				out[i].Queued += uint64(mem[skMeminfoRmemAlloc])
				out[i].Limit += uint64(mem[skMeminfoRcvbuf])
				out[i].Drops += uint64(mem[skMeminfoDrops])
			}
		}
		_ = rq // idiag_rqueue of a UDP socket is sk_rmem_alloc too
	}
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if err := d.dumpProto(ctx, deadline, unix.IPPROTO_UDP, family, tcpAllStates, 1<<(inetDiagSkMeminfo-1), bc, fn); err != nil {
			return nil, fmt.Errorf("read receive queues: %w", err)
		}
	}
	if bad != nil {
		return nil, fmt.Errorf("read receive queues: %w", bad)
	}
	return out, nil
}

// skMeminfo finds the INET_DIAG_SKMEMINFO attribute in attrs (netlink
// attributes, 4-byte aligned) and returns its first skMeminfoDrops+1
// values.
func skMeminfo(attrs []byte) ([skMeminfoDrops + 1]uint32, bool) {
	var out [skMeminfoDrops + 1]uint32
	ne := binary.NativeEndian
	for len(attrs) >= sizeofNlAttr {
		l := int(ne.Uint16(attrs[0:2]))
		typ := ne.Uint16(attrs[2:4])
		if l < sizeofNlAttr || l > len(attrs) {
			return out, false
		}
		if typ == inetDiagSkMeminfo && l-sizeofNlAttr >= 4*len(out) {
			for i := range out {
				out[i] = ne.Uint32(attrs[sizeofNlAttr+4*i:])
			}
			return out, true
		}
		next := (l + 3) &^ 3
		if next >= len(attrs) {
			break
		}
		attrs = attrs[next:]
	}
	return out, false
}

// diagFunc receives one socket of a dump: its state, local port and
// idiag_rqueue/idiag_wqueue.
type diagFunc func(state uint8, port uint16, rq, wq uint32)

// query dumps the TCP sockets in states whose local port lies in one of
// ranges, IPv4 then IPv6.
func (d *Diag) query(ctx context.Context, ranges []dataplane.PortRange, states uint32, fn diagFunc) error {
	if len(ranges) == 0 {
		return nil
	}
	bc, err := portFilter(ranges)
	if err != nil {
		return err
	}
	deadline := requestDeadline(ctx)
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if err := d.dump(ctx, deadline, family, states, bc, fn); err != nil {
			return err
		}
	}
	return nil
}

// portFilter compiles "local port in ranges[0] or ranges[1] or ..." into
// inet_diag bytecode.
//
// The kernel (net/ipv4/inet_diag.c, inet_diag_bc_run) runs the program with
// len = its length: an op that matches advances by its yes offset, one that
// does not by its no offset (both relative to the op), until len ≤ 0; the
// socket passes if len ends exactly at 0, that is if the program ran off its
// end, and fails if a jump went 4 bytes past the end. The audit
// (inet_diag_bc_audit) follows the yes offsets only, so every yes must step
// to the next op, and every no target must be an op on that chain or the
// end (+4). Each range is
//
//	S_GE First  yes → S_LE          no → next range (after the JMP)
//	S_LE Last   yes → JMP (or end)  no → next range (after the JMP)
//	JMP         always takes no → end of program: accept
//
// and the last range has no JMP: its no targets are end+4, reject. This is
// the shape iproute2's ss compiles "a or b" into.
func portFilter(ranges []dataplane.PortRange) ([]byte, error) {
	if len(ranges) > MaxPortRanges {
		return nil, fmt.Errorf("compile port filter: %d ranges, at most %d", len(ranges), MaxPortRanges)
	}
	n := len(ranges)*(sizeofRangeFilter+sizeofJmp) - sizeofJmp
	bc := make([]byte, n)
	op := func(off int, code, yes uint8, no uint16) {
		bc[off], bc[off+1] = code, yes
		binary.NativeEndian.PutUint16(bc[off+2:], no)
	}
	off := 0
	for i, r := range ranges {
		if r.Lo > r.Hi {
			return nil, fmt.Errorf("compile port filter: empty range %d-%d", r.Lo, r.Hi)
		}
		// Both no offsets land at the next range's start, which for the
		// last range is end+4.
		next := sizeofRangeFilter + sizeofJmp
		op(off, inetDiagBcSGe, 8, uint16(next))
		op(off+4, 0, 0, r.Lo)
		op(off+8, inetDiagBcSLe, 8, uint16(next-8))
		op(off+12, 0, 0, r.Hi)
		off += sizeofRangeFilter
		if i < len(ranges)-1 {
			rest := n - off - sizeofJmp // bytes after the JMP
			op(off, inetDiagBcJmp, sizeofJmp, uint16(rest+sizeofJmp))
			off += sizeofJmp
		}
	}
	return bc, nil
}

// requestDeadline is when a request started now must end: ctx's deadline or
// DefaultDiagTimeout from now, whichever is earlier.
func requestDeadline(ctx context.Context) time.Time {
	deadline := time.Now().Add(DefaultDiagTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	return deadline
}

// dump sends one SOCK_DIAG_BY_FAMILY dump request for TCP sockets of family
// in states, filtered by bc when it is not nil, passes every socket of the
// answer to fn, and gives up at deadline or when ctx ends.
func (d *Diag) dump(ctx context.Context, deadline time.Time, family uint8, states uint32, bc []byte, fn diagFunc) error {
	return d.dumpProto(ctx, deadline, unix.IPPROTO_TCP, family, states, 0, bc, func(state uint8, port uint16, rq, wq uint32, _ []byte) {
		fn(state, port, rq, wq)
	})
}

// diagAttrFunc receives one socket of a dump with the attributes that
// follow its inet_diag_msg (the extensions asked for).
type diagAttrFunc func(state uint8, port uint16, rq, wq uint32, attrs []byte)

// dumpProto is dump for sockets of protocol proto, asking for the
// extensions in ext (a bit mask of 1 << (INET_DIAG_x − 1)).
func (d *Diag) dumpProto(ctx context.Context, deadline time.Time, proto, family uint8, states uint32, ext uint8, bc []byte, fn diagAttrFunc) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("sock_diag socket closed")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if d.pending != 0 {
		if err := d.drain(deadline); err != nil {
			return err
		}
	}

	d.seq++
	if d.seq == 0 {
		d.seq = 1
	}
	seq := d.seq
	d.req = buildDiagRequestProto(d.req[:0], seq, proto, family, states, ext, bc)
	if _, err := unix.Write(d.fd, d.req); err != nil { // to the kernel: port id 0
		return fmt.Errorf("send sock_diag request: %w", err)
	}
	d.pending = seq // until its NLMSG_DONE is read
	interrupted := false
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := d.recv(deadline)
		if err != nil {
			return err
		}
		done, intr, err := parseDiagMessagesAttrs(d.buf[:n], seq, fn)
		interrupted = interrupted || intr
		if done {
			d.pending = 0
		}
		if err != nil {
			return err
		}
		if done {
			break
		}
	}
	if interrupted {
		return ErrDumpInterrupted
	}
	return nil
}

// buildDiagRequest appends a netlink SOCK_DIAG_BY_FAMILY dump request:
// nlmsghdr, inet_diag_req_v2 and, when bc is not nil, the
// INET_DIAG_REQ_BYTECODE attribute.
func buildDiagRequest(b []byte, seq uint32, family uint8, states uint32, bc []byte) []byte {
	return buildDiagRequestProto(b, seq, unix.IPPROTO_TCP, family, states, 0, bc)
}

// buildDiagRequestProto is buildDiagRequest for protocol proto with the
// extensions ext.
func buildDiagRequestProto(b []byte, seq uint32, proto, family uint8, states uint32, ext uint8, bc []byte) []byte {
	size := unix.SizeofNlMsghdr + sizeofDiagReq
	if bc != nil {
		size += sizeofNlAttr + len(bc) // len(bc) is a multiple of 4
	}
	ne := binary.NativeEndian
	b = ne.AppendUint32(b, uint32(size))
	b = ne.AppendUint16(b, unix.SOCK_DIAG_BY_FAMILY)
	b = ne.AppendUint16(b, unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	b = ne.AppendUint32(b, seq)
	b = ne.AppendUint32(b, 0) // port id: the kernel fills in ours
	// inet_diag_req_v2: family, protocol, ext (no extensions), pad, states,
	// and a zero inet_diag_sockid (no exact-match fields).
	b = append(b, family, proto, ext, 0)
	b = ne.AppendUint32(b, states)
	b = append(b, make([]byte, sizeofDiagReq-8)...)
	if bc != nil {
		b = ne.AppendUint16(b, uint16(sizeofNlAttr+len(bc)))
		b = ne.AppendUint16(b, inetDiagReqBytecode)
		b = append(b, bc...)
	}
	return b
}

// recv reads one datagram into d.buf, waiting at most until deadline.
func (d *Diag) recv(deadline time.Time) (int, error) {
	for {
		n, err := unix.Read(d.fd, d.buf)
		switch {
		case err == nil:
			if n < unix.SizeofNlMsghdr {
				return 0, fmt.Errorf("read sock_diag answer: short datagram of %d bytes", n)
			}
			return n, nil
		case errors.Is(err, unix.EINTR):
			continue
		case !errors.Is(err, unix.EAGAIN):
			return 0, fmt.Errorf("read sock_diag answer: %w", err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return 0, fmt.Errorf("read sock_diag answer: %w", context.DeadlineExceeded)
		}
		ms := int((left + time.Millisecond - 1) / time.Millisecond)
		fds := []unix.PollFd{{Fd: int32(d.fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, ms); err != nil && !errors.Is(err, unix.EINTR) {
			return 0, fmt.Errorf("wait for sock_diag answer: %w", err)
		}
	}
}

// drain discards what is left of an abandoned dump (a request whose answer
// was not read to its end because of a timeout, a cancelled context or an
// error); the kernel refuses a new dump on the socket while one is running.
// The kernel produces the rest of a dump while it is read, so a dump that is
// still running always has data queued.
func (d *Diag) drain(deadline time.Time) error {
	for d.pending != 0 {
		n, err := unix.Read(d.fd, d.buf) // the socket is non-blocking
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			d.pending = 0 // nothing queued: the old dump is over
			return nil
		case err != nil:
			return fmt.Errorf("drain sock_diag socket: %w", err)
		}
		done, _, _ := parseDiagMessagesAttrs(d.buf[:n], d.pending, func(uint8, uint16, uint32, uint32, []byte) {})
		if done {
			d.pending = 0
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("drain sock_diag socket: %w", context.DeadlineExceeded)
		}
	}
	return nil
}

// parseDiagMessages walks the netlink messages of one datagram, passes the
// inet_diag_msg of every message with sequence number seq to fn (messages
// of other sequence numbers are left-overs of an abandoned dump and
// skipped), and reports whether the dump ended (NLMSG_DONE or NLMSG_ERROR)
// and whether the kernel flagged it as interrupted.
func parseDiagMessages(b []byte, seq uint32, fn diagFunc) (done, interrupted bool, err error) {
	return parseDiagMessagesAttrs(b, seq, func(state uint8, port uint16, rq, wq uint32, _ []byte) { fn(state, port, rq, wq) })
}

// parseDiagMessagesAttrs is parseDiagMessages passing each socket's
// attributes too.
func parseDiagMessagesAttrs(b []byte, seq uint32, fn diagAttrFunc) (done, interrupted bool, err error) {
	ne := binary.NativeEndian
	for len(b) >= unix.SizeofNlMsghdr {
		l := int(ne.Uint32(b[0:4]))
		typ := ne.Uint16(b[4:6])
		flags := ne.Uint16(b[6:8])
		mseq := ne.Uint32(b[8:12])
		if l < unix.SizeofNlMsghdr || l > len(b) {
			return done, interrupted, fmt.Errorf("parse sock_diag answer: bad message length %d of %d bytes", l, len(b))
		}
		payload := b[unix.SizeofNlMsghdr:l]
		if next := (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1); next < len(b) {
			b = b[next:]
		} else {
			b = nil
		}
		if mseq != seq {
			continue
		}
		if flags&unix.NLM_F_DUMP_INTR != 0 {
			interrupted = true
		}
		switch typ {
		case unix.NLMSG_DONE:
			// The payload holds the dump's final status (0 or -errno).
			if len(payload) >= 4 {
				if e := int32(ne.Uint32(payload)); e < 0 {
					return true, interrupted, fmt.Errorf("sock_diag dump: %w", unix.Errno(-e))
				}
			}
			return true, interrupted, nil
		case unix.NLMSG_ERROR:
			if len(payload) < 4 {
				return true, interrupted, errors.New("sock_diag request: truncated error message")
			}
			e := int32(ne.Uint32(payload))
			if e == 0 {
				return true, interrupted, nil // an ACK
			}
			return true, interrupted, fmt.Errorf("sock_diag request: %w", unix.Errno(-e))
		case unix.SOCK_DIAG_BY_FAMILY:
			if len(payload) < sizeofDiagMsg {
				return done, interrupted, fmt.Errorf("parse sock_diag answer: inet_diag_msg of %d bytes", len(payload))
			}
			fn(payload[diagMsgState],
				binary.BigEndian.Uint16(payload[diagMsgSport:]),
				ne.Uint32(payload[diagMsgRqueue:]),
				ne.Uint32(payload[diagMsgWqueue:]),
				payload[sizeofDiagMsg:])
		}
	}
	return done, interrupted, nil
}
