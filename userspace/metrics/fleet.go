package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// FleetRule is the state of a fleet rule (docs/fleet.md).
type FleetRule struct {
	Rule, Key       string
	Share, Demand   float64 // packets/s: the rate this host may use, its smoothed offered rate
	LeaseAgeSeconds float64 // 0 without a lease
	State           string  // leased, or the fallback state
	Hosts           int
}

// FleetStates are the values of xlimit_fleet_state's state label.
var FleetStates = []string{"leased", "not_contacted", "new", "store_lost", "lease_expired"}

// FleetHealth counts what the fleet members disagree on (docs/fleet.md).
type FleetHealth struct {
	// MemberConflicts counts the checks that found another daemon
	// reporting as this fleet member (NODE/INSTANCE).
	MemberConflicts uint64
	// BudgetMismatches counts the allocations (one an epoch) of another
	// budget than this host's rule carries.
	BudgetMismatches uint64
}

type fleetMetrics struct {
	share, demand, leaseAge, state, hosts *prometheus.Desc
	conflicts, mismatches                 *prometheus.Desc
	mu                                    sync.Mutex
	rules                                 func() []FleetRule // nil: no --fleet
	health                                func() FleetHealth // nil: no --fleet
}

func newFleetMetrics() *fleetMetrics {
	l := []string{"rule", "key"}
	return &fleetMetrics{
		share:    prometheus.NewDesc("xlimit_fleet_share", "The rate this host may use of a fleet budget now (packets/s): its leased share or a safe share.", l, nil),
		demand:   prometheus.NewDesc("xlimit_fleet_demand", "The smoothed offered rate of a fleet rule on this host (packets/s), as reported to the store.", l, nil),
		leaseAge: prometheus.NewDesc("xlimit_fleet_lease_age_seconds", "Age of the lease in force of a fleet rule; 0 without one.", l, nil),
		state:    prometheus.NewDesc("xlimit_fleet_state", "1 for the state of a fleet rule: leased, or a fallback (not_contacted, new, store_lost, lease_expired).", append(l, "state"), nil),
		hosts:    prometheus.NewDesc("xlimit_fleet_hosts", "Hosts in the fleet rule's allocation, this one included; 0 unknown.", l, nil),
		conflicts: prometheus.NewDesc("xlimit_fleet_member_conflicts_total",
			"Checks that found another daemon reporting as this fleet member (NODE/INSTANCE): their demands merge and each takes a whole share.", nil, nil),
		mismatches: prometheus.NewDesc("xlimit_fleet_budget_mismatches_total",
			"Fleet allocations (one an epoch) of another budget than this host's rule carries: the hosts of a key disagree on its budget.", nil, nil),
	}
}

// SetFleet gives the collector the fleet rules to read at each scrape.
func (c *Collector) SetFleet(fn func() []FleetRule) {
	c.fleet.mu.Lock()
	c.fleet.rules = fn
	c.fleet.mu.Unlock()
}

// SetFleetHealth gives the collector the fleet's counters to read at each
// scrape.
func (c *Collector) SetFleetHealth(fn func() FleetHealth) {
	c.fleet.mu.Lock()
	c.fleet.health = fn
	c.fleet.mu.Unlock()
}

func (f *fleetMetrics) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{f.share, f.demand, f.leaseAge, f.state, f.hosts, f.conflicts, f.mismatches} {
		ch <- d
	}
}

func (f *fleetMetrics) collect(ch chan<- prometheus.Metric) {
	f.mu.Lock()
	fn, health := f.rules, f.health
	f.mu.Unlock()
	if health != nil {
		h := health()
		ch <- prometheus.MustNewConstMetric(f.conflicts, prometheus.CounterValue, float64(h.MemberConflicts))
		ch <- prometheus.MustNewConstMetric(f.mismatches, prometheus.CounterValue, float64(h.BudgetMismatches))
	}
	if fn == nil {
		return
	}
	for _, r := range fn() {
		ch <- prometheus.MustNewConstMetric(f.share, prometheus.GaugeValue, r.Share, r.Rule, r.Key)
		ch <- prometheus.MustNewConstMetric(f.demand, prometheus.GaugeValue, r.Demand, r.Rule, r.Key)
		ch <- prometheus.MustNewConstMetric(f.leaseAge, prometheus.GaugeValue, r.LeaseAgeSeconds, r.Rule, r.Key)
		ch <- prometheus.MustNewConstMetric(f.hosts, prometheus.GaugeValue, float64(r.Hosts), r.Rule, r.Key)
		for _, s := range FleetStates {
			v := 0.0
			if s == r.State {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(f.state, prometheus.GaugeValue, v, r.Rule, r.Key, s)
		}
	}
}
