//go:build linux

package tests

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
)

// TestInterfaceComesBack: the server's interface is deleted and created
// again under the same name (a veth re-created, as with a VF reset or a
// rebuilt bond). The daemon sees it, attaches again within a second with
// the pinned maps (the rule's counters carry on), logs it, and a flood one
// second later is held to the limit. Before issue 16 nothing re-attached:
// 434 000 packets/s reached the port limited to 1000/s.
func TestInterfaceComesBack(t *testing.T) {
	e := newEnv(t)
	udp, _ := e.services(false)
	d := e.startDaemon(e.writeRules("rules.yaml", limitRules()))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Counters to keep: a short flood before the interface goes.
	e.flood(ctx, false, 5000, time.Second)()
	before := e.status()
	passBefore, dropBefore, _, _ := before.rule("udp-flood")

	recreated := time.Now()
	if err := e.lab.Recreate(0); err != nil {
		t.Fatal(err)
	}
	ready := time.Since(recreated) // the new pair is up with its addresses
	// Within a second, the daemon says it attached again; the flood starts
	// a second after the new pair is up whatever it says, so that a daemon
	// that never re-attaches shows what reaches the port.
	back := time.Duration(-1)
	for time.Since(recreated) < ready+3*time.Second {
		if strings.Contains(d.Log(), "interface back: attached again") {
			back = time.Since(recreated)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(time.Until(recreated.Add(ready + time.Second)))

	const offered, dur = 50000.0, 4 * time.Second
	udp.Reset()
	start := time.Now()
	sent := e.flood(ctx, false, offered, dur)()
	udp.Settle(200*time.Millisecond, 2*time.Second)
	got := admittedRate(udp.Count(), limitPPS, sent.Elapsed)
	steady := rateBetween(udp, start.Add(time.Second), start.Add(dur-500*time.Millisecond))
	st := e.status()
	pass, drop, _, _ := st.rule("udp-flood")
	t.Logf("e2e interface re-created (the new pair was up after %v): the log said attached again %v after the deletion (-1: not within 3 s of the pair being up); a flood from 1 s after the re-creation, offered %.0f pkt/s (sent %d in %v): the socket received %d = burst %d + %.1f pkt/s (limit %d; %.1f pkt/s from 1 s to the end); kernel pass %d→%d drop %d→%d; attached %v",
		ready.Round(time.Millisecond), back.Round(time.Millisecond), sent.PPS(), sent.Sent, sent.Elapsed.Round(time.Millisecond), udp.Count(), limitPPS, got, limitPPS, steady,
		passBefore, pass, dropBefore, drop, st.Interfaces[0].Attached)
	if sent.PPS() < 5*limitPPS {
		t.Fatalf("the flood reached only %.0f pkt/s: not a flood", sent.PPS())
	}
	if back < 0 || back > ready+time.Second {
		t.Errorf("attached again %v after the deletion (-1: never), want within a second of the new interface (up after %v)", back, ready)
	}
	if !st.Interfaces[0].Attached {
		t.Errorf("status: not attached after the interface came back")
	}
	if !within(got, limitPPS, 0.05) {
		t.Errorf("received %.1f pkt/s beyond the burst after the interface came back, want %d within 5%%", got, limitPPS)
	}
	if pass < passBefore || drop < dropBefore || drop == 0 {
		t.Errorf("the rule's counters restarted or nothing was dropped: pass %d→%d drop %d→%d (the pinned maps must be adopted)", passBefore, pass, dropBefore, drop)
	}
	if !strings.Contains(d.Log(), "UNPROTECTED") {
		t.Errorf("no log line said the interface was unprotected while it was gone")
	}
}

// TestInterfaceComesBackUnderFlood: the flood runs through the deletion
// and the re-creation (a generator that starts again whenever its
// interface is back, as a looped trafgen does), five times in one daemon
// run. Once attached again, the port admits its rate: 0.98–1.02 of it over
// the 4 s from one second after the re-attach, every round. Issue 26 saw
// 685 and 739 of 1000 in two of three live runs (a hand-run flood).
func TestInterfaceComesBackUnderFlood(t *testing.T) {
	e := newEnv(t)
	udp, _ := e.services(false)
	d := e.startDaemon(e.writeRules("rules.yaml", limitRules()))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	fctx, stopFlood := context.WithCancel(ctx)
	var sent atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the looped generator: a new spec (MACs) every time
		defer wg.Done()
		for fctx.Err() == nil {
			spec := e.lab.ClientFlood(false)
			spec.Proto, spec.DstPort, spec.PayloadLen, spec.Rate, spec.Duration = lab.ProtoUDP, udpPort, 64, 300000, 500*time.Millisecond
			res, err := lab.Flood(fctx, spec)
			sent.Add(int64(res.Sent))
			if err != nil {
				time.Sleep(20 * time.Millisecond) // the interface is gone
			}
		}
	}()
	defer func() { stopFlood(); wg.Wait() }()
	time.Sleep(2 * time.Second)
	var rates []float64
	for round := range 5 {
		logBefore := strings.Count(d.Log(), "interface back: attached again")
		recreated := time.Now()
		if err := e.lab.Recreate(0); err != nil {
			t.Fatal(err)
		}
		back := time.Duration(-1)
		for time.Since(recreated) < 5*time.Second {
			if strings.Count(d.Log(), "interface back: attached again") > logBefore {
				back = time.Since(recreated)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if back < 0 {
			t.Fatalf("round %d: not attached again within 5 s", round)
		}
		if back > time.Second {
			t.Errorf("round %d: attached again %v after the re-creation, want within a second", round, back.Round(time.Millisecond))
		}
		from := time.Now().Add(time.Second)
		s0 := sent.Load()
		time.Sleep(time.Second)
		pass0, _, _, _ := e.status().rule("udp-flood")
		time.Sleep(4 * time.Second)
		pass, drop, _, _ := e.status().rule("udp-flood")
		time.Sleep(200 * time.Millisecond)
		got := rateBetween(udp, from, from.Add(4*time.Second))
		offered := float64(sent.Load()-s0) / 5.2
		t.Logf("round %d: attached again %v after the re-creation; offered %.0f pkt/s; received %.1f pkt/s from 1 s to 5 s after (limit %d); the kernel passed %.1f pkt/s then (pass %d drop %d)",
			round, back.Round(time.Millisecond), offered, got, limitPPS, float64(pass-pass0)/4, pass, drop)
		if offered < 5*limitPPS {
			t.Fatalf("round %d: the flood reached only %.0f pkt/s: not a flood", round, offered)
		}
		rates = append(rates, got)
	}
	for i, r := range rates {
		if !within(r, limitPPS, 0.02) {
			t.Errorf("round %d: received %.1f pkt/s after the interface came back, want %d within 2%%", i, r, limitPPS)
		}
	}
}
