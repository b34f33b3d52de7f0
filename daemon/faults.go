//go:build linux && xlimit_faults

package daemon

import "time"

// SetStallAfter makes the control loop hang after d, to test what a hung
// daemon does to protection (systemd's watchdog, fail-static). Only a
// build with the xlimit_faults tag has it: release binaries cannot hang
// on purpose.
func SetStallAfter(o *Options, d time.Duration) { o.stallAfter = d }
