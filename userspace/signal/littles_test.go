package signal

import (
	"math"
	"testing"
	"time"
)

func TestLittles(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	for _, tc := range []struct {
		depth, rate float64
		want        time.Duration
		ok          bool
	}{
		{10, 100, 100 * time.Millisecond, true},
		{1, 1000, time.Millisecond, true},
		{2.5, 50, 50 * time.Millisecond, true},
		{0, 0, 0, true},   // empty queue, no arrivals: nobody waits
		{0, 100, 0, true}, // empty queue
		{5, 0, 0, false},  // a queue but no arrivals: stale, not infinite
		{5, inf, 0, true}, // infinitely fast arrivals
		{1e12, 1e-9, math.MaxInt64, true},
		{-1, 10, 0, false},
		{nan, 10, 0, false},
		{inf, 10, 0, false},
		{5, -1, 0, false},
		{5, nan, 0, false},
		{0, nan, 0, false},
		{0, -1, 0, false},
	} {
		got, ok := Littles(tc.depth, tc.rate)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Littles(%v, %v) = %v, %v; want %v, %v", tc.depth, tc.rate, got, ok, tc.want, tc.ok)
		}
	}
}
