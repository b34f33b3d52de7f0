//go:build linux && xlimit_faults

package main

import (
	"github.com/spf13/pflag"

	"github.com/xlimit/xlimit/daemon"
)

// The test build's fault injection: `make e2e` builds with -tags
// xlimit_faults; release binaries have no such flag.
func init() {
	runFlagHooks = append(runFlagHooks, func(fs *pflag.FlagSet, o *daemon.Options) func() {
		stall := fs.Duration("test-stall-loop-after", 0, "fault injection for tests: hang the control loop after this long")
		_ = fs.MarkHidden("test-stall-loop-after")
		return func() { daemon.SetStallAfter(o, *stall) }
	})
}
