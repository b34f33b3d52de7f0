//go:build linux && !xlimit_faults

package daemon

import (
	"context"
	"log/slog"
	"time"
)

// faults are empty in a build without the xlimit_faults tag (faults.go):
// the loop's stall channel is nil, and it never hangs on purpose.
type faults struct{}

func (faults) stall() <-chan time.Time { return nil }

func (faults) hang(context.Context, *slog.Logger) {}
