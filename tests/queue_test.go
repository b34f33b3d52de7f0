//go:build linux

package tests

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
)

const queuePort = 7300

// queueRun is what a receiver saw of one burst.
type queueRun struct {
	sent           int
	got            []lab.Stamp
	start          time.Time // first send
	mean, p99, max time.Duration
}

func (r queueRun) rejected() int { return r.sent - len(r.got) }

// sendBurst sends n datagrams spread over spread to the rule's port and
// collects what arrives until nothing did for quiet.
func sendBurst(t testing.TB, e *env, n int, spread, quiet time.Duration) queueRun {
	t.Helper()
	addr := netip.AddrPortFrom(e.lab.ServerIP4, queuePort)
	rcv, err := lab.ListenStamped(e.lab.Server, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	sent, err := lab.SendStamped(e.lab.Client, addr, n, spread, 64)
	if err != nil {
		t.Fatal(err)
	}
	last, at := -1, time.Now()
	for time.Since(at) < quiet {
		if c := rcv.Count(); c != last {
			last, at = c, time.Now()
		}
		time.Sleep(5 * time.Millisecond)
	}
	r := queueRun{sent: n, got: rcv.Stamps(), start: sent[0]}
	var waits []time.Duration
	var sum time.Duration
	for _, s := range r.got {
		waits = append(waits, s.Wait())
		sum += s.Wait()
	}
	slices.Sort(waits)
	if len(waits) > 0 {
		r.mean, r.p99, r.max = sum/time.Duration(len(waits)), waits[len(waits)*99/100], waits[len(waits)-1]
	}
	return r
}

// pacedRate is the delivery rate over the received datagrams.
func (r queueRun) pacedRate() float64 {
	// The first two leave at once (the TBF's two-packet bucket).
	if len(r.got) < 3 {
		return 0
	}
	return float64(len(r.got)-2) / r.got[len(r.got)-1].Recv.Sub(r.got[1].Recv).Seconds()
}

// perWindow counts the datagrams received in each window after the first send.
func (r queueRun) perWindow(w time.Duration, n int) []int {
	out := make([]int, n)
	for _, s := range r.got {
		if i := int(s.Recv.Sub(r.start) / w); i >= 0 && i < n {
			out[i]++
		}
	}
	return out
}

func queueRules(rate int, maxQueue time.Duration, behavior string) string {
	extra := ""
	if behavior != "reject" {
		extra = fmt.Sprintf("\n    paced: {max_queueing_time: %v, queue: %s}", maxQueue, behavior)
		behavior = "paced"
	}
	return fmt.Sprintf(`rules:
  - name: q
    protocol: udp
    ports: [%d]
    rate: %d
    behavior: %s%s
`, queuePort, rate, behavior, extra)
}

// TestPacedQueue: a burst far above the rate within 100 ms. With queue:
// none the excess is dropped at once and what passes passes at once; with
// queue: kernel what XDP admits is delivered at the paced rate, nothing
// waits longer than max_queueing_time, and only what exceeds the queue is
// dropped.
func TestPacedQueue(t *testing.T) {
	const (
		rate     = 200
		maxQueue = 300 * time.Millisecond
		burstN   = 400
	)
	// XDP admits burst = rate × max_queueing_time + 1 = 61 at once, plus
	// rate × 100 ms = 20 while the burst lasts.
	const admitted = 61 + 20
	t.Run("none", func(t *testing.T) {
		e := newEnv(t)
		e.startDaemon(e.writeRules("rules.yaml", queueRules(rate, maxQueue, "none")))
		r := sendBurst(t, e, burstN, 100*time.Millisecond, 400*time.Millisecond)
		t.Logf("queue none: sent %d within 100ms, received %d, rejected %d, wait mean %v p99 %v max %v",
			r.sent, len(r.got), r.rejected(), r.mean, r.p99, r.max)
		if n := len(r.got); n < admitted-10 || n > admitted+10 {
			t.Errorf("received %d, want about %d (burst 61 + 20 over the 100 ms)", n, admitted)
		}
		if r.max > 50*time.Millisecond {
			t.Errorf("longest wait %v with queue: none; admitted packets should pass at once", r.max)
		}
	})
	t.Run("kernel", func(t *testing.T) {
		e := newEnv(t)
		e.startDaemon(e.writeRules("rules.yaml", queueRules(rate, maxQueue, "kernel")))
		r := sendBurst(t, e, burstN, 100*time.Millisecond, 600*time.Millisecond)
		paced := r.pacedRate()
		t.Logf("queue kernel: sent %d within 100ms, received %d, rejected %d, paced at %.1f/s, wait mean %v p99 %v max %v",
			r.sent, len(r.got), r.rejected(), paced, r.mean, r.p99, r.max)
		if n := len(r.got); n < admitted-10 || n > admitted+10 {
			t.Errorf("received %d, want about %d: XDP's ceiling, all of which the queue holds", n, admitted)
		}
		if paced < rate*0.95 || paced > rate*1.05 {
			t.Errorf("delivered at %.1f/s, want the paced rate %d/s ± 5%%", paced, rate)
		}
		if r.max > maxQueue+15*time.Millisecond {
			t.Errorf("longest wait %v, want at most max_queueing_time %v (+15ms for the path)", r.max, maxQueue)
		}
		// Spacing at the receiver: 1/rate between consecutive datagrams.
		var gaps []time.Duration
		for i := 1; i < len(r.got); i++ {
			gaps = append(gaps, r.got[i].Recv.Sub(r.got[i-1].Recv))
		}
		slices.Sort(gaps)
		if len(gaps) > 10 {
			med := gaps[len(gaps)/2]
			t.Logf("spacing: min %v median %v max %v (1/rate = %v)", gaps[0], med, gaps[len(gaps)-1], time.Second/rate)
			if med < 4500*time.Microsecond || med > 5500*time.Microsecond {
				t.Errorf("median spacing %v, want 1/rate = 5ms ± 10%%", med)
			}
		}
		// The queue exists in the server's namespace, and detach removes it.
		out, err := e.lab.Server.Command(t.Context(), "ip", "-o", "link", "show", "type", "ifb").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "xlq") {
			t.Fatalf("no xlimit IFB in the server namespace: %v: %s", err, out)
		}
		if out, err := e.xlimit("detach", "--iface", e.lab.ServerIf); err != nil {
			t.Fatalf("detach: %v: %s", err, out)
		}
		out, _ = e.lab.Server.Command(t.Context(), "ip", "-o", "link", "show", "type", "ifb").CombinedOutput()
		if strings.Contains(string(out), "xlq") {
			t.Errorf("IFB left after detach: %s", out)
		}
	})
}

// BenchmarkPacedQueue: 3000 requests (UDP datagrams) arriving evenly within
// one second at a rule of 1000/s with an 800 ms queue, for reject, paced
// with queue: none and paced with queue: kernel. Reports, does not assert.
func BenchmarkPacedQueue(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: namespaces, XDP, IFB")
	}
	const (
		n        = 3000
		rate     = 1000
		maxQueue = 800 * time.Millisecond
	)
	for range b.N {
		type row struct {
			name string
			r    queueRun
		}
		var rows []row
		for _, behavior := range []string{"reject", "none", "kernel"} {
			e := newEnv(b)
			d := e.startDaemon(e.writeRules("rules.yaml", queueRules(rate, maxQueue, behavior)))
			r := sendBurst(b, e, n, time.Second, time.Second)
			name := map[string]string{"reject": "reject (burst 1000)", "none": "paced, queue: none", "kernel": "paced, queue: kernel"}[behavior]
			rows = append(rows, row{name, r})
			d.kill()
		}
		fmt.Printf("\n%d requests within 1 s at a rule of %d/s, max_queueing_time %v (UDP, one veth):\n\n", n, rate, maxQueue)
		fmt.Println("| behavior | received | rejected | mean wait | P99 wait | max wait |")
		fmt.Println("|---|---|---|---|---|---|")
		for _, x := range rows {
			fmt.Printf("| %s | %d | %d | %v | %v | %v |\n", x.name, len(x.r.got), x.r.rejected(),
				x.r.mean.Round(10*time.Microsecond), x.r.p99.Round(10*time.Microsecond), x.r.max.Round(10*time.Microsecond))
		}
		fmt.Printf("\nReceived per 100 ms after the first request:\n\n| behavior |")
		for i := range 20 {
			fmt.Printf(" %d |", (i+1)*100)
		}
		fmt.Printf("\n|---|%s\n", strings.Repeat("---|", 20))
		for _, x := range rows {
			fmt.Printf("| %s |", x.name)
			for _, c := range x.r.perWindow(100*time.Millisecond, 20) {
				fmt.Printf(" %d |", c)
			}
			fmt.Println()
		}
		b.ReportMetric(float64(rows[2].r.rejected()), "kernel-rejected")
		b.ReportMetric(float64(rows[2].r.p99.Microseconds())/1000, "kernel-p99-ms")
	}
}
