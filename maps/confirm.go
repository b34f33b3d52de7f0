//go:build linux

package maps

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// A change of rules waiting for its confirmation (`xlimit apply
// --confirm`) is kept by the kernel, not only by the daemon: xl_gen
// carries genConfirm, and xl_confirm the deadline and the generation to
// return to (bpf/gen.h). From the deadline every program uses that
// generation, whether a daemon runs or not. Until the change is confirmed
// or settled, nothing writes that generation: every write of a generation
// (Apply, ApplyConfirm) first settles a pending change by going back to
// it, so that the generation written is never the one in force.

// genConfirm is XL_GEN_CONFIRM: xl_gen's flag of a pending confirmation.
const genConfirm = 1 << 31

// ErrConfirmExpired is returned by Confirm once the deadline has passed:
// the kernel has gone back to the previous rules already.
var ErrConfirmExpired = errors.New("the confirmation deadline has passed; the previous rules are in force")

// Pending is a change of rules waiting for its confirmation.
type Pending struct {
	DeadlineNS uint64 // CLOCK_MONOTONIC (bpf_ktime_get_ns) time of the return
	Gen        uint32 // the generation of the previous rules
	Expired    bool   // the deadline has passed: the kernel runs Gen
}

// MonotonicNS reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns: the
// clock of every deadline the daemon writes for the programs.
func MonotonicNS() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}

// now is the time the kernel's deadlines compare with: the fake clock
// when one is set (tests), else CLOCK_MONOTONIC.
func (t *Tables) now() uint64 {
	if t.fakeClock && t.clock != nil {
		var ns uint64
		if err := t.clock.Lookup(uint32(0), &ns); err == nil {
			return ns
		}
	}
	return MonotonicNS()
}

// rawGen is xl_gen as stored, flag included.
func (t *Tables) rawGen() (uint32, error) {
	var g uint32
	if err := t.gen.Lookup(uint32(0), &g); err != nil {
		return 0, fmt.Errorf("read active generation: %w", err)
	}
	return g, nil
}

// Pending reports the change of rules waiting for its confirmation, if
// any.
func (t *Tables) Pending() (Pending, bool, error) {
	raw, err := t.rawGen()
	if err != nil || raw&genConfirm == 0 || t.confirm == nil {
		return Pending{}, false, err
	}
	var w xdpXlConfirmWait
	if err := t.confirm.Lookup(uint32(0), &w); err != nil {
		return Pending{}, false, fmt.Errorf("read the pending confirmation: %w", err)
	}
	return Pending{DeadlineNS: w.DeadlineNs, Gen: w.Gen & 1, Expired: t.now() >= w.DeadlineNs}, true, nil
}

// effective is xl_gen's value as the programs apply it now (bpf/gen.h).
func (t *Tables) effective() (uint32, error) {
	raw, err := t.rawGen()
	if err != nil {
		return 0, err
	}
	p, ok, err := t.Pending()
	if err != nil {
		return 0, err
	}
	if ok && p.Expired {
		return raw&^(genConfirm|1) | p.Gen, nil
	}
	return raw, nil
}

// Revert goes back to the generation of a pending change's previous
// rules, at once, and ends the wait; the kernel may have done so already
// (past the deadline), and then nothing changes for the programs. It
// reports whether a change was pending.
func (t *Tables) Revert() (bool, error) {
	raw, err := t.rawGen()
	if err != nil {
		return false, err
	}
	p, ok, err := t.Pending()
	if err != nil || !ok {
		return false, err
	}
	next := raw&^genConfirm + 1
	if next&1 != p.Gen {
		next++
	}
	if err := t.gen.Update(uint32(0), next, ebpf.UpdateAny); err != nil {
		return true, fmt.Errorf("go back to generation %d: %w", p.Gen, err)
	}
	return true, nil
}

// Confirm ends the wait of a pending change: its rules stay. Past the
// deadline it changes nothing and returns ErrConfirmExpired (the kernel
// is back to the previous rules, and the caller reverts).
func (t *Tables) Confirm() error {
	raw, err := t.rawGen()
	if err != nil {
		return err
	}
	p, ok, err := t.Pending()
	if err != nil || !ok {
		return err
	}
	if p.Expired {
		return ErrConfirmExpired
	}
	if err := t.gen.Update(uint32(0), raw&^genConfirm, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("confirm generation %d: %w", raw&1, err)
	}
	return nil
}

// ApplyConfirm is Apply for a change that waits for its confirmation:
// from deadlineNS (CLOCK_MONOTONIC) the programs go back to the rules in
// force now, on their own, unless Confirm comes first. A change already
// pending is settled first (back to its previous rules, which stay the
// ones to return to): the generation written is never the one in force,
// nor the one to return to.
func (t *Tables) ApplyConfirm(p *dataplane.Plan, deadlineNS uint64) error {
	if t.confirm == nil {
		return errors.New("apply with a confirmation: no xl_confirm map")
	}
	if deadlineNS == 0 {
		return errors.New("apply with a confirmation: no deadline")
	}
	return t.apply(p, deadlineNS)
}
