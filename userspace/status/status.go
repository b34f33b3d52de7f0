// Package status is the schema of an interface's status: what `GET
// /v1/status`, `xlimit status --json` and `xlimit top` show, whether a
// daemon answers it (userspace/api) or it is read from the pins with none
// running (loader/pinstatus). Types only, so that the pins' reader needs
// nothing of the HTTP API.
package status

// Report is the schema of `GET /v1/status` and of
// `xlimit status --json`: the rules, rates in force and counters of every
// protected interface.
type Report struct {
	Interfaces []Iface `json:"interfaces"`
	Fleet      *Fleet  `json:"fleet,omitempty"` // with --fleet
}

// Iface is one interface of a Report.
type Iface struct {
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
	CountersReadNS uint64   `json:"counters_read_ns,omitempty"`
	Rules          []Rule   `json:"rules"`
	Total          Counters `json:"total"`
	// Memory is the kernel memory of the interface's maps.
	Memory *Memory `json:"memory,omitempty"`
	// HostAddrs is what the host-address map (xl_host_addrs) holds.
	HostAddrs *HostAddrs `json:"host_addrs,omitempty"`
	// Preflight is what the driver's preflight decided when the running
	// daemon attached (loader/preflight); nil without a daemon.
	Preflight *Preflight `json:"preflight,omitempty"`
	// Dispatcher is the id of libxdp's dispatcher when xlimit shares the
	// interface through it (--xdp-share), and XDPPrograms its slots in
	// the order they run.
	Dispatcher  uint32       `json:"dispatcher,omitempty"`
	XDPPrograms []XDPProgram `json:"xdp_programs,omitempty"`
}

// Preflight is the driver's preflight of an interface
// (docs/kernels.md, "Drivers: the preflight").
type Preflight struct {
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

// HostAddrs is what an interface's xl_host_addrs holds: the host's
// addresses the answering policy knows (docs/dataplane.md, "The host's own
// addresses").
type HostAddrs struct {
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

// Rule is one rule of an interface.
type Rule struct {
	Slot       int      `json:"slot"`
	Name       string   `json:"name"`
	Unit       string   `json:"unit"`
	Rate       float64  `json:"rate"`
	Burst      float64  `json:"burst"`
	RateSource string   `json:"rate_source"` // static | control
	Shadow     bool     `json:"shadow"`
	Counters   Counters `json:"counters"`
	// PerSource is the per-source limit, with the sources dropped most.
	PerSource *PerSource `json:"per_source,omitempty"`
	// Concurrency is the concurrency limit and the connections in flight.
	Concurrency *Concurrency `json:"concurrency,omitempty"`
	// Breaker is the circuit breaker's gate on new connections as the
	// kernel applies it: "open" (all refused), "half_open" (probes pass);
	// empty when no gate is in force.
	Breaker string `json:"breaker,omitempty"`
	// SynCookies is the rule's SYN cookie mode and counters (rules with
	// syn_cookies auto or always).
	SynCookies *SynCookies `json:"syn_cookies,omitempty"`
}

// SynCookies is what a rule's SYN cookies did (docs/dataplane.md,
// "SYN cookies"), the slot's counters summed over CPUs like the rule's
// others: counted by XDP (sent, and the SYNs not answered, by why) and by
// the TC program that checks the returning ACKs (validated, failed,
// refused, assign_failed). SYNs for a 4-tuple the host already has a
// socket for are passed to it (to_socket).
type SynCookies struct {
	Mode         string `json:"mode"`          // auto | always
	Sent         uint64 `json:"sent"`          // SYN-ACKs with a cookie sent
	Validated    uint64 `json:"validated"`     // ACKs with a valid cookie, charged and handed to the listener
	Failed       uint64 `json:"failed"`        // ACKs to the listener whose cookie was not valid
	Refused      uint64 `json:"refused"`       // valid cookies the rule refused (its rate, its gates)
	RefusedReset uint64 `json:"refused_reset"` // of refused, answered with a reset (refuse: reset): the client fails at once
	AssignFailed uint64 `json:"assign_failed"` // valid and admitted, but the kernel refused to create the socket
	OverBudget   uint64 `json:"over_budget"`   // SYNs not answered: the host's answer budget was spent
	NotLocal     uint64 `json:"not_local"`     // SYNs not answered: not to one of the host's addresses
	Unanswerable uint64 `json:"unanswerable"`  // SYNs not answered: IP options, extension headers, a cut header
	ToSocket     uint64 `json:"to_socket"`     // SYNs not answered but passed: the host had a socket for their 4-tuple (TIME_WAIT, open) or an MPTCP listener
}

// Concurrency is a rule's concurrency limit and the connections in
// flight that the kernel counted.
type Concurrency struct {
	Soft     int   `json:"soft"`
	Max      int   `json:"max"`
	InFlight int64 `json:"in_flight"`
}

// PerSource is a rule's per-source limit and its most dropped
// sources.
type PerSource struct {
	Rate       float64  `json:"rate"`
	Burst      float64  `json:"burst"`
	PrefixV4   int      `json:"prefix_v4"`
	PrefixV6   int      `json:"prefix_v6"`
	Ban        bool     `json:"ban"`
	TopSources []Source `json:"top_sources"`
}

// Source is one source prefix of a per-source limit.
type Source struct {
	Prefix string `json:"prefix"`
	Drops  uint64 `json:"drops"`
	Banned bool   `json:"banned"`
}

// Counters holds counters summed over CPUs: packets and bytes by
// verdict (pass, drop, would_drop) and packets by reason (non-zero ones).
type Counters struct {
	Packets map[string]uint64 `json:"packets"`
	Bytes   map[string]uint64 `json:"bytes"`
	Reasons map[string]uint64 `json:"reasons"`
}

// Memory is the kernel memory of an interface's maps: what the kernel
// reports (memlock) and xlimit's estimate from each map's geometry
// (docs/robustness.md), per map, largest first, and in total.
type Memory struct {
	MemlockBytes  uint64      `json:"memlock_bytes"`
	EstimateBytes uint64      `json:"estimate_bytes"`
	Maps          []MapMemory `json:"maps"`
}

// MapMemory is one map of a Memory.
type MapMemory struct {
	Name          string `json:"name"`
	Type          string `json:"type"`
	KeySize       uint32 `json:"key_size"`
	ValueSize     uint32 `json:"value_size"`
	MaxEntries    uint32 `json:"max_entries"`
	MemlockBytes  uint64 `json:"memlock_bytes"` // 0: the kernel does not say
	EstimateBytes uint64 `json:"estimate_bytes"`
}

// Fleet is the state of a daemon's fleet sharing (--fleet,
// docs/fleet.md).
type Fleet struct {
	Node  string      `json:"node"`
	Store string      `json:"store"` // the redacted URL
	Up    bool        `json:"up"`    // the last exchange was answered
	Rules []FleetRule `json:"rules"`
	// MemberConflicts counts the checks that found another daemon
	// reporting as this member; BudgetMismatches the allocations of
	// another budget than this host's (docs/fleet.md).
	MemberConflicts  uint64 `json:"member_conflicts"`
	BudgetMismatches uint64 `json:"budget_mismatches"`
}

// FleetRule is one fleet rule of a Fleet.
type FleetRule struct {
	Rule            string  `json:"rule"`
	Key             string  `json:"key"`
	Share           float64 `json:"share"`  // packets/s this host may use now
	Demand          float64 `json:"demand"` // smoothed offered rate, packets/s
	State           string  `json:"state"`  // leased, not_contacted, new, store_lost, lease_expired
	LeaseAgeSeconds float64 `json:"lease_age_seconds"`
	Hosts           int     `json:"hosts"`
	StoreBudget     float64 `json:"store_budget,omitempty"` // the budget the store divided last
}
