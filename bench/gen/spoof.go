//go:build linux

package gen

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
)

// Spoofer runs a receiver on frames from random IPv4 sources without live
// frames: BPF_PROG_TEST_RUN repeats one buffer, xlgen_spoof gives it a new
// random source at each repeat (what a repeat writes stays for the next)
// and tail-calls the receiver. A run of n repeats is n packets from random
// sources, timed by the kernel: the random-source flood's per-packet cost
// where the kernel refuses live frames (LiveFrames), without the
// interface's own cost. The reference is the same Spoofer around
// [NewReceiver]'s XDP_DROP: the difference is the receiver's cost above it.
type Spoofer struct {
	prog *ebpf.Program
	next *ebpf.Map
}

// NewSpoofer loads xlgen_spoof for sources within p (an IPv4 prefix of at
// least two addresses) in front of receiver, an XDP program (it must be
// compatible with a tail call from xlgen_spoof: not an XDP-frags one).
// The caller keeps receiver open while it uses the Spoofer.
func NewSpoofer(receiver *ebpf.Program, p netip.Prefix) (*Spoofer, error) {
	base, mask, err := sourceRange(p)
	if err != nil {
		return nil, fmt.Errorf("load spoofer: %w", err)
	}
	var objs struct {
		Prog *ebpf.Program `ebpf:"xlgen_spoof"`
		Next *ebpf.Map     `ebpf:"xlgen_next"`
	}
	if err := loadInto("spoofer", map[string]uint32{xlgenVarGenSrcBase: base, xlgenVarGenSrcMask: mask}, &objs); err != nil {
		return nil, err
	}
	s := &Spoofer{prog: objs.Prog, next: objs.Next}
	if err := s.next.Put(uint32(0), receiver); err != nil {
		s.Close()
		return nil, fmt.Errorf("load spoofer: put receiver: %w", err)
	}
	return s, nil
}

// Run runs the receiver on n packets made from frame (IPv4 after an
// untagged Ethernet header, a 20-byte IP header), each from a random
// source, and returns the receiver's last verdict and the kernel's mean
// time per packet (xlgen_spoof's few instructions and the tail call
// included, as in the reference's).
func (s *Spoofer) Run(frame []byte, n int) (uint32, time.Duration, error) {
	ret, d, err := s.prog.Benchmark(frame, n, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("run spoofer (%d packets): %w", n, err)
	}
	if ret == 0 { // XDP_ABORTED: the frame was refused or the slot empty
		return 0, 0, fmt.Errorf("run spoofer: aborted (a frame that is not plain IPv4, or no receiver)")
	}
	return ret, d, nil
}

// Close unloads the spoofer (not its receiver).
func (s *Spoofer) Close() error {
	return errors.Join(s.prog.Close(), s.next.Close())
}

// NewReceiver loads the reference receiver r, unattached: for a Spoofer,
// or a test run. The caller closes it.
func NewReceiver(r Receiver) (*ebpf.Program, error) {
	spec, err := loadXlgen()
	if err != nil {
		return nil, fmt.Errorf("load receiver spec: %w", err)
	}
	name := xlgenProgXlgenDrop
	if r == ReceiverPass {
		name = xlgenProgXlgenPass
	} else if r != ReceiverDrop {
		return nil, fmt.Errorf("load receiver: unknown %v", r)
	}
	prog, err := ebpf.NewProgram(spec.Programs[name])
	if err != nil {
		return nil, fmt.Errorf("load %v: %w", r, err)
	}
	return prog, nil
}
