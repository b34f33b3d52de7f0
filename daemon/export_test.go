//go:build linux

package daemon

// SetBeforePrepare makes f run where a document that arrives while the
// daemon runs is prepared (tests: a document that takes its time).
func SetBeforePrepare(o *Options, f func()) { o.beforePrepare = f }

// SetRevertFault makes every attempt to revert fail with f's error while f
// returns one (tests: a revert that fails and is retried).
func SetRevertFault(o *Options, f func() error) { o.revertFault = f }
