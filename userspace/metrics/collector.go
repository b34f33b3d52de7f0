// Package metrics exports xlimit's kernel counters and control state to
// Prometheus. The collector reads the maps at scrape time (no polling
// loop), sums per-CPU values (the maps package does), and counts its own
// read errors.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Table is what the collector needs of an interface's maps.
type Table interface {
	AllCounters() ([dataplane.CounterSlots]dataplane.Counters, error)
	Limit(slot int) (dataplane.Limit, error)
}

// Target is one interface: its maps and the plan in force on it.
type Target struct {
	Iface string
	Plan  *dataplane.Plan
	Table Table
}

// Collector is a prometheus.Collector over the targets that a callback
// returns at each scrape.
type Collector struct {
	targets func() []Target
	nowNS   func() uint64

	packets, bytes, drops, rate, ifacePackets *prometheus.Desc
	errors                                    prometheus.Counter
	reloads                                   *prometheus.CounterVec
}

// NewCollector returns a collector. nowNS reads the clock that the kernel's
// deadlines use (CLOCK_MONOTONIC).
func NewCollector(targets func() []Target, nowNS func() uint64) *Collector {
	return &Collector{
		targets: targets,
		nowNS:   nowNS,
		packets: prometheus.NewDesc("xlimit_packets_total",
			"Packets a rule decided on, by verdict (pass, drop, would_drop).",
			[]string{"iface", "rule", "verdict"}, nil),
		bytes: prometheus.NewDesc("xlimit_bytes_total",
			"Bytes of the packets a rule decided on, by verdict.",
			[]string{"iface", "rule", "verdict"}, nil),
		drops: prometheus.NewDesc("xlimit_drops_total",
			"Packets a rule dropped (or would drop, in shadow mode), by reason.",
			[]string{"iface", "rule", "reason"}, nil),
		rate: prometheus.NewDesc("xlimit_rule_rate",
			"The rate in force for a rule, per second (packets, connections or bytes).",
			[]string{"iface", "rule", "source"}, nil),
		ifacePackets: prometheus.NewDesc("xlimit_interface_packets_total",
			"Every packet the program saw on an interface, by final verdict and reason.",
			[]string{"iface", "verdict", "reason"}, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "xlimit_collector_errors_total",
			Help: "Map reads that failed during scrapes.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xlimit_config_reloads_total",
			Help: "Rules reloads, by result (success, failure).",
		}, []string{"result"}),
	}
}

// Reload counts a reload with its result.
func (c *Collector) Reload(result string) {
	c.reloads.WithLabelValues(result).Inc()
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.packets, c.bytes, c.drops, c.rate, c.ifacePackets} {
		ch <- d
	}
	c.errors.Describe(ch)
	c.reloads.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	now := c.nowNS()
	for _, t := range c.targets() {
		counters, err := t.Table.AllCounters()
		if err != nil {
			c.errors.Inc()
			continue
		}
		for slot := range dataplane.MaxRules {
			r := &t.Plan.Rules[slot]
			if !r.Active() {
				continue
			}
			cnt := &counters[slot]
			for v := range dataplane.VerdictMax {
				ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(cnt.Packets[v]), t.Iface, r.Name, v.String())
				ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(cnt.Bytes[v]), t.Iface, r.Name, v.String())
			}
			for _, reason := range dataplane.RuleDropReasons {
				ch <- prometheus.MustNewConstMetric(c.drops, prometheus.CounterValue, float64(cnt.Reasons[reason]), t.Iface, r.Name, reason.String())
			}
			rate, source := r.Fallback.Rate(), "static"
			if lim, err := t.Table.Limit(slot); err != nil {
				c.errors.Inc()
			} else if lim.Epoch == r.Epoch && now < lim.DeadlineNS {
				rate, source = lim.Bucket.Rate(), "control"
			}
			ch <- prometheus.MustNewConstMetric(c.rate, prometheus.GaugeValue, rate, t.Iface, r.Name, source)
		}
		g := &counters[dataplane.GlobalSlot]
		for reason := range dataplane.ReasonMax {
			n := g.Reasons[reason]
			if n == 0 {
				continue
			}
			verdict := dataplane.VerdictPass
			if reason.IsDrop() {
				verdict = dataplane.VerdictDrop
			}
			ch <- prometheus.MustNewConstMetric(c.ifacePackets, prometheus.CounterValue, float64(n), t.Iface, verdict.String(), reason.String())
		}
	}
	c.errors.Collect(ch)
	c.reloads.Collect(ch)
}
