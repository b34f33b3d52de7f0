//go:build linux

package gen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// frameMax is xlgen.c's XLGEN_FRAME_MAX: the longest frame a Resyn puts
// back.
const frameMax = 128

// Resyn runs a receiver that rewrites its frame (a SYN answered with a
// cookie becomes the SYN-ACK) on the same frame again and again, without a
// syscall per packet: BPF_PROG_TEST_RUN repeats one buffer, xlgen_resyn
// puts the frame back into it at each repeat and tail-calls the receiver.
// A run of n repeats is n answers, timed by the kernel. The reference is
// the same Resyn around [NewReceiver]'s XDP_DROP: the difference is the
// receiver's cost above a drop.
type Resyn struct {
	prog         *ebpf.Program
	next, frames *ebpf.Map
}

// NewResyn loads xlgen_resyn in front of receiver (an XDP program that a
// tail call from xlgen_resyn may reach: of attach type XDP, as an ELF
// section "xdp" gives, and not an XDP-frags one), putting
// frame back at every repeat (at most 128 bytes). The caller keeps
// receiver open while it uses the Resyn.
func NewResyn(receiver *ebpf.Program, frame []byte) (*Resyn, error) {
	if len(frame) < 14 || len(frame) > frameMax {
		return nil, fmt.Errorf("load resyn: a frame of %d bytes (14 to %d)", len(frame), frameMax)
	}
	var objs struct {
		Prog   *ebpf.Program `ebpf:"xlgen_resyn"`
		Next   *ebpf.Map     `ebpf:"xlgen_next"`
		Frames *ebpf.Map     `ebpf:"xlgen_frames"`
	}
	if err := loadInto("resyn", nil, &objs); err != nil {
		return nil, err
	}
	r := &Resyn{prog: objs.Prog, next: objs.Next, frames: objs.Frames}
	v := make([]byte, 4+frameMax)
	binary.LittleEndian.PutUint32(v, uint32(len(frame)))
	copy(v[4:], frame)
	if err := objs.Frames.Put(uint32(0), v); err != nil {
		r.Close()
		return nil, fmt.Errorf("load resyn: put frame: %w", err)
	}
	if err := objs.Next.Put(uint32(0), receiver); err != nil {
		r.Close()
		return nil, fmt.Errorf("load resyn: put receiver: %w", err)
	}
	return r, nil
}

// Run runs the receiver n times on the frame, put back before each, and
// returns the receiver's last verdict and the kernel's mean time per
// packet (xlgen_resyn's restore and the tail call included, as in the
// reference's).
func (r *Resyn) Run(n int) (uint32, time.Duration, error) {
	in := make([]byte, frameMax) // overwritten by the first restore
	ret, d, err := r.prog.Benchmark(in[:64], n, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("run resyn (%d packets): %w", n, err)
	}
	if ret == 0 { // XDP_ABORTED
		return 0, 0, fmt.Errorf("run resyn: aborted (the frame could not be put back, or no receiver)")
	}
	return ret, d, nil
}

// Close unloads the resyn program and its maps (not its receiver).
func (r *Resyn) Close() error {
	return errors.Join(r.prog.Close(), r.next.Close(), r.frames.Close())
}
