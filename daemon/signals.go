//go:build linux

package daemon

import (
	"time"

	"github.com/xlimit/xlimit/userspace/control"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
)

// loopSignals hands the control loop the signal readers' view of each
// steered rule.
type loopSignals struct {
	reader   *xsignal.Reader
	outcomes *xsignal.OutcomeReader
	rules    map[string]*xsignal.Rule // of the specs in force; the loop goroutine's
}

func (s *loopSignals) rule(r *control.RuleSpec) *xsignal.Rule {
	if sr := s.rules[r.Name]; sr != nil {
		return sr
	}
	return &xsignal.Rule{Name: r.Name, SynOnly: r.SynOnly, Bytes: r.Bytes}
}

// Sample implements control.Sampler.
func (s *loopSignals) Sample(r *control.RuleSpec, used float64) control.Signals {
	return s.reader.Sample(s.rule(r), used)
}

// Outcomes implements control.OutcomeSource.
func (s *loopSignals) Outcomes(r *control.RuleSpec, admitted uint64, now time.Time) (control.Outcomes, bool) {
	return s.outcomes.Outcomes(s.rule(r), admitted, now)
}
