//go:build linux

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/lab"
)

// Per-source limits end to end: the daemon, a rule with per_source on a UDP
// port, floods from namespaces.
const (
	psRulePPS   = 2000 // the rule-wide rate (and burst: one second)
	psSourcePPS = 200  // each source's rate
	psBurst     = 50   // each source's burst
)

// Client-side addresses beyond the lab's own (TEST-NET-3: outside the
// lab's 198.18.0.0/15 and outside the random-source flood's /16).
var (
	psAttackers = []netip.Addr{netip.MustParseAddr("203.0.113.11"), netip.MustParseAddr("203.0.113.12")}
	psLegit     = netip.MustParseAddr("203.0.113.13")
)

func perSourceRules() string {
	return fmt.Sprintf(`rules:
  - name: per-source
    protocol: udp
    ports: [%d]
    rate: %d
    burst: %d
    per_source: {rate: %d, burst: %d, prefix_v4: 32}
`, udpPort, psRulePPS, psRulePPS, psSourcePPS, psBurst)
}

// psStatus is the part of `xlimit status --json` about per-source limits.
type psStatus struct {
	Interfaces []struct {
		Rules []psRuleStatus `json:"rules"`
	} `json:"interfaces"`
}

type psRuleStatus struct {
	Name     string `json:"name"`
	Counters struct {
		Packets map[string]uint64 `json:"packets"`
		Reasons map[string]uint64 `json:"reasons"`
	} `json:"counters"`
	PerSource *struct {
		Rate       float64 `json:"rate"`
		Burst      float64 `json:"burst"`
		PrefixV4   int     `json:"prefix_v4"`
		TopSources []struct {
			Prefix string `json:"prefix"`
			Drops  uint64 `json:"drops"`
		} `json:"top_sources"`
	} `json:"per_source"`
}

func (e *env) psStatus() psStatus {
	e.t.Helper()
	out, err := e.xlimit("status", "--json", "--iface", e.lab.ServerIf)
	if err != nil {
		e.t.Fatalf("xlimit status: %v: %s", err, out)
	}
	var st psStatus
	if err := json.Unmarshal(out, &st); err != nil || len(st.Interfaces) != 1 {
		e.t.Fatalf("decode status (%v): %s", err, out)
	}
	return st
}

// sourceFlood floods the limited port from src (or from random sources in
// random, when valid) at rate for d, in the background.
func (e *env) sourceFlood(ctx context.Context, src netip.Addr, random netip.Prefix, rate float64, d time.Duration) func() lab.FloodResult {
	spec := e.lab.ClientFlood(false)
	spec.Src, spec.RandomSources = src, random
	return e.startFlood(ctx, spec, rate, d)
}

// TestPerSourceFlood: two attacker addresses flood a UDP port at 20000
// pkt/s each while a legitimate client sends 100 pkt/s; the rule allows
// 2000/s in all and 200/s per source. Each attacker is held to its own
// rate (200/s within 5 % beyond its burst of 50), the legitimate client
// gets every packet through, and `xlimit status` lists the two attackers
// as the most dropped sources. Then a flood from random sources in a /16
// at 50000 pkt/s, each source well under its own limit, is held to the
// rule-wide 2000/s within 3 %.
func TestPerSourceFlood(t *testing.T) {
	e := newEnvWith(t, lab.Options{ExtraClientIP4: append([]netip.Addr{psLegit}, psAttackers...)})
	udp, _ := e.services(false)
	d := e.startDaemon(e.writeRules("rules.yaml", perSourceRules()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Phase 1: two attackers and a legitimate client.
	const attack, legit, dur = 20000.0, 100.0, 5 * time.Second
	var waits []func() lab.FloodResult
	for _, a := range psAttackers {
		waits = append(waits, e.sourceFlood(ctx, a, netip.Prefix{}, attack, dur))
	}
	waitLegit := e.sourceFlood(ctx, psLegit, netip.Prefix{}, legit, dur)
	var sent []lab.FloodResult
	for _, w := range waits {
		sent = append(sent, w())
	}
	sentLegit := waitLegit()
	udp.Settle(200*time.Millisecond, 3*time.Second)
	st := e.psStatus()

	drops := map[string]uint64{}
	var rule *psRuleStatus
	for i := range st.Interfaces[0].Rules {
		if st.Interfaces[0].Rules[i].Name == "per-source" {
			rule = &st.Interfaces[0].Rules[i]
		}
	}
	if rule == nil || rule.PerSource == nil {
		t.Fatalf("status shows no per-source limit on rule per-source: %+v\ndaemon log:\n%s", st, d.Log())
	}
	var top []string
	for _, s := range rule.PerSource.TopSources {
		drops[s.Prefix] = s.Drops
		top = append(top, fmt.Sprintf("%s:%d", s.Prefix, s.Drops))
	}
	for i, a := range psAttackers {
		got := udp.CountFrom(a)
		r := (float64(got) - psBurst) / sent[i].Elapsed.Seconds()
		notPassed := uint64(sent[i].Sent - got)
		t.Logf("e2e per-source: attacker %s offered %.0f pkt/s (sent %d in %v), received %d = burst %d + %.1f pkt/s (limit %d/s); status: %d drops",
			a, sent[i].PPS(), sent[i].Sent, sent[i].Elapsed.Round(time.Millisecond), got, psBurst, r, psSourcePPS, drops[a.String()+"/32"])
		if sent[i].PPS() < 10*psSourcePPS {
			t.Errorf("attacker %s reached only %.0f pkt/s: not a flood", a, sent[i].PPS())
		}
		if !within(r, psSourcePPS, 0.05) {
			t.Errorf("attacker %s: %.1f pkt/s beyond its burst, want %d within 5%%", a, r, psSourcePPS)
		}
		if dr := drops[a.String()+"/32"]; float64(dr) < 0.99*float64(notPassed) || dr > notPassed {
			t.Errorf("status lists %d drops for %s/32, want the %d packets that did not arrive (within 1%%)", dr, a, notPassed)
		}
	}
	gotLegit := udp.CountFrom(psLegit)
	t.Logf("e2e per-source: legitimate %s sent %d at %.0f pkt/s, received %d; status top sources %v; rule counters %v, reasons %v",
		psLegit, sentLegit.Sent, sentLegit.PPS(), gotLegit, top, rule.Counters.Packets, rule.Counters.Reasons)
	if gotLegit != sentLegit.Sent || gotLegit == 0 {
		t.Errorf("legitimate client: received %d of %d", gotLegit, sentLegit.Sent)
	}
	if _, ok := drops[psLegit.String()+"/32"]; ok {
		t.Errorf("status lists the legitimate client among the dropped sources: %v", top)
	}
	first := map[string]bool{}
	for _, s := range rule.PerSource.TopSources[:min(2, len(rule.PerSource.TopSources))] {
		first[s.Prefix] = true
	}
	for _, a := range psAttackers {
		if !first[a.String()+"/32"] {
			t.Errorf("status top sources %v, want the two attackers first", top)
			break
		}
	}
	if rule.Counters.Reasons["rule"] != 0 {
		t.Errorf("the rule-wide bucket dropped %d packets although the sources stayed under it", rule.Counters.Reasons["rule"])
	}

	// Phase 2: random sources in a /16 outside the lab's subnet (the
	// server's rp_filter is off, so they are delivered), 50000 pkt/s, each
	// source a few packets: only the rule-wide bucket binds. The legitimate
	// client keeps sending 100/s and gets its share of the rule's rate.
	random := netip.MustParsePrefix("198.19.0.0/16")
	if random.Overlaps(e.lab.Subnet4) {
		random = netip.MustParsePrefix("198.18.0.0/16")
	}
	time.Sleep(1500 * time.Millisecond) // the rule-wide bucket refills its one-second burst
	udp.Reset()
	const flood, floodDur = 50000.0, 6 * time.Second
	wait := e.sourceFlood(ctx, netip.Addr{}, random, flood, floodDur)
	waitLegit = e.sourceFlood(ctx, psLegit, netip.Prefix{}, legit, floodDur)
	res := wait()
	sentLegit = waitLegit()
	udp.Settle(200*time.Millisecond, 3*time.Second)
	total := udp.Count()
	r := (float64(total) - psRulePPS) / res.Elapsed.Seconds()
	srcs := udp.Sources()
	inPrefix, maxPer := 0, 0
	for a, n := range srcs {
		if random.Contains(a) {
			inPrefix++
			maxPer = max(maxPer, n)
		}
	}
	legitShare := float64(udp.CountFrom(psLegit)) / sentLegit.Elapsed.Seconds()
	t.Logf("e2e per-source: random sources in %s: offered %.0f pkt/s (sent %d in %v), received %d = burst %d + %.1f pkt/s (rule-wide limit %d/s) from %d sources (at most %d from one); legitimate client %.1f of its %.0f pkt/s (its share of the rule: %.1f)",
		random, res.PPS(), res.Sent, res.Elapsed.Round(time.Millisecond), total, psRulePPS, r, psRulePPS, inPrefix, maxPer,
		legitShare, legit, legit*psRulePPS/(res.PPS()+legit))
	if res.PPS() < 10*psRulePPS {
		t.Fatalf("the random-source flood reached only %.0f pkt/s: not a flood", res.PPS())
	}
	if !within(r, psRulePPS, 0.03) {
		t.Errorf("random-source flood: %.1f pkt/s beyond the burst, want the rule-wide %d within 3%%", r, psRulePPS)
	}
	if inPrefix < 1000 {
		t.Errorf("only %d distinct random sources got through: not a random-source flood", inPrefix)
	}
	if math.IsNaN(legitShare) {
		t.Errorf("no legitimate packets measured")
	}
}
