//go:build linux

package tests

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestWarmUpLive: a warm_up rule on live traffic admits about a third of
// its rate in the first second and reaches the full rate after about the
// warm-up period (Sentinel's WarmUpController, driven by the kernel's
// counters through the 50 ms control loop).
func TestWarmUpLive(t *testing.T) {
	e := newEnv(t)
	udp, _ := e.services(false)
	const rate, period = 1000, 5
	rules := e.writeRules("rules.yaml", fmt.Sprintf(`rules:
  - name: warm
    protocol: udp
    ports: [%d]
    rate: %d
    burst: 100
    behavior: warm_up
    warm_up: {period: %ds, cold_factor: 3}
`, udpPort, rate, period))
	e.startDaemon(rules)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const dur = 12 * time.Second
	start := time.Now()
	sent := e.flood(ctx, false, 20000, dur)()
	udp.Settle(200*time.Millisecond, 2*time.Second)

	var perSecond []int
	for s := range int(dur / time.Second) {
		t0 := start.Add(time.Duration(s) * time.Second)
		perSecond = append(perSecond, udp.CountBetween(t0, t0.Add(time.Second)))
	}
	t.Logf("e2e warm-up (rate %d/s, period %ds, cold factor 3, burst 100): offered %.0f pkt/s; admitted per second %v",
		rate, period, sent.PPS(), perSecond)

	// First second: the cold rate (rate/3) plus the cold burst (100/3).
	if first := perSecond[0]; first < rate/3-50 || first > rate/3+100 {
		t.Errorf("first second admitted %d, want about %d (a third of the rate)", first, rate/3)
	}
	// Rising, and below the full rate for most of the period.
	if perSecond[2] <= perSecond[0] || perSecond[period-2] >= rate*95/100 {
		t.Errorf("no gradual ramp: %v", perSecond)
	}
	// Full rate from shortly after the period on (Sentinel reaches it in
	// 1.3 periods for a cold factor of 3).
	for s := period*13/10 + 1; s < len(perSecond)-1; s++ {
		if !within(float64(perSecond[s]), rate, 0.05) {
			t.Errorf("second %d admitted %d, want the full %d within 5%%", s+1, perSecond[s], rate)
		}
	}
}
