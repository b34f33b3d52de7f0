package signal

import (
	"math"
	"time"
)

// Littles applies Little's law, W = L / λ: the mean time an item waits in a
// queue holding depth items on average, with arrivals (equal to departures
// in steady state) at rate items per second. ok is false when no waiting
// time can be inferred and the sample is to be treated as stale:
//
//   - a queue with no arrivals (rate 0) says nothing about how long its
//     items wait (they may wait forever), so it is stale, not infinite;
//   - a negative, NaN or infinite depth, or a negative or NaN rate.
//
// An empty queue waits 0 whatever the (valid) rate. A wait beyond the range of
// time.Duration saturates at its maximum.
func Littles(depth, rate float64) (wait time.Duration, ok bool) {
	switch {
	case math.IsNaN(depth) || math.IsInf(depth, 0) || depth < 0,
		math.IsNaN(rate) || rate < 0:
		return 0, false
	case depth == 0:
		return 0, true
	case rate == 0:
		return 0, false
	}
	ns := depth / rate * float64(time.Second)
	if ns >= math.MaxInt64 {
		return math.MaxInt64, true
	}
	return time.Duration(ns), true
}
