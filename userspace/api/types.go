package api

import (
	"errors"
	"fmt"
	"math"

	"github.com/xlimit/xlimit/userspace/config"
)

// StatusReport is the schema of `GET /v1/status` and of
// `xlimit status --json`: the rules, rates in force and counters of every
// protected interface.
type StatusReport struct {
	Interfaces []IfaceStatus `json:"interfaces"`
	Fleet      *FleetStatus  `json:"fleet,omitempty"` // with --fleet
}

// IfaceStatus is one interface of a StatusReport.
type IfaceStatus struct {
	Iface      string `json:"iface"`
	PinDir     string `json:"pin_dir"`
	Attached   bool   `json:"attached"`
	Ifindex    int    `json:"ifindex,omitempty"`
	ProgramID  uint32 `json:"program_id,omitempty"`
	LinkID     uint32 `json:"link_id,omitempty"`
	Generation uint32 `json:"generation"`
	// CountersReadNS is when the counters were read (CLOCK_MONOTONIC, ns):
	// rates from two reports divide by the difference of these, never by
	// the time between the requests.
	CountersReadNS uint64        `json:"counters_read_ns,omitempty"`
	Rules          []RuleStatus  `json:"rules"`
	Total          CounterStatus `json:"total"`
	// Memory is the kernel memory of the interface's maps.
	Memory *MemoryStatus `json:"memory,omitempty"`
	// HostAddrs is what the host-address map (xl_host_addrs) holds.
	HostAddrs *HostAddrsStatus `json:"host_addrs,omitempty"`
	// Preflight is what the driver's preflight decided when the running
	// daemon attached (loader/preflight); nil without a daemon.
	Preflight *PreflightStatus `json:"preflight,omitempty"`
	// Dispatcher is the id of libxdp's dispatcher when xlimit shares the
	// interface through it (--xdp-share), and XDPPrograms its slots in
	// the order they run.
	Dispatcher  uint32       `json:"dispatcher,omitempty"`
	XDPPrograms []XDPProgram `json:"xdp_programs,omitempty"`
}

// PreflightStatus is the driver's preflight of an interface
// (docs/kernels.md, "Drivers: the preflight").
type PreflightStatus struct {
	// XDPTx: the program may send frames back (XDP_TX). False: it was
	// loaded without, so SYN cookies are the kernel's and refused SYNs are
	// dropped without a reset.
	XDPTx    bool     `json:"xdp_tx"`
	Native   bool     `json:"native"`   // native mode expected to attach
	Findings []string `json:"findings"` // level: rule: what; to change: fix
}

// XDPProgram is one slot of the libxdp dispatcher on an interface.
type XDPProgram struct {
	Slot     int    `json:"slot"`
	ID       uint32 `json:"id"`
	Name     string `json:"name"`
	Priority uint32 `json:"priority"`
	// ChainActions are the verdicts after which the next slot runs.
	ChainActions []string `json:"chain_actions"`
	Xlimit       bool     `json:"xlimit,omitempty"`
}

// HostAddrsStatus is what an interface's xl_host_addrs holds: the host's
// addresses the answering policy knows (docs/dataplane.md, "The host's own
// addresses").
type HostAddrsStatus struct {
	Listed int `json:"listed"` // addresses, the attached interface's MAC included
	// Incomplete: the map does not list every address of the host (more
	// than it holds, or the daemon could not read them); the daemon's
	// xlimit_host_addrs_unlisted says how many are left out.
	Incomplete bool `json:"incomplete"`
	// Unmaintained: no daemon's lease on the map is running (the daemon
	// is stopped or crashed): the program trusts none of it and leaves
	// the SYNs it would answer by it to the kernel (docs/robustness.md).
	Unmaintained bool `json:"unmaintained,omitempty"`
}

// RuleStatus is one rule of an interface.
type RuleStatus struct {
	Slot       int           `json:"slot"`
	Name       string        `json:"name"`
	Unit       string        `json:"unit"`
	Rate       float64       `json:"rate"`
	Burst      float64       `json:"burst"`
	RateSource string        `json:"rate_source"` // static | control
	Shadow     bool          `json:"shadow"`
	Counters   CounterStatus `json:"counters"`
	// PerSource is the per-source limit, with the sources dropped most.
	PerSource *PerSourceStatus `json:"per_source,omitempty"`
	// Concurrency is the concurrency limit and the connections in flight.
	Concurrency *ConcurrencyStatus `json:"concurrency,omitempty"`
	// Breaker is the circuit breaker's gate on new connections as the
	// kernel applies it: "open" (all refused), "half_open" (probes pass);
	// empty when no gate is in force.
	Breaker string `json:"breaker,omitempty"`
	// SynCookies is the rule's SYN cookie mode and counters (rules with
	// syn_cookies auto or always).
	SynCookies *SynCookieStatus `json:"syn_cookies,omitempty"`
}

// SynCookieStatus is what a rule's SYN cookies did (docs/dataplane.md,
// "SYN cookies"), the slot's counters summed over CPUs like the rule's
// others: counted by XDP (sent, and the SYNs not answered, by why) and by
// the TC program that checks the returning ACKs (validated, failed,
// refused, assign_failed). SYNs for a 4-tuple the host already has a
// socket for are passed to it (to_socket).
type SynCookieStatus struct {
	Mode         string `json:"mode"`          // auto | always
	Sent         uint64 `json:"sent"`          // SYN-ACKs with a cookie sent
	Validated    uint64 `json:"validated"`     // ACKs with a valid cookie, charged and handed to the listener
	Failed       uint64 `json:"failed"`        // ACKs to the listener whose cookie was not valid
	Refused      uint64 `json:"refused"`       // valid cookies the rule refused (its rate, its gates)
	AssignFailed uint64 `json:"assign_failed"` // valid and admitted, but the kernel refused to create the socket
	OverBudget   uint64 `json:"over_budget"`   // SYNs not answered: the host's answer budget was spent
	NotLocal     uint64 `json:"not_local"`     // SYNs not answered: not to one of the host's addresses
	Unanswerable uint64 `json:"unanswerable"`  // SYNs not answered: IP options, extension headers, a cut header
	ToSocket     uint64 `json:"to_socket"`     // SYNs not answered but passed: the host had a socket for their 4-tuple (TIME_WAIT, open)
}

// ConcurrencyStatus is a rule's concurrency limit and the connections in
// flight that the kernel counted.
type ConcurrencyStatus struct {
	Soft     int   `json:"soft"`
	Max      int   `json:"max"`
	InFlight int64 `json:"in_flight"`
}

// PerSourceStatus is a rule's per-source limit and its most dropped
// sources.
type PerSourceStatus struct {
	Rate       float64        `json:"rate"`
	Burst      float64        `json:"burst"`
	PrefixV4   int            `json:"prefix_v4"`
	PrefixV6   int            `json:"prefix_v6"`
	Ban        bool           `json:"ban"`
	TopSources []SourceStatus `json:"top_sources"`
}

// SourceStatus is one source prefix of a per-source limit.
type SourceStatus struct {
	Prefix string `json:"prefix"`
	Drops  uint64 `json:"drops"`
	Banned bool   `json:"banned"`
}

// CounterStatus holds counters summed over CPUs: packets and bytes by
// verdict (pass, drop, would_drop) and packets by reason (non-zero ones).
type CounterStatus struct {
	Packets map[string]uint64 `json:"packets"`
	Bytes   map[string]uint64 `json:"bytes"`
	Reasons map[string]uint64 `json:"reasons"`
}

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
