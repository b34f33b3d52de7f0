// Package control holds xlimit's control laws: the pure functions and small
// state machines that the daemon's 50 ms loop runs to decide each rule's
// rate (docs/design.md §5).
//
//   - WarmUp is Sentinel's WarmUpController (§5.2), driven by the kernel's
//     per-second passed counts instead of Sentinel's request counters.
//   - Paced is Sentinel's ThrottlingController admission test (§5.3) in the
//     kernel's time units (2^-6 ns), and the reference model that the
//     queue: none bucket reproduces packet for packet.
//   - AIMD is the adaptive law of §5.4 on the smoothed queueing latency.
//
// Nothing here reads a clock, a file or the kernel: every input, time
// included, is an argument, so the laws are tested against golden numbers
// without root and without sleeping. Clock is the small interface the
// daemon uses to obtain those times. docs/control.md documents the
// arithmetic, the golden numbers and the measured hunting of the AIMD loop.
package control

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every error that a constructor returns for a
// parameter outside its domain.
var ErrInvalid = errors.New("invalid control parameter")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrInvalid)
}
