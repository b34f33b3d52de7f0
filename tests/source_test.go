//go:build linux

package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
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
	// client keeps sending 100/s.
	//
	// What the legitimate client gets is decided by arrival order, not by
	// a proportion: the rule's tokens go to whoever arrives first once one
	// has accrued. Against a smooth flood every packet would have the same
	// chance, admitted ÷ offered (about 4 of its 100 pkt/s). The lab's
	// generator sends its flood in sendmmsg batches of a millisecond's worth
	// (lab/flood.go), and each batch empties the bucket; the bucket refills
	// one token per 1/2000 s, so a paced packet that lands more than half a
	// millisecond after a batch finds a token: with batches 1 ms apart it
	// is admitted with probability 1 − 1/(2000 × 1 ms) = 0.5, and more when
	// the loaded machine delays batches (longer gaps). (Measured: 48.0 of
	// 100 pkt/s.) The test asserts the share is at least half that
	// prediction — a limiter that lumped the client with the flood (a
	// source bucket shared with it, say) gives it far less — and never
	// below the proportional share.
	//
	// What was admitted is read from the kernel's counters (exact), and the
	// receiver's own count and its socket's drops are checked against it,
	// so that a receiver that loses packets (a starved reader overflowing
	// its buffer) shows as measurement loss, not as the limiter's.
	random := netip.MustParsePrefix("198.19.0.0/16")
	if random.Overlaps(e.lab.Subnet4) {
		random = netip.MustParsePrefix("198.18.0.0/16")
	}
	time.Sleep(1500 * time.Millisecond) // the rule-wide bucket refills its one-second burst (a matter of time, not of a condition)
	udp.Reset()
	before := e.psRule(d)
	sockDrops0, err := udp.Drops()
	if err != nil {
		t.Fatal(err)
	}
	const flood, floodDur = 50000.0, 6 * time.Second
	wait := e.sourceFlood(ctx, netip.Addr{}, random, flood, floodDur)
	waitLegit = e.sourceFlood(ctx, psLegit, netip.Prefix{}, legit, floodDur)
	res := wait()
	sentLegit = waitLegit()
	// Wait until every packet the kernel admitted is either read or
	// dropped by the socket, or 5 s.
	var admitted, total, sockDrops int
	var after *psRuleStatus
	for deadline := time.Now().Add(5 * time.Second); ; {
		after = e.psRule(d)
		admitted = int(after.Counters.Packets["pass"] - before.Counters.Packets["pass"])
		n, err := udp.Drops()
		if err != nil {
			t.Fatal(err)
		}
		total, sockDrops = udp.Count(), n-sockDrops0
		if total+sockDrops >= admitted || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	reasons := map[string]uint64{}
	for k, v := range after.Counters.Reasons {
		reasons[k] = v - before.Counters.Reasons[k]
	}
	r := (float64(admitted) - psRulePPS) / res.Elapsed.Seconds()
	srcs := udp.Sources()
	inPrefix, maxPer := 0, 0
	for a, n := range srcs {
		if random.Contains(a) {
			inPrefix++
			maxPer = max(maxPer, n)
		}
	}
	legitGot := float64(udp.CountFrom(psLegit))
	pLegit := legitGot / float64(sentLegit.Sent)
	pFlood := float64(admitted-int(legitGot)) / float64(res.Sent)
	const batchInterval, predicted = time.Millisecond, 1 - 1/(psRulePPS*0.001)
	t.Logf("e2e per-source: random sources in %s: offered %.0f pkt/s (sent %d in %v); the kernel admitted %d = burst %d + %.1f pkt/s (rule-wide limit %d/s), reasons %v; the receiver read %d and its socket dropped %d (measurement loss); from %d sources (at most %d from one)",
		random, res.PPS(), res.Sent, res.Elapsed.Round(time.Millisecond), admitted, psRulePPS, r, psRulePPS, reasons, total, sockDrops, inPrefix, maxPer)
	t.Logf("e2e per-source: legitimate client %.1f of its %.0f pkt/s: admitted with probability %.3f, the flood's packets %.4f (proportional share %.1f pkt/s); first come first served against %v batches predicts %.2f",
		legitGot/sentLegit.Elapsed.Seconds(), legit, pLegit, pFlood, pFlood*sentLegit.PPS(), batchInterval, predicted)
	if res.PPS() < 10*psRulePPS {
		t.Fatalf("the random-source flood reached only %.0f pkt/s: not a flood", res.PPS())
	}
	if total+sockDrops != admitted {
		t.Errorf("the kernel admitted %d packets, the receiver read %d and its socket dropped %d: %d unaccounted for",
			admitted, total, sockDrops, admitted-total-sockDrops)
	}
	if !within(r, psRulePPS, 0.03) {
		t.Errorf("random-source flood: the kernel admitted %.1f pkt/s beyond the burst, want the rule-wide %d within 3%%", r, psRulePPS)
	}
	if reasons["source"] != 0 {
		t.Errorf("source buckets dropped %d packets, although no source exceeded its own limit", reasons["source"])
	}
	if inPrefix < 1000 {
		t.Errorf("only %d distinct random sources got through: not a random-source flood", inPrefix)
	}
	switch {
	case sentLegit.Sent == 0:
		t.Errorf("the legitimate client sent nothing")
	case sockDrops > 0:
		t.Logf("the receiver lost %d packets: the legitimate share (%.3f) is a lower bound, not checked", sockDrops, pLegit)
	case pLegit < predicted/2 || pLegit < pFlood:
		t.Errorf("legitimate client admitted with probability %.3f, want at least half the %.2f that first come first served predicts and at least the flood's %.4f",
			pLegit, predicted, pFlood)
	}
}

// psRule reads the per-source rule's status.
func (e *env) psRule(d interface{ Log() string }) *psRuleStatus {
	e.t.Helper()
	st := e.psStatus()
	for i := range st.Interfaces[0].Rules {
		if r := &st.Interfaces[0].Rules[i]; r.Name == "per-source" {
			return r
		}
	}
	e.t.Fatalf("status shows no rule per-source: %+v\ndaemon log:\n%s", st, d.Log())
	return nil
}
