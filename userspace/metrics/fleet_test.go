package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestFleetMetrics(t *testing.T) {
	c := NewCollector(func() []Target { return nil }, func() uint64 { return 0 })
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	if n, err := testutil.GatherAndCount(reg, "xlimit_fleet_share"); err != nil || n != 0 {
		t.Fatalf("without --fleet: %d series, %v", n, err)
	}
	c.SetFleet(func() []FleetRule {
		return []FleetRule{{Rule: "web", Key: "front", Share: 1495, Demand: 4500, LeaseAgeSeconds: 0.12, State: "leased", Hosts: 3}}
	})
	want := `
# HELP xlimit_fleet_hosts Hosts in the fleet rule's allocation, this one included; 0 unknown.
# TYPE xlimit_fleet_hosts gauge
xlimit_fleet_hosts{key="front",rule="web"} 3
# HELP xlimit_fleet_share The rate this host may use of a fleet budget now (packets/s): its leased share or a safe share.
# TYPE xlimit_fleet_share gauge
xlimit_fleet_share{key="front",rule="web"} 1495
# HELP xlimit_fleet_state 1 for the state of a fleet rule: leased, or a fallback (not_contacted, new, store_lost, lease_expired).
# TYPE xlimit_fleet_state gauge
xlimit_fleet_state{key="front",rule="web",state="lease_expired"} 0
xlimit_fleet_state{key="front",rule="web",state="leased"} 1
xlimit_fleet_state{key="front",rule="web",state="new"} 0
xlimit_fleet_state{key="front",rule="web",state="not_contacted"} 0
xlimit_fleet_state{key="front",rule="web",state="store_lost"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "xlimit_fleet_hosts", "xlimit_fleet_share", "xlimit_fleet_state"); err != nil {
		t.Fatal(err)
	}
	if v, err := testutil.GatherAndCount(reg, "xlimit_fleet_demand", "xlimit_fleet_lease_age_seconds"); err != nil || v != 2 {
		t.Fatalf("demand and lease age: %d series, %v", v, err)
	}
}
