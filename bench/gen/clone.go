//go:build linux

package gen

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Cloner sends frames out of an interface where the kernel refuses live
// frames (LiveFrames): BPF_PROG_TEST_RUN runs xlgen_clone, a TC program,
// on one skb, and each run transmits clones copies of it out of the
// interface through its transmit path (bpf_clone_redirect), so one
// syscall sends runs × clones frames. A veth hands each to its peer, whose
// XDP program sees it on the receive queue of the transmit queue's number.
// The sender's own cost is a clone and a transmit per frame, in the
// calling thread: cheaper than a packet socket's, but above the receiver's
// XDP_DROP.
type Cloner struct {
	prog   *ebpf.Program
	clones int
}

// ClonerOptions configure NewCloner.
type ClonerOptions struct {
	Ifindex int // the interface the frames leave by (in the caller's namespace at Send)
	// Clones is the number of frames each run sends (1 to 256; 0: 64).
	Clones int
	// Queues, when not 0, puts every frame on transmit queue CPU % Queues,
	// the CPU being the sending thread's (pin it); 0 leaves the choice to
	// the kernel (a hash of the flow).
	Queues int
	// Sources, when valid (an IPv4 prefix of at least two addresses),
	// gives every frame a random source within it; the frame must then be
	// IPv4 with a 20-byte header after an untagged Ethernet header and no
	// UDP checksum.
	Sources netip.Prefix
}

// NewCloner loads xlgen_clone for o.
func NewCloner(o ClonerOptions) (*Cloner, error) {
	if o.Ifindex <= 0 {
		return nil, fmt.Errorf("load cloner: invalid ifindex %d", o.Ifindex)
	}
	if o.Clones == 0 {
		o.Clones = 64
	}
	if o.Clones < 1 || o.Clones > 256 || o.Queues < 0 || o.Queues > 256 {
		return nil, fmt.Errorf("load cloner: %d clones (1 to 256), %d queues (0 to 256)", o.Clones, o.Queues)
	}
	vars := map[string]uint32{
		xlgenVarGenIfindex: uint32(o.Ifindex),
		xlgenVarGenClones:  uint32(o.Clones),
		xlgenVarGenQueues:  uint32(o.Queues),
	}
	if o.Sources.IsValid() {
		base, mask, err := sourceRange(o.Sources)
		if err != nil {
			return nil, fmt.Errorf("load cloner: %w", err)
		}
		vars[xlgenVarGenSrcBase], vars[xlgenVarGenSrcMask] = base, mask
	}
	var objs struct {
		Prog *ebpf.Program `ebpf:"xlgen_clone"`
	}
	if err := loadInto("cloner", vars, &objs); err != nil {
		return nil, err
	}
	return &Cloner{prog: objs.Prog, clones: o.Clones}, nil
}

// tcActShot is xlgen_clone's verdict when every copy was sent.
const tcActShot = 2

// Send runs xlgen_clone runs times on frame (at least 14 bytes), sending
// runs × Clones frames, and returns how many it sent. Call it on a thread
// inside the namespace of the interface; a frame the interface refuses (its
// peer's ring full) is counted by the interface, not here. Keep a call to
// a few milliseconds: cilium/ebpf restarts an interrupted run from the
// start.
func (c *Cloner) Send(frame []byte, runs int) (int, error) {
	ret, err := c.prog.Run(&ebpf.RunOptions{Data: frame, Repeat: uint32(runs)})
	if err != nil {
		return 0, fmt.Errorf("send %d×%d frames: %w", runs, c.clones, err)
	}
	if ret != tcActShot {
		return 0, fmt.Errorf("send %d×%d frames: a copy could not be made or sent (verdict %d)", runs, c.clones, int32(ret))
	}
	return runs * c.clones, nil
}

// Close unloads the cloner.
func (c *Cloner) Close() error { return c.prog.Close() }

// OnCPU runs fn with the calling thread pinned to cpu and gives the thread
// its CPUs back afterwards: for a Cloner's Send inside lab.NS.Do, whose
// locked thread returns to the runtime when it is done.
func OnCPU(cpu int, fn func() error) error {
	var all, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		return fmt.Errorf("read the thread's CPUs: %w", err)
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return fmt.Errorf("pin the thread to CPU %d: %w", cpu, err)
	}
	err := fn()
	if rerr := unix.SchedSetaffinity(0, &all); rerr != nil {
		err = errors.Join(err, fmt.Errorf("give the thread its CPUs back: %w", rerr))
	}
	return err
}
