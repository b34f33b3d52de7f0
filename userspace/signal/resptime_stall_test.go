package signal_test

import (
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/control"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/signal"
)

// stallAIMD is an AIMD law of target 25 ms between 1000/s and 12000/s
// with the default gains, at rate 5000/s.
func stallAIMD(t *testing.T) *control.AIMD {
	t.Helper()
	a, err := control.NewAIMD(control.AIMDParams{
		TargetLatency: 25 * time.Millisecond, MinRate: 1000, MaxRate: 12000,
		KA: config.DefaultKA, KM: config.DefaultKM, Gamma: config.DefaultGamma, Alpha: config.DefaultAlpha,
		CPUHigh: config.DefaultCPUHigh, ErrorThreshold: config.DefaultErrorThreshold,
	}, 5000)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// respTick is one tick's response-time histogram: fast responses at
// fastAt, and slow ones at slowAt.
func respTick(fast int, fastAt time.Duration, slow int, slowAt time.Duration) *dataplane.RespHist {
	var h dataplane.RespHist
	h.Buckets[dataplane.RespBucket(uint64(fastAt))] += uint64(fast)
	h.Buckets[dataplane.RespBucket(uint64(slowAt))] += uint64(slow)
	h.Count = uint64(fast + slow)
	return &h
}

// TestResponseTimeStallingClients (issue 41 M7): the response time is
// stamped at a request's first byte, so a client that sends half a
// request and the rest seconds later (or a long poll) is a response of
// seconds, whatever the service does. A few such clients on a quiet
// service (12 of 20 responses a tick: they keep a connection each and
// stall request after request) must not make `adaptive` cut the rate for
// everyone; a real slowdown of every response still must.
func TestResponseTimeStallingClients(t *testing.T) {
	const ticks = 30
	run := func(tick *dataplane.RespHist) (first, last control.Step) {
		a := stallAIMD(t)
		for i := range ticks {
			// A rule that uses its whole rate on an idle CPU.
			s := a.Step(control.Signals{Latency: signal.TickResponseTime(tick), CPU: 0.3, UsedRate: a.Rate()})
			if i == 0 {
				first = s
			}
			last = s
		}
		return first, last
	}
	healthy := 2 * time.Millisecond
	cases := []struct {
		name string
		tick *dataplane.RespHist
		cut  bool
	}{
		{"healthy service", respTick(20, healthy, 0, 0), false},
		{"8 fast answers, 12 from clients that stall 5 s", respTick(8, healthy, 12, 5*time.Second), false},
		{"long polls: 9 fast, 11 held 30 s", respTick(9, healthy, 11, 30*time.Second), false},
		{"every response slow (100 ms, target 25 ms)", respTick(0, 0, 20, 100*time.Millisecond), true},
		{"most responses slow: 4 fast, 16 at 100 ms", respTick(4, healthy, 16, 100*time.Millisecond), true},
	}
	for _, c := range cases {
		first, last := run(c.tick)
		read := signal.TickResponseTime(c.tick)
		t.Logf("%s: reading %v; first tick %v, rate after %d ticks %.0f", c.name, read, first.Action, ticks, last.Rate)
		if cut := last.Rate < 5000; cut != c.cut {
			t.Errorf("%s: reading %v, rate 5000 → %.0f after %d ticks; want cut %v", c.name, read, last.Rate, ticks, c.cut)
		}
	}
}
