//go:build linux && xlimit_faults

package daemon

import (
	"context"
	"log/slog"
	"time"
)

// SetStallAfter makes the control loop hang after d, to test what a hung
// daemon does to protection (systemd's watchdog, fail-static). Only a
// build with the xlimit_faults tag has it: release binaries cannot hang
// on purpose (nofaults.go).
func SetStallAfter(o *Options, d time.Duration) { o.faults.stallAfter = d }

// faults are the faults a test build may inject into the daemon.
type faults struct {
	stallAfter time.Duration // the loop hangs after this; 0: never
}

// stall is the channel that fires when the loop is to hang; nil: never.
func (f faults) stall() <-chan time.Time {
	if f.stallAfter <= 0 {
		return nil
	}
	return time.After(f.stallAfter)
}

// hang is the loop hanging until ctx ends.
func (f faults) hang(ctx context.Context, log *slog.Logger) {
	log.Warn("test fault injection: the control loop hangs now")
	<-ctx.Done()
}
