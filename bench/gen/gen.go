//go:build linux

// Package gen loads the benchmark's traffic generator (xlgen.c beside it), an
// XDP program that BPF_PROG_TEST_RUN runs in live-frames mode
// (BPF_F_TEST_XDP_LIVE_FRAMES, Linux ≥ 5.18) and that redirects every frame
// out of an interface, as the kernel's samples/bpf xdp_trafficgen does; and
// the two one-line reference receivers, XDP_DROP and XDP_PASS. It is not
// part of the data plane: only bench/ uses it.
//
// The kernel resolves the interface index in the network namespace of the
// thread that calls [Generator.Run], so call it from a thread inside the
// interface's namespace (lab.NS.Do). The frames leave on the CPU that runs
// Run; a veth hands them to the peer's receive queue of that CPU's number
// (modulo the queue count) and the peer processes them in that CPU's
// softirq, so one generator thread pinned to each CPU loads every queue.
// A veth accepts redirected frames only while its peer has NAPI enabled:
// an XDP program attached to the peer (any, even [ReceiverPass]) or GRO on.
package gen

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Generator is the loaded generator program.
type Generator struct {
	objs xlgenObjects
}

// NewGenerator loads the generator for frames that leave on ifindex (in
// the namespace of the thread that calls Run).
func NewGenerator(ifindex int) (*Generator, error) {
	if ifindex <= 0 {
		return nil, fmt.Errorf("load generator: invalid ifindex %d", ifindex)
	}
	var g Generator
	if err := loadInto("generator", map[string]uint32{xlgenVarGenIfindex: uint32(ifindex)}, &g.objs); err != nil {
		return nil, err
	}
	return &g, nil
}

// loadInto loads what objs names from xlgen.c's collection (objs: a
// struct of cilium/ebpf's tags, as LoadAndAssign takes), with vars set
// first (load-time constants, initial .bss values); what names it in
// errors ("generator", "spoofer", ...).
func loadInto(what string, vars map[string]uint32, objs any) error {
	spec, err := loadXlgen()
	if err != nil {
		return fmt.Errorf("load %s spec: %w", what, err)
	}
	for name, v := range vars {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("load %s: set %s: %w", what, name, err)
		}
	}
	if err := spec.LoadAndAssign(objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("load %s: %+v", what, ve)
		}
		return fmt.Errorf("load %s: %w", what, err)
	}
	return nil
}

// SetRandomSources makes every frame sent from now on carry a random
// source address within p, an IPv4 prefix; an invalid (zero) p switches it
// off. The frames must then be IPv4 with a 20-byte header right after an
// untagged Ethernet header and carry no UDP checksum (0): only the IPv4
// header checksum is recomputed. Other frames are dropped (XDP_ABORTED).
func (g *Generator) SetRandomSources(p netip.Prefix) error {
	var base, mask uint32
	if p.IsValid() {
		var err error
		if base, mask, err = sourceRange(p); err != nil {
			return err
		}
	}
	// Mask first: no frame sees the new base with the old mask's host bits.
	if err := g.objs.GenSrcMask.Set(uint32(0)); err != nil {
		return fmt.Errorf("set random sources: %w", err)
	}
	if err := g.objs.GenSrcBase.Set(base); err != nil {
		return fmt.Errorf("set random sources: %w", err)
	}
	if err := g.objs.GenSrcMask.Set(mask); err != nil {
		return fmt.Errorf("set random sources: %w", err)
	}
	return nil
}

// sourceRange is the base address and the mask of the host bits of p, an
// IPv4 prefix of at least two addresses, in host byte order.
func sourceRange(p netip.Prefix) (base, mask uint32, err error) {
	if !p.IsValid() || !p.Addr().Is4() {
		return 0, 0, fmt.Errorf("random sources %s: only IPv4", p)
	}
	p = p.Masked()
	a := p.Addr().As4()
	base = uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	mask = uint32(uint64(1)<<(32-p.Bits()) - 1)
	if mask == 0 {
		return 0, 0, fmt.Errorf("random sources %s: a single address; send it as the frame's source", p)
	}
	return base, mask, nil
}

// DefaultBatch is the kernel's default batch in live-frames mode: frames
// run, then flushed to the interface, per batch (at most 256).
const DefaultBatch = 64

// Run sends frame n times: the kernel runs the program on n fresh copies of
// frame and transmits each, in batches of batch frames (0: DefaultBatch).
// Each call costs the kernel some setup (a page pool; and unless the
// program is attached somewhere, see AttachTo, adding it to and removing it
// from the XDP dispatcher, which waits for two RCU grace periods: about
// 25 ms per call on an idle machine). Keep a call to a few milliseconds:
// cilium/ebpf restarts an interrupted run from the start. A frame that the interface refuses (its
// queue full) is dropped and counted by the interface, not here.
//
// Run must be called on a thread inside the namespace of Options.Ifindex.
func (g *Generator) Run(frame []byte, n, batch uint32) error {
	if n == 0 {
		return nil
	}
	if batch == 0 {
		batch = DefaultBatch
	}
	_, err := g.objs.XlgenTx.Run(&ebpf.RunOptions{
		Data:      frame,
		Repeat:    n,
		Flags:     unix.BPF_F_TEST_XDP_LIVE_FRAMES,
		BatchSize: batch,
	})
	if err != nil {
		return fmt.Errorf("run generator (%d frames): %w", n, err)
	}
	return nil
}

// LiveFrames reports whether this kernel runs XDP programs in live-frames
// mode: it runs the XDP_DROP receiver once that way (the frame is
// dropped, nothing is sent). nil, or why not: a kernel may refuse the mode
// (EPERM) although it has it, as some VMs' do.
func LiveFrames() error {
	prog, err := NewReceiver(ReceiverDrop)
	if err != nil {
		return err
	}
	defer prog.Close()
	frame := make([]byte, 64)
	if _, err := prog.Run(&ebpf.RunOptions{Data: frame, Repeat: 1, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES}); err != nil {
		return fmt.Errorf("run %v in live-frames mode: %w", ReceiverDrop, err)
	}
	return nil
}

// Close unloads the generator.
func (g *Generator) Close() error { return g.objs.Close() }

// Receiver is a one-line reference XDP program.
type Receiver int

const (
	ReceiverDrop Receiver = iota // XDP_DROP: the cheapest possible receiver
	ReceiverPass                 // XDP_PASS: no filter, the stack gets every frame
)

func (r Receiver) String() string {
	switch r {
	case ReceiverDrop:
		return "xdp_drop"
	case ReceiverPass:
		return "xdp_pass"
	}
	return fmt.Sprintf("receiver(%d)", int(r))
}

// Attached is a reference receiver attached to an interface; Close detaches
// it. Nothing is pinned: the program goes away with the process.
type Attached struct {
	prog *ebpf.Program
	link link.Link
}

// AttachReceiver attaches r to ifindex in native (driver) mode. Call it
// from a thread inside the interface's namespace.
func AttachReceiver(ifindex int, r Receiver) (*Attached, error) {
	prog, err := NewReceiver(r)
	if err != nil {
		return nil, err
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: link.XDPDriverMode})
	if err != nil {
		prog.Close()
		return nil, fmt.Errorf("attach %v to ifindex %d: %w", r, ifindex, err)
	}
	return &Attached{prog: prog, link: l}, nil
}

// Close detaches and unloads the receiver.
func (a *Attached) Close() error {
	err := a.link.Close()
	if a.prog != nil {
		err = errors.Join(err, a.prog.Close())
	}
	return err
}

// AttachTo attaches the generator itself to ifindex in native mode, where
// it is never meant to run: it keeps the program in the kernel's XDP
// dispatcher, so that Run does not add and remove it (and wait for two RCU
// grace periods) on every call. Call it inside the interface's namespace.
func (g *Generator) AttachTo(ifindex int) (*Attached, error) {
	l, err := link.AttachXDP(link.XDPOptions{Program: g.objs.XlgenTx, Interface: ifindex, Flags: link.XDPDriverMode})
	if err != nil {
		return nil, fmt.Errorf("attach generator to ifindex %d: %w", ifindex, err)
	}
	return &Attached{link: l}, nil
}
