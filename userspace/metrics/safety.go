package metrics

import (
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// Safety exports what says whether a host is protected and whether its
// operator can still reach it (docs/operations.md): which configured
// interfaces have the program attached, and how many rules applied with
// a confirmation deadline were reverted for want of one.
type Safety struct {
	attached func() map[string]bool
	desc     *prometheus.Desc
	reverts  *prometheus.CounterVec
}

// NewSafety returns the collector; attached lists the configured
// interfaces and whether the program is attached to each.
func NewSafety(attached func() map[string]bool) *Safety {
	s := &Safety{
		attached: attached,
		desc: prometheus.NewDesc("xlimit_interface_attached",
			"1 when the XDP program is attached to this configured interface, 0 when it is not (the interface was deleted and is not back): its traffic is then unprotected.",
			[]string{"iface"}, nil),
		reverts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "xlimit_rules_reverts_total",
			Help: "Attempts to revert rules applied with a confirmation deadline (xlimit apply --confirm) to the previous rules because no confirmation came, counted once over, by result (success, failure: retried)."},
			[]string{"result"}),
	}
	for _, r := range []string{"success", "failure"} {
		s.reverts.WithLabelValues(r)
	}
	return s
}

// Revert counts one attempt to revert, once over: result is success or
// failure.
func (s *Safety) Revert(result string) { s.reverts.WithLabelValues(result).Inc() }

// Describe implements prometheus.Collector.
func (s *Safety) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.desc
	s.reverts.Describe(ch)
}

// Collect implements prometheus.Collector.
func (s *Safety) Collect(ch chan<- prometheus.Metric) {
	m := s.attached()
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		v := 0.0
		if m[n] {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, v, n)
	}
	s.reverts.Collect(ch)
}
