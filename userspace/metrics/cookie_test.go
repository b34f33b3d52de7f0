package metrics

import (
	"fmt"
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
	answers map[int]dataplane.AnswerCounters
}

func (c *cookieTable) CookieCounters(slot int) (dataplane.CookieCounters, error) {
	return c.cookies[slot], nil
}

func (c *cookieTable) AnswerCounters(slot int) (dataplane.AnswerCounters, error) {
	return c.answers[slot], nil
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
		web: {Sent: 900, Validated: 40, Failed: 3, Refused: 2, RefusedReset: 1, AssignFailed: 1, OverBudget: 7, NotLocal: 5, Unanswerable: 4, ToSocket: 6},
	}, answers: map[int]dataplane.AnswerCounters{web: {KernelCookie: 8}}}
	c := NewCollector(func() []Target { return []Target{{Iface: "eth9", Plan: plan, Table: tab}} }, func() uint64 { return 0 })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	want := `
# HELP xlimit_syn_cookies_total SYN cookies of a rule with syn_cookies, by outcome: sent (SYN-ACKs from XDP), validated (returning ACKs with a valid cookie, admitted and handed to the listener), failed (ACKs with an invalid cookie), refused (valid, but over the rule's rate or gates), refused_reset (of refused, answered with a reset under refuse: reset), assign_failed (the kernel did not create the socket), over_budget (SYNs over the budget of answers, left to the rule's bucket), not_local, unanswerable (SYNs not answered), to_socket (SYNs left to a socket the host already had for their 4-tuple, TIME_WAIT or open, or to an MPTCP listener), kernel_cookie (ACKs carrying a cookie the kernel made, left to it).
# TYPE xlimit_syn_cookies_total counter
xlimit_syn_cookies_total{iface="eth9",outcome="assign_failed",rule="web"} 1
xlimit_syn_cookies_total{iface="eth9",outcome="failed",rule="web"} 3
xlimit_syn_cookies_total{iface="eth9",outcome="kernel_cookie",rule="web"} 8
xlimit_syn_cookies_total{iface="eth9",outcome="not_local",rule="web"} 5
xlimit_syn_cookies_total{iface="eth9",outcome="over_budget",rule="web"} 7
xlimit_syn_cookies_total{iface="eth9",outcome="refused",rule="web"} 2
xlimit_syn_cookies_total{iface="eth9",outcome="refused_reset",rule="web"} 1
xlimit_syn_cookies_total{iface="eth9",outcome="sent",rule="web"} 900
xlimit_syn_cookies_total{iface="eth9",outcome="to_socket",rule="web"} 6
xlimit_syn_cookies_total{iface="eth9",outcome="unanswerable",rule="web"} 4
xlimit_syn_cookies_total{iface="eth9",outcome="validated",rule="web"} 40
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "xlimit_syn_cookies_total"); err != nil {
		t.Error(err)
	}
}

// TestCollectorAnswers: a rule with syn_cookies exports its cookie path's
// classes, every one; a rule's reset path exports the classes it saw.
func TestCollectorAnswers(t *testing.T) {
	plan, err := dataplane.Compile(&dataplane.Spec{Rules: []dataplane.RuleSpec{
		{Name: "web", Protocol: "tcp", Ports: []dataplane.PortRange{{Lo: 443, Hi: 443}}, Rate: 100, Burst: 10,
			SynOnly: true, SynCookies: dataplane.CookiesAlways},
		{Name: "ssh", Protocol: "tcp", Ports: []dataplane.PortRange{{Lo: 22, Hi: 22}}, Rate: 10, Burst: 10, SynOnly: true, Refuse: "reset"},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var web, ssh dataplane.AnswerCounters
	web.Cookie[dataplane.AnswerOK], web.Cookie[dataplane.AnswerSrcMAC], web.Cookie[dataplane.AnswerBudget] = 100, 3, 2
	ssh.Reset[dataplane.AnswerOK], ssh.Reset[dataplane.AnswerSrcOwn] = 5, 1
	tab := &cookieTable{answers: map[int]dataplane.AnswerCounters{plan.Slot("web"): web, plan.Slot("ssh"): ssh}}
	c := NewCollector(func() []Target { return []Target{{Iface: "eth9", Plan: plan, Table: tab}} }, func() uint64 { return 0 })
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	var want strings.Builder
	want.WriteString(`# HELP xlimit_answers_total SYNs on a path that answers from XDP (path cookie: syn_cookies; reset: a refused SYN's reset), by the class of the answering policy: ok (answered, within the policy and the budget), shape, flags, src_mac, src_ip, dst_mac, dst_ip, src_own (not answered: docs/robustness.md), socket, budget. Reset path: only classes seen.
# TYPE xlimit_answers_total counter
`)
	for class := range dataplane.AnswerMax {
		fmt.Fprintf(&want, "xlimit_answers_total{class=%q,iface=\"eth9\",path=\"cookie\",rule=\"web\"} %d\n", class.String(), web.Cookie[class])
	}
	want.WriteString(`xlimit_answers_total{class="ok",iface="eth9",path="reset",rule="ssh"} 5
xlimit_answers_total{class="src_own",iface="eth9",path="reset",rule="ssh"} 1
`)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String()), "xlimit_answers_total"); err != nil {
		t.Error(err)
	}
}
