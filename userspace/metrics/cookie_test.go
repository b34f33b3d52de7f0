package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// cookieTable is a fakeTable with SYN cookie counters (a CookieTable).
type cookieTable struct {
	fakeTable
	cookies map[int]dataplane.CookieCounters
}

func (c *cookieTable) CookieCounters(slot int) (dataplane.CookieCounters, error) {
	return c.cookies[slot], nil
}

// TestCollectorSynCookies: a rule with syn_cookies exports its counters by
// outcome; a rule without exports none.
func TestCollectorSynCookies(t *testing.T) {
	plan, err := dataplane.Compile(&dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: []dataplane.PortRange{{Lo: 443, Hi: 443}}, Rate: 100, Burst: 10,
			SynOnly: true, SynCookies: dataplane.CookiesAuto},
		{Name: "ssh", Protocol: "tcp", Ports: []dataplane.PortRange{{Lo: 22, Hi: 22}}, Rate: 10, Burst: 10, SynOnly: true},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	web := plan.Slot("web")
	tab := &cookieTable{cookies: map[int]dataplane.CookieCounters{
		web: {Sent: 900, Validated: 40, Failed: 3, Refused: 2, AssignFailed: 1, OverBudget: 7, NotLocal: 5, Unanswerable: 4, ToSocket: 6},
	}}
	c := NewCollector(func() []Target { return []Target{{Iface: "eth9", Plan: plan, Table: tab}} }, func() uint64 { return 0 })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	want := `
# HELP xlimit_syn_cookies_total SYN cookies of a rule with syn_cookies, by outcome: sent (SYN-ACKs from XDP), validated (returning ACKs with a valid cookie, admitted and handed to the listener), failed (ACKs with an invalid cookie), refused (valid, but over the rule's rate or gates), assign_failed (the kernel did not create the socket), over_budget, not_local, unanswerable (SYNs not answered), to_socket (SYNs passed to a socket the host already had for their 4-tuple, TIME_WAIT or open).
# TYPE xlimit_syn_cookies_total counter
xlimit_syn_cookies_total{iface="eth9",outcome="assign_failed",rule="web"} 1
xlimit_syn_cookies_total{iface="eth9",outcome="failed",rule="web"} 3
xlimit_syn_cookies_total{iface="eth9",outcome="not_local",rule="web"} 5
xlimit_syn_cookies_total{iface="eth9",outcome="over_budget",rule="web"} 7
xlimit_syn_cookies_total{iface="eth9",outcome="refused",rule="web"} 2
xlimit_syn_cookies_total{iface="eth9",outcome="sent",rule="web"} 900
xlimit_syn_cookies_total{iface="eth9",outcome="to_socket",rule="web"} 6
xlimit_syn_cookies_total{iface="eth9",outcome="unanswerable",rule="web"} 4
xlimit_syn_cookies_total{iface="eth9",outcome="validated",rule="web"} 40
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "xlimit_syn_cookies_total"); err != nil {
		t.Error(err)
	}
}
