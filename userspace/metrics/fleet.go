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

type fleetMetrics struct {
	share, demand, leaseAge, state, hosts *prometheus.Desc
	mu                                    sync.Mutex
	rules                                 func() []FleetRule // nil: no --fleet
}

func newFleetMetrics() *fleetMetrics {
	l := []string{"rule", "key"}
	return &fleetMetrics{
		share:    prometheus.NewDesc("xlimit_fleet_share", "The rate this host may use of a fleet budget now (packets/s): its leased share or a safe share.", l, nil),
		demand:   prometheus.NewDesc("xlimit_fleet_demand", "The smoothed offered rate of a fleet rule on this host (packets/s), as reported to the store.", l, nil),
		leaseAge: prometheus.NewDesc("xlimit_fleet_lease_age_seconds", "Age of the lease in force of a fleet rule; 0 without one.", l, nil),
		state:    prometheus.NewDesc("xlimit_fleet_state", "1 for the state of a fleet rule: leased, or a fallback (not_contacted, new, store_lost, lease_expired).", append(l, "state"), nil),
		hosts:    prometheus.NewDesc("xlimit_fleet_hosts", "Hosts in the fleet rule's allocation, this one included; 0 unknown.", l, nil),
	}
}

// SetFleet gives the collector the fleet rules to read at each scrape.
func (c *Collector) SetFleet(fn func() []FleetRule) {
	c.fleet.mu.Lock()
	c.fleet.rules = fn
	c.fleet.mu.Unlock()
}

func (f *fleetMetrics) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{f.share, f.demand, f.leaseAge, f.state, f.hosts} {
		ch <- d
	}
}

func (f *fleetMetrics) collect(ch chan<- prometheus.Metric) {
	f.mu.Lock()
	fn := f.rules
	f.mu.Unlock()
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
