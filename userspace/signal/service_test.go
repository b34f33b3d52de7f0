package signal

import (
	"math"
	"testing"
	"time"
)

// Connections accepted = handshakes completed − the queue's growth, at most
// the SYNs the rule admitted when the handshakes are the namespace's.
func TestTCPServiceRate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s tcpService
	if _, ok := s.step(t0, 5, 0, -1); ok {
		t.Fatal("the first tick has no previous queue")
	}
	for _, c := range []struct {
		queue    float64
		hs       uint64
		admitted float64
		want     float64
	}{
		{5, 50, -1, 1000},    // steady queue: all 50 handshakes accepted in 50 ms
		{15, 50, -1, 800},    // the queue grew by 10: 40 accepted
		{0, 30, -1, 900},     // drained 15 and 30 more: 45
		{0, 80, 50, 1000},    // the namespace's 80 handshakes, the rule admitted 50
		{10, 0, -1, 0},       // nothing completed, the queue grew: 0, not negative
		{10, 50, 50.0, 1000}, // the bound at exactly the admitted count
	} {
		t0 = t0.Add(50 * time.Millisecond)
		got, ok := s.step(t0, c.queue, c.hs, c.admitted)
		if !ok || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%+v: %v, %v", c, got, ok)
		}
	}
}

// Datagrams read = the namespace's InDatagrams, at most admitted + queued;
// the queue in datagrams integrates admitted − read − dropped and is reset
// by an empty receive memory.
func TestUDPServiceRate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var u udpService
	u.step(t0, 0, 7, 0, -1)
	for i, c := range []struct {
		memory, drops, read uint64
		admitted            float64
		rate, queue         float64
		dropped             uint64
	}{
		{0, 7, 50, 50, 1000, 0, 0},     // all read
		{4096, 7, 30, 50, 600, 20, 0},  // 20 queued
		{8192, 10, 30, 50, 600, 37, 3}, // 17 more queued, 3 dropped
		{2048, 10, 60, 30, 1200, 7, 0}, // read 60: 30 new and 30 of the queue
		{0, 10, 10, 5, 200, 0, 0},      // 12 left by the integral, but the memory is empty: 0
		{4096, 10, 500, 20, 400, 1, 0}, // the namespace read 500 (other sockets): at most 20; something queued
		{4096, 2, 0, 0, 0, 1, 0},       // a socket went away with its drops: none counted
	} {
		t0 = t0.Add(50 * time.Millisecond)
		rate, queue, dropped, ok := u.step(t0, c.memory, c.drops, c.read, c.admitted)
		if !ok || math.Abs(rate-c.rate) > 1e-9 || math.Abs(queue-c.queue) > 1e-9 || dropped != c.dropped {
			t.Errorf("tick %d %+v: rate %v queue %v dropped %d ok %v", i, c, rate, queue, dropped, ok)
		}
	}
}

// The base latency is the minimum over the last minute, per second.
func TestMinWindow(t *testing.T) {
	var m minWindow
	t0 := time.Unix(2000, 0)
	if b := m.observe(30*time.Millisecond, t0); b != 30*time.Millisecond {
		t.Errorf("first sample: %v", b)
	}
	if b := m.observe(10*time.Millisecond, t0.Add(10*time.Second)); b != 10*time.Millisecond {
		t.Errorf("lower sample: %v", b)
	}
	if b := m.observe(50*time.Millisecond, t0.Add(69*time.Second)); b != 10*time.Millisecond {
		t.Errorf("59 s later: %v, want the 10 ms still in the window", b)
	}
	if b := m.observe(50*time.Millisecond, t0.Add(71*time.Second)); b != 50*time.Millisecond {
		t.Errorf("61 s later: %v, want the 10 ms out of the window", b)
	}
}

// The host's overload for system protection: CPU usage, or CPU pressure
// where asked for and reported, whichever is the higher fraction of its
// threshold, on the scale of the CPU threshold.
func TestSystemLoad(t *testing.T) {
	usage, fresh := 0.5, true
	pressure, available := 0.0, false
	l := SystemLoad{
		CPU:      func() (float64, bool) { return usage, fresh },
		Pressure: func() (float64, bool) { return pressure, available },
		CPUHigh:  0.8, PressureHigh: 0.4,
	}
	for _, c := range []struct {
		usage     float64
		fresh     bool
		pressure  float64
		available bool
		want      float64
		wantFresh bool
	}{
		{0.5, true, 0, false, 0.5, true},   // no PSI: the usage
		{0.5, true, 0.1, true, 0.5, true},  // pressure at 1/4 of its threshold, usage at 5/8 of its
		{0.5, true, 0.3, true, 0.6, true},  // pressure at 3/4: 0.75 × 0.8
		{0.5, true, 0.4, true, 0.8, true},  // pressure at its threshold: overloaded
		{0.5, false, 0.2, true, 0.4, true}, // a stale usage, pressure reported: the pressure
		{0.5, false, 0, false, 0.5, false}, // nothing fresh
	} {
		usage, fresh, pressure, available = c.usage, c.fresh, c.pressure, c.available
		got, ok := l.Load()
		if math.Abs(got-c.want) > 1e-9 || ok != c.wantFresh {
			t.Errorf("%+v: %v, %v", c, got, ok)
		}
	}
	l.PressureHigh = 0 // off: the usage alone
	usage, fresh, pressure, available = 0.5, true, 0.9, true
	if got, ok := l.Load(); got != 0.5 || !ok {
		t.Errorf("pressure off: %v, %v", got, ok)
	}
	l.Pressure = nil
	if got, ok := l.Load(); got != 0.5 || !ok {
		t.Errorf("no pressure reader: %v, %v", got, ok)
	}
}
