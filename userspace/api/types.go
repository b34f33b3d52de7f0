package api

import (
	"errors"
	"fmt"
	"math"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/status"
)

// The status schema lives in userspace/status; these are its names in the
// API's vocabulary, for the API's callers.
type (
	StatusReport      = status.Report
	IfaceStatus       = status.Iface
	PreflightStatus   = status.Preflight
	HostAddrsStatus   = status.HostAddrs
	RuleStatus        = status.Rule
	SynCookieStatus   = status.SynCookies
	ConcurrencyStatus = status.Concurrency
	PerSourceStatus   = status.PerSource
	SourceStatus      = status.Source
	CounterStatus     = status.Counters
	MemoryStatus      = status.Memory
	FleetStatus       = status.Fleet
	FleetRuleStatus   = status.FleetRule
	MapMemory         = status.MapMemory
	XDPProgram        = status.XDPProgram
)

// RulesDocument is the answer of `GET /v1/rules`: the rules text in force,
// where it came from and its SHA-256 (hex), which is also the ETag that
// `PUT /v1/rules` accepts in If-Match.
type RulesDocument struct {
	Source string `json:"source"`
	SHA256 string `json:"sha256"`
	Text   string `json:"text"`
}

// RulesApplied is the answer of a successful `PUT /v1/rules`.
type RulesApplied struct {
	Applied    bool     `json:"applied"`
	SHA256     string   `json:"sha256"`
	Rules      []string `json:"rules"`                // rule names, in file order
	Interfaces []string `json:"interfaces,omitempty"` // the document's 'interfaces' (the daemon's --iface wins)
	Warnings   []string `json:"warnings,omitempty"`   // "api:LINE: field: problem"
}

// ErrorResponse is the body of every non-2xx answer.
type ErrorResponse struct {
	Error string `json:"error"`
	// Errors lists every problem of a rejected rules document, one
	// "api:LINE: field: problem" each.
	Errors []string `json:"errors,omitempty"`
}

// Feedback is what a protected service posts to `POST /v1/feedback`: its
// own view of the load behind a rule, for rules whose adaptive signal is
// "feedback". Requests and Errors count what the service handled since its
// previous post; QueueingDelayMS is the queueing time (not the business
// time) of the requests it admitted, in milliseconds.
type Feedback struct {
	Rule            string  `json:"rule"`
	QueueingDelayMS float64 `json:"queueing_delay_ms"`
	Errors          int64   `json:"errors"`
	Requests        int64   `json:"requests"`
}

// MaxQueueingDelayMS bounds Feedback.QueueingDelayMS (one hour): a larger
// value is a unit mistake, not a measurement.
const MaxQueueingDelayMS = 3_600_000

// Validate checks a Feedback's fields (not whether the rule exists).
func (f *Feedback) Validate() error {
	var errs []error
	if err := checkRuleName(f.Rule); err != nil {
		errs = append(errs, fmt.Errorf("rule: %w", err))
	}
	switch d := f.QueueingDelayMS; {
	case math.IsNaN(d) || math.IsInf(d, 0):
		errs = append(errs, errors.New("queueing_delay_ms: not a finite number"))
	case d < 0:
		errs = append(errs, fmt.Errorf("queueing_delay_ms: %v is negative", d))
	case d > MaxQueueingDelayMS:
		errs = append(errs, fmt.Errorf("queueing_delay_ms: %v is over an hour (the unit is milliseconds)", d))
	}
	if f.Requests < 0 {
		errs = append(errs, fmt.Errorf("requests: %d is negative", f.Requests))
	}
	if f.Errors < 0 {
		errs = append(errs, fmt.Errorf("errors: %d is negative", f.Errors))
	} else if f.Errors > f.Requests && f.Requests >= 0 {
		errs = append(errs, fmt.Errorf("errors: %d is more than requests (%d)", f.Errors, f.Requests))
	}
	return errors.Join(errs...)
}

// checkRuleName accepts what the rules file accepts as a rule name:
// [a-z0-9_-], 1 to 31 characters.
func checkRuleName(name string) error {
	if name == "" {
		return errors.New("missing")
	}
	if len(name) > config.MaxRuleNameLen {
		return fmt.Errorf("longer than %d characters", config.MaxRuleNameLen)
	}
	for _, c := range []byte(name) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return fmt.Errorf("%q is not a rule name ([a-z0-9_-]+)", name)
		}
	}
	return nil
}
