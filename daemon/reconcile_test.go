package daemon

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

type fakeReconciler struct {
	fix map[int]int64
	err error
}

func (f fakeReconciler) ReconcileRequests() (map[int]int64, error) { return f.fix, f.err }

// The reconciliation logs its corrections at debug, a failure as a
// warning, and nothing for pins from before the request count.
func TestReconcileOne(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reconcileOne("eth0", fakeReconciler{err: maps.ErrNoRequests}, log)
	if buf.Len() != 0 {
		t.Errorf("pins without the count logged %q", buf.String())
	}
	reconcileOne("eth0", fakeReconciler{fix: map[int]int64{3: -65664}}, log)
	if s := buf.String(); !strings.Contains(s, "slot=3") || !strings.Contains(s, "correction=-65664") {
		t.Errorf("correction not logged: %q", s)
	}
	buf.Reset()
	reconcileOne("eth0", fakeReconciler{err: errors.New("boom")}, log)
	if s := buf.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "boom") {
		t.Errorf("failure not logged as a warning: %q", s)
	}
}

// TestCountsRequests: an interface is swept only while a rule of its plan
// has its response time (and requests) followed by the kernel.
func TestCountsRequests(t *testing.T) {
	var p dataplane.Plan
	if countsRequests(nil) || countsRequests(&p) {
		t.Error("no plan, or a plan without response-time rules: swept")
	}
	p.Globals.RespTime = 1 << 3
	if !countsRequests(&p) {
		t.Error("a plan with a response-time rule: not swept")
	}
}
