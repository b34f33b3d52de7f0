// Package metrics exports xlimit's kernel counters and control state to
// Prometheus. The collector reads the maps at scrape time (no polling
// loop), sums per-CPU values (the maps package does), and counts its own
// read errors.
package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Table is what the collector needs of an interface's maps.
type Table interface {
	AllCounters() ([dataplane.CounterSlots]dataplane.Counters, error)
	Limit(slot int) (dataplane.Limit, error)
	Conns(slot int) (dataplane.Conns, error)
}

// CookieTable is what the collector reads of a table with SYN cookies
// (maps.Tables): a slot's cookie counters. Optional: a Table without it
// exports no xlimit_syn_cookies_total.
type CookieTable interface {
	CookieCounters(slot int) (dataplane.CookieCounters, error)
}

// AnswerTable is what the collector reads of a table with the answering
// classes (maps.Tables, bpf/answer.h): a slot's SYNs on each answering
// path by class. Optional, as CookieTable.
type AnswerTable interface {
	AnswerCounters(slot int) (dataplane.AnswerCounters, error)
}

// Target is one interface: its maps and the plan in force on it.
type Target struct {
	Iface string
	Plan  *dataplane.Plan
	Table Table
	// HostAddrs is the state of the interface's host-address map
	// (xl_host_addrs); nil: not exported.
	HostAddrs *HostAddrs
	// XDPTx is whether the program on the interface may send frames back
	// (the driver's preflight, loader/preflight); nil: not exported.
	XDPTx *bool
}

// HostAddrs is what the daemon last wrote into an interface's
// xl_host_addrs (daemon/hostaddrs.go).
type HostAddrs struct {
	Listed, Unlisted int    // addresses in the map (the MAC included), addresses that did not fit
	RefreshErrors    uint64 // refreshes that failed since the daemon started
}

// Collector is a prometheus.Collector over the targets that a callback
// returns at each scrape.
type Collector struct {
	targets func() []Target
	nowNS   func() uint64

	packets, bytes, drops, rate, conns, ifacePackets *prometheus.Desc
	inFlightCap                                      *prometheus.Desc
	cookies                                          *prometheus.Desc
	answers                                          *prometheus.Desc
	hostListed, hostUnlisted, hostRefreshErrors      *prometheus.Desc
	xdpTx                                            *prometheus.Desc
	errors                                           prometheus.Counter
	reloads                                          *prometheus.CounterVec

	latency, state, stale *prometheus.Desc
	tick                  prometheus.Histogram
	overruns              prometheus.Counter
	mu                    sync.Mutex
	control               []RuleControl

	sourceUp, sourceVersion, sourceErrors *prometheus.Desc
	source                                func() RulesSource // nil: no rules source

	queueBacklog, queueBytes, queueSent, queueDrops *prometheus.Desc
	queues                                          func() ([]QueueStat, error) // nil: no kernel queues

	fleet *fleetMetrics
}

// QueueStat is the state of a kernel queue (paced rules with queue: kernel).
type QueueStat struct {
	Iface, Rule           string
	Rate                  float64
	Backlog, BacklogBytes uint32 // waiting now
	Sent, Drops           uint64 // packets sent on, dropped because the queue was full
}

// SetQueues gives the collector the kernel queues to read at each scrape.
func (c *Collector) SetQueues(fn func() ([]QueueStat, error)) {
	c.mu.Lock()
	c.queues = fn
	c.mu.Unlock()
}

// RulesSource is the state of a daemon's rules source (--rules-source).
type RulesSource struct {
	Up      bool
	Version int64  // version of the source's document in force; -1 when unknown
	Errors  uint64 // failed connections, subscriptions and reads
}

// RuleControl is a steered rule's state after a control tick.
type RuleControl struct {
	Rule    string
	State   string        // warming, warm, or the AIMD action
	Breaker string        // the circuit breaker's state (closed, open, half_open); empty without one
	Latency time.Duration // smoothed observed latency (adaptive rules)
	Signal  string        // the signal the rule is steered by
	Stale   bool          // the signal could not be read this tick
}

// NewCollector returns a collector. nowNS reads the clock that the kernel's
// deadlines use (CLOCK_MONOTONIC).
func NewCollector(targets func() []Target, nowNS func() uint64) *Collector {
	c := &Collector{
		fleet:   newFleetMetrics(),
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
		conns: prometheus.NewDesc("xlimit_rule_connections",
			"Connections in flight to a rule with a concurrency limit or an adaptive in-flight cap (passively established, not yet closed by the service).",
			[]string{"iface", "rule"}, nil),
		inFlightCap: prometheus.NewDesc("xlimit_rule_in_flight_cap",
			"The control loop's cap on an adaptive rule's connections in flight, while the service is saturated (0: none in force).",
			[]string{"iface", "rule"}, nil),
		cookies: prometheus.NewDesc("xlimit_syn_cookies_total",
			"SYN cookies of a rule with syn_cookies, by outcome: sent (SYN-ACKs from XDP), validated (returning ACKs with a valid cookie, admitted and handed to the listener), failed (ACKs with an invalid cookie), refused (valid, but over the rule's rate or gates), refused_reset (of refused, answered with a reset under refuse: reset), assign_failed (the kernel did not create the socket), over_budget (SYNs over the budget of answers, left to the rule's bucket), not_local, unanswerable (SYNs not answered), to_socket (SYNs left to a socket the host already had for their 4-tuple, TIME_WAIT or open, or to an MPTCP listener), kernel_cookie (ACKs carrying a cookie the kernel made, left to it).",
			[]string{"iface", "rule", "outcome"}, nil),
		answers: prometheus.NewDesc("xlimit_answers_total",
			"SYNs on a path that answers from XDP (path cookie: syn_cookies; reset: a refused SYN's reset), by the class of the answering policy: ok (answered, within the policy and the budget), shape, flags, src_mac, src_ip, dst_mac, dst_ip, src_own (not answered: docs/robustness.md), socket, budget. Reset path: only classes seen.",
			[]string{"iface", "rule", "path", "class"}, nil),
		xdpTx: prometheus.NewDesc("xlimit_xdp_tx",
			"1 when the program on the interface may send frames back (XDP_TX: SYN cookies, resets); 0 when the driver's preflight avoided it there (a driver path known to crash, docs/kernels.md): SYN cookies are then the kernel's and refused SYNs are dropped without a reset.",
			[]string{"iface"}, nil),
		hostListed: prometheus.NewDesc("xlimit_host_addrs_listed",
			"The host's addresses (the attached interface's MAC and the namespace's IPs) in xl_host_addrs, which the answering policy answers for (docs/dataplane.md).",
			[]string{"iface"}, nil),
		hostUnlisted: prometheus.NewDesc("xlimit_host_addrs_unlisted",
			"The host's addresses that did not fit in xl_host_addrs (65536 entries): SYNs to them are not answered from XDP (a SYN-cookie rule leaves them to its bucket), and a SYN spoofed from one of them may be (docs/dataplane.md). 0: all listed.",
			[]string{"iface"}, nil),
		hostRefreshErrors: prometheus.NewDesc("xlimit_host_addrs_refresh_errors_total",
			"Refreshes of xl_host_addrs that failed (the addresses could not be read or written): the map keeps what it held, marked incomplete; rules are enforced all the same.",
			[]string{"iface"}, nil),
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
		latency: prometheus.NewDesc("xlimit_rule_latency_seconds",
			"Smoothed queueing latency the control loop observes for an adaptive rule.",
			[]string{"rule"}, nil),
		state: prometheus.NewDesc("xlimit_rule_state",
			"A steered rule's control state (1 for the current one); a rule with a circuit breaker also has closed, open or half_open.",
			[]string{"rule", "state"}, nil),
		stale: prometheus.NewDesc("xlimit_signal_stale",
			"1 when the signal steering a rule could not be read at the last tick.",
			[]string{"rule", "signal"}, nil),
		overruns: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "xlimit_control_overruns_total",
			Help: "Control loop ticks that took longer than the control period.",
		}),
		sourceUp: prometheus.NewDesc("xlimit_rules_source_up",
			"1 when the rules source (--rules-source) is connected and subscribed.",
			[]string{}, nil),
		sourceVersion: prometheus.NewDesc("xlimit_rules_version",
			"Version of the rules source's document in force (-1: unknown, e.g. running the bootstrap file).",
			[]string{}, nil),
		sourceErrors: prometheus.NewDesc("xlimit_rules_source_errors_total",
			"Failed connections, subscriptions and reads of the rules source.",
			[]string{}, nil),
		queueBacklog: prometheus.NewDesc("xlimit_queue_backlog_packets",
			"Packets waiting in a rule's kernel queue (queue: kernel).",
			[]string{"iface", "rule"}, nil),
		queueBytes: prometheus.NewDesc("xlimit_queue_backlog_bytes",
			"Bytes waiting in a rule's kernel queue.",
			[]string{"iface", "rule"}, nil),
		queueSent: prometheus.NewDesc("xlimit_queue_sent_packets_total",
			"Packets a rule's kernel queue sent on to the host.",
			[]string{"iface", "rule"}, nil),
		queueDrops: prometheus.NewDesc("xlimit_queue_drops_total",
			"Packets a rule's kernel queue dropped because they would have waited longer than max_queueing_time.",
			[]string{"iface", "rule"}, nil),
		tick: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "xlimit_control_tick_seconds",
			Help:    "Duration of control loop ticks.",
			Buckets: prometheus.ExponentialBuckets(25e-6, 2, 14),
		}),
	}
	// Both results exist from the start at 0, so that the first failure is
	// an increase that alerts (deploy/prometheus) and rate() can see.
	c.reloads.WithLabelValues("success")
	c.reloads.WithLabelValues("failure")
	return c
}

// ObserveTick records a control tick: its duration (an overrun when longer
// than the period) and the steered rules' states.
func (c *Collector) ObserveTick(d, period time.Duration, rules []RuleControl) {
	c.tick.Observe(d.Seconds())
	if d > period {
		c.overruns.Inc()
	}
	c.mu.Lock()
	c.control = rules
	c.mu.Unlock()
}

// WatchRulesSource makes every scrape export the rules source's state
// from state.
func (c *Collector) WatchRulesSource(state func() RulesSource) {
	c.mu.Lock()
	c.source = state
	c.mu.Unlock()
}

// Reload counts a reload with its result.
func (c *Collector) Reload(result string) {
	c.reloads.WithLabelValues(result).Inc()
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.packets, c.bytes, c.drops, c.rate, c.conns, c.inFlightCap, c.ifacePackets, c.cookies, c.answers,
		c.hostListed, c.hostUnlisted, c.hostRefreshErrors, c.xdpTx} {
		ch <- d
	}
	ch <- c.latency
	ch <- c.state
	ch <- c.stale
	for _, d := range []*prometheus.Desc{c.queueBacklog, c.queueBytes, c.queueSent, c.queueDrops} {
		ch <- d
	}
	ch <- c.sourceUp
	ch <- c.sourceVersion
	ch <- c.sourceErrors
	c.fleet.describe(ch)
	c.errors.Describe(ch)
	c.reloads.Describe(ch)
	c.tick.Describe(ch)
	c.overruns.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.fleet.collect(ch)
	now := c.nowNS()
	for _, t := range c.targets() {
		if t.XDPTx != nil {
			v := 0.0
			if *t.XDPTx {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.xdpTx, prometheus.GaugeValue, v, t.Iface)
		}
		if h := t.HostAddrs; h != nil {
			ch <- prometheus.MustNewConstMetric(c.hostListed, prometheus.GaugeValue, float64(h.Listed), t.Iface)
			ch <- prometheus.MustNewConstMetric(c.hostUnlisted, prometheus.GaugeValue, float64(h.Unlisted), t.Iface)
			ch <- prometheus.MustNewConstMetric(c.hostRefreshErrors, prometheus.CounterValue, float64(h.RefreshErrors), t.Iface)
		}
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
			rate, source, inFlightCap := r.Fallback.Rate(), "static", 0.0
			if lim, err := t.Table.Limit(slot); err != nil {
				c.errors.Inc()
			} else if lim.Epoch == r.Epoch && now < lim.DeadlineNS {
				rate, source, inFlightCap = lim.Bucket.Rate(), "control", float64(max(lim.ConcCap, lim.ReqCap))
			}
			ch <- prometheus.MustNewConstMetric(c.rate, prometheus.GaugeValue, rate, t.Iface, r.Name, source)
			counted := t.Plan.Globals.Concurrent>>slot&1 != 0
			if counted && r.Flags&dataplane.RuleConcurrency == 0 {
				ch <- prometheus.MustNewConstMetric(c.inFlightCap, prometheus.GaugeValue, inFlightCap, t.Iface, r.Name)
			}
			cookieRule := r.Flags&(dataplane.RuleCookieAuto|dataplane.RuleCookieAlways) != 0
			var answers dataplane.AnswerCounters
			if at, ok := t.Table.(AnswerTable); ok {
				var err error
				if answers, err = at.AnswerCounters(slot); err != nil {
					c.errors.Inc()
				} else {
					for class := range dataplane.AnswerMax {
						if cookieRule {
							ch <- prometheus.MustNewConstMetric(c.answers, prometheus.CounterValue, float64(answers.Cookie[class]), t.Iface, r.Name, "cookie", class.String())
						}
						if n := answers.Reset[class]; n != 0 {
							ch <- prometheus.MustNewConstMetric(c.answers, prometheus.CounterValue, float64(n), t.Iface, r.Name, "reset", class.String())
						}
					}
				}
			}
			if ct, ok := t.Table.(CookieTable); ok && cookieRule {
				if k, err := ct.CookieCounters(slot); err != nil {
					c.errors.Inc()
				} else {
					for _, o := range []struct {
						name string
						n    uint64
					}{{"sent", k.Sent}, {"validated", k.Validated}, {"failed", k.Failed}, {"refused", k.Refused}, {"refused_reset", k.RefusedReset},
						{"assign_failed", k.AssignFailed}, {"over_budget", k.OverBudget}, {"not_local", k.NotLocal},
						{"unanswerable", k.Unanswerable}, {"to_socket", k.ToSocket}, {"kernel_cookie", answers.KernelCookie}} {
						ch <- prometheus.MustNewConstMetric(c.cookies, prometheus.CounterValue, float64(o.n), t.Iface, r.Name, o.name)
					}
				}
			}
			if counted {
				if n, err := t.Table.Conns(slot); err != nil {
					c.errors.Inc()
				} else if n.Epoch == r.Epoch {
					ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, float64(n.Count), t.Iface, r.Name)
				} else {
					ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, 0, t.Iface, r.Name)
				}
			}
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
	c.mu.Lock()
	control, source, queues := c.control, c.source, c.queues
	c.mu.Unlock()
	if queues != nil {
		qs, err := queues()
		if err != nil {
			c.errors.Inc()
		}
		for _, q := range qs {
			ch <- prometheus.MustNewConstMetric(c.queueBacklog, prometheus.GaugeValue, float64(q.Backlog), q.Iface, q.Rule)
			ch <- prometheus.MustNewConstMetric(c.queueBytes, prometheus.GaugeValue, float64(q.BacklogBytes), q.Iface, q.Rule)
			ch <- prometheus.MustNewConstMetric(c.queueSent, prometheus.CounterValue, float64(q.Sent), q.Iface, q.Rule)
			ch <- prometheus.MustNewConstMetric(c.queueDrops, prometheus.CounterValue, float64(q.Drops), q.Iface, q.Rule)
		}
	}
	if source != nil {
		st, up := source(), 0.0
		if st.Up {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(c.sourceUp, prometheus.GaugeValue, up)
		ch <- prometheus.MustNewConstMetric(c.sourceVersion, prometheus.GaugeValue, float64(st.Version))
		ch <- prometheus.MustNewConstMetric(c.sourceErrors, prometheus.CounterValue, float64(st.Errors))
	}
	for _, r := range control {
		if r.Latency > 0 {
			ch <- prometheus.MustNewConstMetric(c.latency, prometheus.GaugeValue, r.Latency.Seconds(), r.Rule)
		}
		ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, 1, r.Rule, r.State)
		if r.Breaker != "" && r.Breaker != r.State {
			// A rule steered by a law and a breaker is in two states.
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, 1, r.Rule, r.Breaker)
		}
		stale := 0.0
		if r.Stale {
			stale = 1
		}
		ch <- prometheus.MustNewConstMetric(c.stale, prometheus.GaugeValue, stale, r.Rule, r.Signal)
	}
	c.errors.Collect(ch)
	c.reloads.Collect(ch)
	c.tick.Collect(ch)
	c.overruns.Collect(ch)
}
