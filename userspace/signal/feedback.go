package signal

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// FeedbackMaxAge is how long a service's last report stays fresh; after
// that the rule's signal is stale and the loop holds its rate.
const FeedbackMaxAge = time.Second

// ErrNotSteered is returned for a report on a rule that is not steered by
// `signal: feedback`.
var ErrNotSteered = errors.New("not steered by feedback")

// Feedback keeps the latest report of each service steered by `signal:
// feedback` (the API's POST /v1/feedback). Reports arrive on API
// goroutines and are read by the loop's.
type Feedback struct {
	mu      sync.Mutex
	steered map[string]bool
	last    map[string]FeedbackReport
}

// FeedbackReport is a service's own account of itself.
type FeedbackReport struct {
	Delay    time.Duration // its queueing delay
	ErrRate  float64       // errors per request since its previous report
	HasRate  bool          // it reported requests
	Received time.Time
}

// NewFeedback returns an empty store that takes no rule's reports.
func NewFeedback() *Feedback {
	return &Feedback{steered: map[string]bool{}, last: map[string]FeedbackReport{}}
}

// Configure sets the rules that take feedback; the reports of others go.
func (f *Feedback) Configure(rules []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steered = make(map[string]bool, len(rules))
	for _, name := range rules {
		f.steered[name] = true
	}
	for name := range f.last {
		if !f.steered[name] {
			delete(f.last, name)
		}
	}
}

// Put takes a report: the service's queueing delay, and the errors and
// requests it saw since its previous report.
func (f *Feedback) Put(rule string, delay time.Duration, errs, requests int64, now time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.steered[rule] {
		return fmt.Errorf("rule %s: %w", rule, ErrNotSteered)
	}
	rep := FeedbackReport{Delay: delay, Received: now}
	if requests > 0 {
		rep.ErrRate, rep.HasRate = float64(errs)/float64(requests), true
	}
	f.last[rule] = rep
	return nil
}

// Get returns the rule's latest report if it is fresh.
func (f *Feedback) Get(rule string, now time.Time) (FeedbackReport, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rep, ok := f.last[rule]
	return rep, ok && now.Sub(rep.Received) <= FeedbackMaxAge
}
