package api

// FleetStatus is the state of a daemon's fleet sharing (--fleet,
// docs/fleet.md).
type FleetStatus struct {
	Node  string            `json:"node"`
	Store string            `json:"store"` // the redacted URL
	Up    bool              `json:"up"`    // the last exchange was answered
	Rules []FleetRuleStatus `json:"rules"`
	// MemberConflicts counts the checks that found another daemon
	// reporting as this member; BudgetMismatches the allocations of
	// another budget than this host's (docs/fleet.md).
	MemberConflicts  uint64 `json:"member_conflicts"`
	BudgetMismatches uint64 `json:"budget_mismatches"`
}

// FleetRuleStatus is one fleet rule of a FleetStatus.
type FleetRuleStatus struct {
	Rule            string  `json:"rule"`
	Key             string  `json:"key"`
	Share           float64 `json:"share"`  // packets/s this host may use now
	Demand          float64 `json:"demand"` // smoothed offered rate, packets/s
	State           string  `json:"state"`  // leased, not_contacted, new, store_lost, lease_expired
	LeaseAgeSeconds float64 `json:"lease_age_seconds"`
	Hosts           int     `json:"hosts"`
	StoreBudget     float64 `json:"store_budget,omitempty"` // the budget the store divided last
}
