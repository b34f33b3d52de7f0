package metrics

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// fakeTable is an interface's maps as the collector reads them.
type fakeTable struct {
	counters [dataplane.CounterSlots]dataplane.Counters
	limits   map[int]dataplane.Limit
	conns    map[int]dataplane.Conns
	fail     bool
}

func (f *fakeTable) AllCounters() ([dataplane.CounterSlots]dataplane.Counters, error) {
	if f.fail {
		return f.counters, errors.New("read counters: broken")
	}
	return f.counters, nil
}

func (f *fakeTable) Limit(slot int) (dataplane.Limit, error) { return f.limits[slot], nil }

func (f *fakeTable) Conns(slot int) (dataplane.Conns, error) { return f.conns[slot], nil }

func TestCollector(t *testing.T) {
	plan, err := dataplane.Compile(&dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: []dataplane.PortRange{{Lo: 80, Hi: 80}}, Rate: 100, Burst: 10,
			Concurrency: &dataplane.ConcurrencySpec{Soft: 5, Max: 10}},
		{Name: "dns", Protocol: "udp", Ports: []dataplane.PortRange{{Lo: 53, Hi: 53}}, Rate: 1000, Burst: 1000},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	web, dns := plan.Slot("web"), plan.Slot("dns")
	tab := &fakeTable{limits: map[int]dataplane.Limit{}, conns: map[int]dataplane.Conns{}}
	tab.counters[web].Packets[dataplane.VerdictPass] = 7
	tab.counters[web].Packets[dataplane.VerdictDrop] = 3
	tab.counters[web].Reasons[dataplane.ReasonConcurrency] = 2
	tab.counters[web].Reasons[dataplane.ReasonRule] = 1
	tab.counters[dataplane.GlobalSlot].Reasons[dataplane.ReasonMalformedL4] = 4
	tab.conns[web] = dataplane.Conns{Count: 9, Epoch: plan.Rules[web].Epoch}
	// The control loop steers dns at 250/s until 2 s.
	b, err := dataplane.NewBucket(250, 250, false)
	if err != nil {
		t.Fatal(err)
	}
	tab.limits[dns] = dataplane.Limit{Bucket: b, DeadlineNS: 2e9, Epoch: plan.Rules[dns].Epoch}

	now := uint64(1e9)
	c := NewCollector(func() []Target { return []Target{{Iface: "eth9", Plan: plan, Table: tab}} }, func() uint64 { return now })
	c.ObserveTick(3*time.Millisecond, 50*time.Millisecond, []RuleControl{{Rule: "dns", State: "warm", Signal: "accept_queue"}})
	c.Reload("success")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)

	expect := func(what, text string, names ...string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(text), names...); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	expect("connections in flight", `
# HELP xlimit_rule_connections Connections in flight to a rule with a concurrency limit or an adaptive in-flight cap (passively established, not yet closed by the service).
# TYPE xlimit_rule_connections gauge
xlimit_rule_connections{iface="eth9",rule="web"} 9
`, "xlimit_rule_connections")
	expect("rates: static, and the loop's while its deadline is ahead", `
# HELP xlimit_rule_rate The rate in force for a rule, per second (packets, connections or bytes).
# TYPE xlimit_rule_rate gauge
xlimit_rule_rate{iface="eth9",rule="dns",source="control"} 250
xlimit_rule_rate{iface="eth9",rule="web",source="static"} 100
`, "xlimit_rule_rate")
	now = 3e9 // past the deadline: the static rate is in force again
	expect("rates after the deadline", `
# HELP xlimit_rule_rate The rate in force for a rule, per second (packets, connections or bytes).
# TYPE xlimit_rule_rate gauge
xlimit_rule_rate{iface="eth9",rule="dns",source="static"} 1000
xlimit_rule_rate{iface="eth9",rule="web",source="static"} 100
`, "xlimit_rule_rate")

	// Drops by reason, and the interface-wide verdicts of packets no rule
	// decided on.
	n, err := testutil.GatherAndCount(reg, "xlimit_drops_total")
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * len(dataplane.RuleDropReasons); n != want {
		t.Errorf("xlimit_drops_total: %d series, want %d (every rule drop reason of each rule)", n, want)
	}
	expect("interface verdicts", `
# HELP xlimit_interface_packets_total Every packet the program saw on an interface, by final verdict and reason.
# TYPE xlimit_interface_packets_total counter
xlimit_interface_packets_total{iface="eth9",reason="malformed_l4",verdict="drop"} 4
`, "xlimit_interface_packets_total")

	// A count for another rule (an earlier one in the slot) reads as 0.
	tab.conns[web] = dataplane.Conns{Count: 9, Epoch: plan.Rules[web].Epoch + 2}
	if v := gauge(t, reg, "xlimit_rule_connections"); v != 0 {
		t.Errorf("connections of another epoch: %v, want 0", v)
	}

	// A table that cannot be read is counted, not fatal.
	tab.fail = true
	before := testutil.ToFloat64(c.errors)
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if testutil.ToFloat64(c.errors) != before+1 {
		t.Errorf("collector errors: %v, want %v", testutil.ToFloat64(c.errors), before+1)
	}
}

// gauge returns the value of the only series of a gauge.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single series of %s", name)
	return 0
}

// An adaptive rule whose connections in flight the kernel counts for the
// loop's cap: its count and the cap while the loop's limit is in force,
// the cap 0 once it is not.
func TestCollectorInFlightCap(t *testing.T) {
	plan, err := dataplane.Compile(&dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "api", Protocol: "tcp", Ports: []dataplane.PortRange{{Lo: 8080, Hi: 8080}}, SynOnly: true, Rate: 500, Burst: 50, InFlight: true},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	api := plan.Slot("api")
	b, err := dataplane.NewBucket(250, 25, false)
	if err != nil {
		t.Fatal(err)
	}
	tab := &fakeTable{
		limits: map[int]dataplane.Limit{api: {Bucket: b, DeadlineNS: 2e9, Epoch: plan.Rules[api].Epoch, ConcCap: 14}},
		conns:  map[int]dataplane.Conns{api: {Count: 31, Epoch: plan.Rules[api].Epoch}},
	}
	now := uint64(1e9)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(func() []Target { return []Target{{Iface: "eth9", Plan: plan, Table: tab}} }, func() uint64 { return now }))
	want := func(conns, cap string) string {
		return `
# HELP xlimit_rule_connections Connections in flight to a rule with a concurrency limit or an adaptive in-flight cap (passively established, not yet closed by the service).
# TYPE xlimit_rule_connections gauge
xlimit_rule_connections{iface="eth9",rule="api"} ` + conns + `
# HELP xlimit_rule_in_flight_cap The control loop's cap on an adaptive rule's connections in flight, while the service is saturated (0: none in force).
# TYPE xlimit_rule_in_flight_cap gauge
xlimit_rule_in_flight_cap{iface="eth9",rule="api"} ` + cap + `
`
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("31", "14")), "xlimit_rule_connections", "xlimit_rule_in_flight_cap"); err != nil {
		t.Errorf("in force: %v", err)
	}
	now = 3e9 // past the deadline: the static rule has no cap
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want("31", "0")), "xlimit_rule_connections", "xlimit_rule_in_flight_cap"); err != nil {
		t.Errorf("after the deadline: %v", err)
	}
}
