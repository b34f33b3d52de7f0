//go:build linux

package tests

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/tests/kit/corpus"
	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

type slotCounters = [dataplane.CounterSlots]dataplane.Counters

// validPort is a UDP port no corpus rule names: the valid traffic sent
// around the corpus goes there.
const validPort = 5353

// TestMalformedLive sends every frame of the crafted corpus
// (tests/kit/corpus: bad IHL, lengths that lie, truncated L3 and
// L4 headers, IPv6 extension chains past the bound, VLAN and QinQ stacks,
// fragments, runts, and the ordinary cases around them) on the client's
// veth through a packet socket, into the server's veth where the real
// daemon enforces the corpus's rules. Each frame must change the pinned
// counters by exactly what the corpus says: its verdict and reason in the
// global slot, and the decision of each rule it touches. Valid UDP traffic
// sent before, between and after the rule sets must all arrive.
func TestMalformedLive(t *testing.T) {
	e := newEnv(t)
	sink, err := lab.ListenUDPCounter(e.lab.Server, netip.AddrPortFrom(e.lab.ServerIP4, validPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })
	snd, err := lab.NewSender(e.lab.Client, e.lab.ClientIf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close() })

	specs := corpus.Specs()
	byspec := map[string][]corpus.Case{}
	for _, c := range corpus.Cases() {
		byspec[c.Spec] = append(byspec[c.Spec], c)
	}
	order := []string{"base", "malformed-pass", "frag-ignore", "frag-limit", "frag-drop"}
	if n := len(byspec); n != len(order) {
		t.Fatalf("the corpus has %d rule sets, the test knows %d", n, len(order))
	}

	pinDir := loader.PinDir(e.bpffs, e.lab.ServerIf)
	var d *daemon
	total, failed := 0, 0
	reasons := map[string]int{}
	for _, name := range order {
		rules := e.writeRules(name+".yaml", corpus.RulesFile(specs[name]))
		if d != nil {
			// Each rule set starts from fresh pins, so its rules take
			// their slots in file order, as in the kernel test: the slot
			// order decides which rule a packet meets first, and rules
			// that an earlier set left in low slots would come first.
			if err := d.signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if out, err := e.xlimit("detach", "--iface", e.lab.ServerIf); err != nil {
				t.Fatalf("detach: %v: %s", err, out)
			}
		}
		d = e.startDaemon(rules)
		tab, err := maps.OpenPinned(pinDir, true)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := tab.ReadPlan()
		if err != nil {
			t.Fatal(err)
		}
		quiet(t, tab)
		e.sendValid(t, sink, tab, name+": before")

		lastTouch := map[string]time.Time{}
		for _, c := range byspec[name] {
			// Each case starts with full buckets, as in the kernel test:
			// wait until every rule it may touch has refilled (the Pre
			// frames may touch any rule of the set).
			touched := map[string]bool{}
			for _, r := range c.Rules {
				touched[r.Name] = true
			}
			if len(c.Pre) > 0 {
				for _, r := range specs[name].Rules {
					touched[r.Name] = true
				}
			}
			for _, r := range specs[name].Rules {
				if touched[r.Name] {
					refill := time.Duration(r.Burst / r.Rate * float64(time.Second))
					time.Sleep(time.Until(lastTouch[r.Name].Add(refill + refill/20 + 20*time.Millisecond)))
				}
			}

			total++
			ok := t.Run(name+"/"+c.Name, func(t *testing.T) {
				for _, f := range c.Pre {
					before := readCounters(t, tab)
					send(t, snd, f)
					waitPackets(t, tab, before, 1)
				}
				before := readCounters(t, tab)
				send(t, snd, c.Frame)
				after := waitPackets(t, tab, before, 1)
				got := deltaCounters(after, before)
				want := c.Want(func(n string) int { return plan.Slot(n) })
				if d := diffSlots(got, want, plan); d != "" {
					t.Errorf("counter deltas:%s\nframe (%d bytes): %x", d, len(c.Frame), c.Frame)
				}
			})
			now := time.Now()
			for r := range touched {
				lastTouch[r] = now
			}
			if !ok {
				failed++
			}
			v := "drop"
			if c.Pass {
				v = "pass"
			}
			reasons[v+"/"+c.Reason.String()]++
		}
		e.sendValid(t, sink, tab, name+": after")
		tab.Close()
	}
	t.Logf("e2e malformed corpus: %d frames sent live, %d with other counters than the corpus says; outcomes %v", total, failed, reasons)
}

// quiet waits until the server's veth receives nothing for a second (the
// client's kernel sends multicast listener reports for a moment after the
// link came up), so every counter change that follows is the test's.
func quiet(t *testing.T, tab *maps.Tables) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	last, since := packets(readCounters(t, tab)[dataplane.GlobalSlot]), time.Now()
	for time.Since(since) < time.Second {
		if time.Now().After(deadline) {
			t.Fatalf("the server's veth never went quiet: %d packets so far", last)
		}
		time.Sleep(50 * time.Millisecond)
		if n := packets(readCounters(t, tab)[dataplane.GlobalSlot]); n != last {
			last, since = n, time.Now()
		}
	}
}

// sendValid sends 50 valid UDP datagrams to the sink's port (no rule
// limits it, or one with a burst of 100 does) and requires all of them to
// arrive, and the program's counters to show them.
func (e *env) sendValid(t *testing.T, sink *lab.UDPCounter, tab *maps.Tables, label string) {
	t.Helper()
	const n = 50
	sink.Reset()
	before := readCounters(t, tab)
	spec := e.lab.ClientFlood(false)
	spec.DstPort, spec.PayloadLen, spec.Count = validPort, 32, n
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := lab.Flood(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	got := sink.Settle(200*time.Millisecond, 3*time.Second)
	if res.Sent != n || got != n {
		t.Errorf("%s: valid traffic: sent %d of %d, received %d", label, res.Sent, n, got)
	}
	// The valid traffic passed the program: wait until the counters show
	// it all, so it is not taken for the next case's.
	waitPackets(t, tab, before, n)
}

func send(t *testing.T, s *lab.Sender, frame []byte) {
	t.Helper()
	if err := s.Send(frame); err != nil {
		t.Fatal(err)
	}
}

func readCounters(t testing.TB, tab *maps.Tables) slotCounters {
	t.Helper()
	c, err := tab.AllCounters()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func packets(c dataplane.Counters) uint64 {
	var n uint64
	for _, p := range c.Packets {
		n += p
	}
	return n
}

// waitPackets waits until the program has counted n more packets than in
// before (the frame crosses the veth asynchronously), then a little longer
// to catch any packet that should not be there, and returns the counters.
func waitPackets(t *testing.T, tab *maps.Tables, before slotCounters, n uint64) slotCounters {
	t.Helper()
	want := packets(before[dataplane.GlobalSlot]) + n
	deadline := time.Now().Add(2 * time.Second)
	for {
		c := readCounters(t, tab)
		if got := packets(c[dataplane.GlobalSlot]); got >= want {
			time.Sleep(10 * time.Millisecond)
			return readCounters(t, tab)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the program did not count the frame within 2 s")
		}
		time.Sleep(time.Millisecond)
	}
}

func deltaCounters(after, before slotCounters) slotCounters {
	var d slotCounters
	for i := range d {
		d[i] = after[i].Sub(before[i])
	}
	return d
}

// diffSlots describes the slots where got and want differ, or "".
func diffSlots(got, want slotCounters, plan *dataplane.Plan) string {
	var b strings.Builder
	for i := range got {
		if got[i] == want[i] {
			continue
		}
		name := "global"
		if i < dataplane.MaxRules {
			name = fmt.Sprintf("slot %d (%q)", i, plan.Rules[i].Name)
		}
		fmt.Fprintf(&b, "\n  %s:\n    got  %+v\n    want %+v", name, got[i], want[i])
	}
	return b.String()
}
