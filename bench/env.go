//go:build linux

package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/bench/gen"
	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/tests/kit/lab"
)

const (
	sinkPort = 9000 // the limited UDP port
	// payloadLen makes 60-byte frames: the Ethernet minimum without FCS.
	payloadLen = 60 - 14 - 20 - 8
)

// env is the bench's world: a two-queue lab, a private bpffs for xlimit's
// pins, a UDP sink on the server, the loaded generator. close undoes all of
// it in reverse order; it is safe to call on a half-built env and twice.
type env struct {
	lab       *lab.Lab
	dir       string
	bpffs     string
	xlimitBin string
	cpus      []int

	srv, cli  *linkReader
	ksoftirqd []int
	sink      *udpSink
	g         *gen.Generator
	frame     []byte // UDP to sinkPort, valid checksums
	frame0    []byte // the same with no UDP checksum, for random sources

	mu       sync.Mutex
	cleanups []func() error
	closed   bool
}

// randomPrefix is where the random-source flood draws its sources (65536
// of them). The traffic never leaves the lab's namespaces.
var randomPrefix = netip.MustParsePrefix("100.64.0.0/16")

// netipZero switches the generator's random sources off.
var netipZero netip.Prefix

func (e *env) onClose(f func() error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cleanups = append(e.cleanups, f)
}

func (e *env) close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	var errs []error
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		errs = append(errs, e.cleanups[i]())
	}
	return errors.Join(errs...)
}

func newEnv(xlimitBin string) (_ *env, err error) {
	e := &env{xlimitBin: xlimitBin}
	defer func() {
		if err != nil {
			err = errors.Join(err, e.close())
		}
	}()
	for c := 0; c < runtime.NumCPU(); c++ {
		e.cpus = append(e.cpus, c)
	}
	if e.ksoftirqd, err = findKsoftirqd(); err != nil {
		return nil, err
	}
	if e.dir, err = os.MkdirTemp("", "xlimit-bench-"); err != nil {
		return nil, err
	}
	e.onClose(func() error { return os.RemoveAll(e.dir) })

	if e.xlimitBin == "" {
		e.xlimitBin = filepath.Join(e.dir, "xlimit")
		out, err := exec.Command("go", "build", "-o", e.xlimitBin, "./cmd/xlimit").CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("build xlimit: %v\n%s", err, out)
		}
	}

	// A private bpffs: xlimit's pins live and die with this run.
	e.bpffs = filepath.Join(e.dir, "bpffs")
	if err := os.MkdirAll(e.bpffs, 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mount("bpf", e.bpffs, "bpf", 0, "mode=0700"); err != nil {
		return nil, fmt.Errorf("mount bpffs: %w", err)
	}
	e.onClose(func() error { return unix.Unmount(e.bpffs, unix.MNT_DETACH) })

	l, err := lab.New(lab.Options{Prefix: "xlb", Queues: len(e.cpus)})
	if err != nil {
		return nil, err
	}
	e.lab = l
	e.onClose(l.Close)

	if e.srv, err = newLinkReader(l.Server, l.ServerIf); err != nil {
		return nil, err
	}
	e.onClose(func() error { e.srv.close(); return nil })
	if e.cli, err = newLinkReader(l.Client, l.ClientIf); err != nil {
		return nil, err
	}
	e.onClose(func() error { e.cli.close(); return nil })

	if e.sink, err = listenSink(l.Server, netip.AddrPortFrom(l.ServerIP4, sinkPort)); err != nil {
		return nil, err
	}
	e.onClose(e.sink.close)

	// As lab.Flood sends it: DF, identification 0, no builder defaults.
	e.frame, err = frame.Build(frame.Spec{
		SrcMAC: l.ClientMAC, DstMAC: l.ServerMAC, Src: l.ClientIP4, Dst: l.ServerIP4, DontFragment: true,
		Proto: frame.ProtoUDP, SrcPort: 40000, DstPort: sinkPort, PayloadLen: payloadLen, Literal: true,
	})
	if err != nil {
		return nil, err
	}
	e.frame0 = append([]byte(nil), e.frame...)
	e.frame0[14+20+6], e.frame0[14+20+7] = 0, 0 // no UDP checksum

	if e.g, err = gen.NewGenerator(l.ClientIndex); err != nil {
		return nil, err
	}
	e.onClose(e.g.Close)
	// The generator attached to the client veth (where only stray frames
	// from the server would run it, and go back) stays in the kernel's XDP
	// dispatcher: without that, every BPF_PROG_TEST_RUN call waits ~25 ms.
	var anchor *gen.Attached
	if err := l.Client.Do(func() error {
		var err error
		anchor, err = e.g.AttachTo(l.ClientIndex)
		return err
	}); err != nil {
		return nil, err
	}
	e.onClose(anchor.Close)
	return e, nil
}

// attachReceiver attaches a reference XDP program to the server veth and
// returns its detach.
func (e *env) attachReceiver(r gen.Receiver) (func() error, error) {
	var a *gen.Attached
	err := e.lab.Server.Do(func() error {
		var err error
		a, err = gen.AttachReceiver(e.lab.ServerIndex, r)
		return err
	})
	if err != nil {
		return nil, err
	}
	return a.Close, nil
}

// udpSink drains a UDP socket in the server namespace (recvmmsg on a
// blocking socket with a receive timeout). It only keeps the socket
// empty; the report counts from /proc/net/snmp.
type udpSink struct {
	fd   int
	stop atomic.Bool
	done chan struct{}
	read atomic.Uint64
}

func listenSink(ns *lab.NS, addr netip.AddrPort) (*udpSink, error) {
	s := &udpSink{fd: -1, done: make(chan struct{})}
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		s.fd = fd
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
			return fmt.Errorf("SO_RCVBUFFORCE: %w", err)
		}
		tv := unix.Timeval{Usec: 100_000}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("SO_RCVTIMEO: %w", err)
		}
		return unix.Bind(fd, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()})
	})
	if err != nil {
		if s.fd >= 0 {
			unix.Close(s.fd)
		}
		return nil, fmt.Errorf("listen udp %s: %w", addr, err)
	}
	go s.loop()
	return s, nil
}

func (s *udpSink) loop() {
	defer close(s.done)
	const batch = 64
	bufs := make([][256]byte, batch)
	iovs := make([]unix.Iovec, batch)
	msgs := make([]unix.Mmsghdr, batch)
	for i := range msgs {
		iovs[i].Base = &bufs[i][0]
		iovs[i].SetLen(len(bufs[i]))
		msgs[i].Hdr.Iov = &iovs[i]
		msgs[i].Hdr.SetIovlen(1)
	}
	for !s.stop.Load() {
		n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&msgs[0])), batch, 0, 0, 0)
		if errno == 0 {
			s.read.Add(uint64(n))
		}
	}
	runtime.KeepAlive(bufs)
}

func (s *udpSink) close() error {
	s.stop.Store(true)
	<-s.done
	return unix.Close(s.fd)
}
