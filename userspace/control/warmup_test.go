package control

import (
	"errors"
	"math"
	"testing"
	"time"
)

// t0 is a second boundary of the Unix clock, far from zero like a real
// clock; the tests move a fake clock from there.
var t0 = time.Unix(1_700_000_000, 0)

func mustWarmUp(t *testing.T, count float64, period time.Duration, cold float64) *WarmUp {
	t.Helper()
	w, err := NewWarmUp(count, period, cold)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// round2 rounds to two decimals, the precision of the reference numbers.
func round2(v float64) float64 { return math.Round(v*100) / 100 }

func TestWarmUpConstants(t *testing.T) {
	for _, c := range []struct {
		name            string
		count           float64
		period          time.Duration
		cold            float64
		warning, max    int64
		slope, coldRate float64
	}{
		// docs/design.md §5.2's reference.
		{"reference", 10, 10 * time.Second, 3, 50, 100, 0.004, 10.0 / 3},
		// Sentinel's default cold factor on a larger rule.
		{"1000/s over 30s", 1000, 30 * time.Second, 3, 15000, 30000, 2.0 / 1000 / 15000, 1000.0 / 3},
		// Integer divisions truncate: (int)(7.5·10)/2 = 37, (int)(150/4) = 37.
		{"truncation", 7.5, 10 * time.Second, 3, 37, 74, 2.0 / 7.5 / 37, 2.5},
		// A fractional factor and period: ⌊150 / 1.5⌋ = 100, (int)(300/3.5) = 85.
		{"fractional", 100, 1500 * time.Millisecond, 2.5, 100, 185, 1.5 / 100 / 85, 40},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := mustWarmUp(t, c.count, c.period, c.cold)
			if w.WarningToken() != c.warning || w.MaxToken() != c.max {
				t.Errorf("warningToken %d, maxToken %d; want %d, %d", w.WarningToken(), w.MaxToken(), c.warning, c.max)
			}
			if math.Abs(w.Slope()-c.slope) > 1e-15 {
				t.Errorf("slope %v, want %v", w.Slope(), c.slope)
			}
			if w.Stored() != c.max {
				t.Errorf("starts with %d stored tokens, want maxToken %d", w.Stored(), c.max)
			}
			// A full bucket allows count / c.
			if got := w.Rate(t0, 0, true); math.Abs(got-c.coldRate) > 1e-9*c.coldRate {
				t.Errorf("cold rate %v, want %v", got, c.coldRate)
			}
		})
	}
}

func TestWarmUpRateAtStoredTokens(t *testing.T) {
	w := mustWarmUp(t, 10, 10*time.Second, 3)
	for _, c := range []struct {
		stored int64
		want   float64
	}{
		{100, 10.0 / 3}, {75, 5}, {51, 1 / 0.104}, {50, 10}, {49, 10}, {0, 10},
	} {
		if got := w.rateAt(c.stored); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%d stored tokens: rate %v, want %v", c.stored, got, c.want)
		}
	}
}

// saturating models of what a rule passes in a second when offered more
// than it allows.
var saturating = []struct {
	name string
	// passed returns what passes in a second that starts with the
	// controller w in force.
	passed func(w *WarmUp, sec time.Time, rate float64) uint64
	// reproduces tells whether the model gives docs/design.md's ramp.
	reproduces bool
}{
	{"floor of the rate", func(_ *WarmUp, _ time.Time, r float64) uint64 { return uint64(math.Floor(r)) }, true},
	{"Sentinel requests until blocked", func(w *WarmUp, sec time.Time, _ float64) uint64 {
		var n uint64
		for w.CanPass(sec.Add(time.Duration(n)*time.Millisecond), 1, n, 0) {
			n++
		}
		return n
	}, true},
	{"rounded rate", func(_ *WarmUp, _ time.Time, r float64) uint64 { return uint64(math.Round(r)) }, false},
	{"ceiling of the rate", func(_ *WarmUp, _ time.Time, r float64) uint64 { return uint64(math.Ceil(r)) }, false},
}

// The per-second ramp of docs/design.md §5.2 under saturating traffic: the rule
// passes ⌊allowed rate⌋ each second, which is exactly what Sentinel's own
// canPass admits (passQps + 1 ≤ nextUp(rate)).
func TestWarmUpSaturatingRamp(t *testing.T) {
	want := []float64{3.33, 3.47, 3.62, 3.79, 3.97, 4.17, 4.46, 4.81, 5.21, 5.81, 6.58, 7.81, 10, 10, 10, 10, 10, 10, 10, 10}
	wantStored := []int64{100, 97, 94, 91, 88, 85, 81, 77, 73, 68, 63, 57, 50, 40, 40, 40, 40, 40, 40, 40}
	for _, m := range saturating {
		t.Run(m.name, func(t *testing.T) {
			w := mustWarmUp(t, 10, 10*time.Second, 3)
			var passed uint64
			var got []float64
			var stored []int64
			for s := range len(want) {
				sec := t0.Add(time.Duration(s) * time.Second)
				r := w.Rate(sec, passed, true)
				got = append(got, round2(r))
				stored = append(stored, w.Stored())
				passed = m.passed(w, sec, r)
			}
			t.Logf("rates %v", got)
			same := equal(got, want) && equal(stored, wantStored)
			if same != m.reproduces {
				t.Errorf("reproduces the ramp: %v, want %v\nrates  %v\nstored %v", same, m.reproduces, got, stored)
			}
		})
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// warm drives a reference controller to its warm steady state (40 stored
// tokens) and returns it with the time of the last second it synced.
func warm(t *testing.T) (*WarmUp, time.Time) {
	t.Helper()
	w := mustWarmUp(t, 10, 10*time.Second, 3)
	var passed uint64
	sec := t0
	for s := range 15 {
		sec = t0.Add(time.Duration(s) * time.Second)
		passed = uint64(w.Rate(sec, passed, true))
	}
	if w.Stored() != 40 {
		t.Fatalf("warm: %d stored tokens, want 40", w.Stored())
	}
	return w, sec
}

// An idle rule cools down as in Sentinel: no request, no sync; the first
// packet after the idle spell refills the whole gap at once. The rate the
// daemon puts in force meanwhile is the one that first packet would get.
func TestWarmUpCoolDownWhenIdle(t *testing.T) {
	w, last := warm(t)
	// The last warm second passed 10; the idle seconds after it pass 0.
	want := []float64{10, 7.14, 5.56, 4.55, 3.85, 3.33, 3.33, 3.33}
	for i, wr := range want {
		// Ticks every 50 ms of idle second i+1: nothing arrives.
		for tick := range 20 {
			now := last.Add(time.Duration(i+1)*time.Second + time.Duration(tick)*50*time.Millisecond)
			prev := uint64(0)
			if i == 0 {
				prev = 10
			}
			if got := round2(w.Rate(now, prev, false)); got != wr {
				t.Fatalf("idle second %d tick %d: rate %v, want %v", i+1, tick, got, wr)
			}
		}
		if w.Stored() != 40 {
			t.Fatalf("idle second %d: stored %d changed without traffic", i+1, w.Stored())
		}
	}
	// A packet arrives: the sync commits the refill, the bucket is cold.
	now := last.Add(time.Duration(len(want)+1) * time.Second)
	if got := w.Rate(now, 0, true); round2(got) != 3.33 || w.Stored() != w.MaxToken() {
		t.Errorf("first packet after idling: rate %v with %d stored, want 3.33 with %d", got, w.Stored(), w.MaxToken())
	}
}

// Light traffic, below (int)count / c = 3 per second, also cools the
// bucket: 2 passed per second refill by 10 and spend 2.
func TestWarmUpCoolDownUnderLightTraffic(t *testing.T) {
	w, last := warm(t)
	wantStored := []int64{40, 48, 56, 64, 72, 80, 88, 96, 98, 98}
	prev := uint64(10)
	for i, ws := range wantStored {
		w.Rate(last.Add(time.Duration(i)*time.Second), prev, true)
		if w.Stored() != ws {
			t.Fatalf("second %d: stored %d, want %d", i, w.Stored(), ws)
		}
		prev = 2
	}
	if got := round2(w.Rate(last.Add(20*time.Second), 2, true)); got != 3.42 {
		t.Errorf("rate %v, want 3.42 (98 stored)", got)
	}
	// Traffic at the threshold (3 per second) does not cool a bucket that
	// is above the warning line.
	w.stored = 60
	w.Rate(last.Add(21*time.Second), 3, true)
	if w.Stored() != 57 {
		t.Errorf("3 passed above the warning line: stored %d, want 57", w.Stored())
	}
}

// Sentinel's coolDownTokens refills neither below nor above the warning
// line when the tokens sit exactly on it. Synced every second while idle
// (seen = true on every tick), the bucket would stay there and never cool
// down; this is why Rate takes seen.
func TestWarmUpSyncingEverySecondWhileIdleSticksAtWarningLine(t *testing.T) {
	w, last := warm(t)
	for s := 1; s <= 20; s++ {
		prev := uint64(0)
		if s == 1 {
			prev = 10
		}
		w.Rate(last.Add(time.Duration(s)*time.Second), prev, true)
	}
	if w.Stored() != w.WarningToken() {
		t.Errorf("stored %d, want it stuck at the warning line %d", w.Stored(), w.WarningToken())
	}
}

// Sentinel's WarmUpControllerTest.testWarmUp: count 10, period 10 s, cold
// factor 3. With the bucket full, 8 passed this second and 1 the previous
// one, a request is blocked (the cold rate is 3.33); with 1 passed it
// passes. After ten seconds of 10 passed per second the bucket has drained
// below the warning line: with 8 passed a request passes, with 10 it is
// blocked.
func TestWarmUpSentinelSequence(t *testing.T) {
	w := mustWarmUp(t, 10, 10*time.Second, 3)
	clock := NewFakeClock(t0.Add(123 * time.Millisecond))
	steps := []struct {
		name         string
		passed, prev uint64
		want         bool
	}{
		{"full, 8 passed", 8, 1, false},
		{"full, 1 passed", 1, 1, true},
	}
	for _, s := range steps {
		if got := w.CanPass(clock.Now(), 1, s.passed, s.prev); got != s.want {
			t.Errorf("%s: canPass %v, want %v", s.name, got, s.want)
		}
	}
	for range 100 {
		w.CanPass(clock.Advance(100*time.Millisecond), 1, 1, 10)
	}
	for _, s := range []struct {
		name         string
		passed, prev uint64
		want         bool
	}{
		{"drained, 8 passed", 8, 10, true},
		{"drained, 10 passed", 10, 10, false},
	} {
		if got := w.CanPass(clock.Now(), 1, s.passed, s.prev); got != s.want {
			t.Errorf("%s: canPass %v, want %v", s.name, got, s.want)
		}
	}
	// Sentinel's state at the end: 100 − 1 = 99 at the first sync, then
	// −10 a second down to 49, where refill (+10) and use (−10) balance.
	if w.Stored() != 49 {
		t.Errorf("stored %d, want 49", w.Stored())
	}
}

// Within a second only the first sync counts, however often the daemon
// asks.
func TestWarmUpSyncsOncePerSecond(t *testing.T) {
	w := mustWarmUp(t, 10, 10*time.Second, 3)
	for tick := range 20 {
		w.Rate(t0.Add(time.Duration(tick)*50*time.Millisecond), 5, true)
	}
	if w.Stored() != 95 {
		t.Errorf("stored %d after one second of ticks, want 95", w.Stored())
	}
	// A clock that steps back syncs nothing until it passes the last sync.
	w.Rate(t0.Add(-3*time.Second), 5, true)
	if w.Stored() != 95 {
		t.Errorf("stored %d after the clock stepped back, want 95", w.Stored())
	}
	// A previous second that passed more than is stored empties it.
	w.Rate(t0.Add(time.Second), 1000, true)
	if w.Stored() != 0 || w.Rate(t0.Add(time.Second), 0, true) != 10 {
		t.Errorf("stored %d, want 0 at rate 10", w.Stored())
	}
}

func TestNewWarmUpRejects(t *testing.T) {
	for _, c := range []struct {
		name   string
		count  float64
		period time.Duration
		cold   float64
	}{
		{"zero count", 0, time.Second, 3},
		{"NaN count", math.NaN(), time.Second, 3},
		{"infinite count", math.Inf(1), time.Second, 3},
		{"zero period", 10, 0, 3},
		{"negative period", 10, -time.Second, 3},
		{"cold factor 1", 10, time.Second, 1},
		{"cold factor below 1", 10, time.Second, 0.5},
		{"NaN cold factor", 10, time.Second, math.NaN()},
		{"infinite cold factor", 10, time.Second, math.Inf(1)},
		{"no tokens to spend", 1, time.Second, 3}, // (int)(2·1·1/4) = 0
		{"too many tokens", 1e9, 1e8 * time.Second, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewWarmUp(c.count, c.period, c.cold)
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("NewWarmUp(%v, %v, %v): error %v, want ErrInvalid", c.count, c.period, c.cold, err)
			}
		})
	}
}

// sentinelWarmUp is a reference model of Sentinel's WarmUpController state
// for an integral period and cold factor: stored tokens starting at 0 and
// lastFilledTime at 0, synced by the first request of each second.
type sentinelWarmUp struct {
	count              float64
	cold               int64
	warning, max       int64
	slope              float64
	stored, lastFilled int64
}

func newSentinelWarmUp(count float64, periodSec, cold int64) *sentinelWarmUp {
	s := &sentinelWarmUp{count: count, cold: cold}
	s.warning = int64(float64(periodSec)*count) / (cold - 1)
	s.max = s.warning + int64(2*float64(periodSec)*count/(1.0+float64(cold)))
	s.slope = (float64(cold) - 1.0) / count / float64(s.max-s.warning)
	return s
}

func (s *sentinelWarmUp) canPass(nowMs int64, acquire, passQps, prevQps int64) bool {
	cur := nowMs - nowMs%1000
	if cur > s.lastFilled {
		v := s.stored
		if v < s.warning {
			v = int64(float64(v) + float64(cur-s.lastFilled)*s.count/1000)
		} else if v > s.warning && prevQps < int64(s.count)/s.cold {
			v = int64(float64(v) + float64(cur-s.lastFilled)*s.count/1000)
		}
		s.stored = min(v, s.max) - prevQps
		if s.stored < 0 {
			s.stored = 0
		}
		s.lastFilled = cur
	}
	if s.stored >= s.warning {
		q := math.Nextafter(1.0/(float64(s.stored-s.warning)*s.slope+1.0/s.count), math.Inf(1))
		return float64(passQps+acquire) <= q
	}
	return float64(passQps+acquire) <= s.count
}

// A cold factor above 3 with a small count × period puts the warning line
// at 0 tokens (count 3, period 1 s, factor 5: warningToken 0, maxToken 1).
// Sentinel's bucket then stays empty, on the line, and it passes count a
// second from the first request on; so must WarmUp (it used to start with
// 1 stored token and allow count / c, blocking Sentinel's second request).
// Also the reference case, which starts cold in both.
func TestWarmUpWarningTokenZeroAsSentinel(t *testing.T) {
	for _, c := range []struct {
		count         float64
		period, cold  int64
		offeredPerSec int64
	}{
		{3, 1, 5, 10},
		{2, 2, 6, 5},
		{10, 10, 3, 20}, // the reference: warning line 50, cold
	} {
		w := mustWarmUp(t, c.count, time.Duration(c.period)*time.Second, float64(c.cold))
		s := newSentinelWarmUp(c.count, c.period, c.cold)
		if w.WarningToken() != s.warning || w.MaxToken() != s.max {
			t.Fatalf("count %v: tokens %d/%d, Sentinel %d/%d", c.count, w.WarningToken(), w.MaxToken(), s.warning, s.max)
		}
		var got, want []int64
		var prev int64
		for sec := range int64(20) {
			var pw, ps int64
			for i := range c.offeredPerSec {
				now := t0.Add(time.Duration(sec)*time.Second + time.Duration(i)*time.Second/time.Duration(c.offeredPerSec))
				if w.CanPass(now, 1, uint64(pw), uint64(prev)) {
					pw++
				}
				if s.canPass(now.UnixMilli(), 1, ps, prev) {
					ps++
				}
			}
			got, want = append(got, pw), append(want, ps)
			prev = ps
		}
		if !equal(got, want) {
			t.Errorf("count %v period %ds factor %d: passed per second %v, Sentinel %v", c.count, c.period, c.cold, got, want)
		}
		if s.warning == 0 && got[0] != int64(c.count) {
			t.Errorf("count %v: first second passed %d, want the full count", c.count, got[0])
		}
		if s.warning == 0 {
			if r := mustWarmUp(t, c.count, time.Duration(c.period)*time.Second, float64(c.cold)).Rate(t0, 0, true); r != c.count {
				t.Errorf("count %v: rate %v from the start, want the count", c.count, r)
			}
		}
	}
}
