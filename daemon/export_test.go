//go:build linux

package daemon

// SetBeforePrepare makes f run where a document that arrives while the
// daemon runs is prepared (tests: a document that takes its time).
func SetBeforePrepare(o *Options, f func()) { o.beforePrepare = f }
