package dataplane

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// saturate offers packets of the given cost every step ns for d ns and
// returns how many the bucket admitted.
func saturate(b Bucket, cost, step, d uint64) int {
	const t0 = 1_000_000_000 // start away from zero, as the kernel's clock does
	tat := uint64(t0) << TimeShift
	n := 0
	for now := uint64(t0); now <= t0+d; now += step {
		if b.GCRA(&tat, now, cost) {
			n++
		}
	}
	return n
}

// The Go model admits rate x time + burst within one packet at every
// packet rate, offered at twice the rate.
func TestBucketModelPacketAccuracy(t *testing.T) {
	const seconds = 10
	for _, rate := range []float64{1, 999, 1200, 5000, 1e6} {
		burst := 10.0
		b, err := NewBucket(rate, burst, false)
		if err != nil {
			t.Fatal(err)
		}
		step := uint64(0.5e9 / rate)
		got := saturate(b, 1, step, seconds*1e9)
		want := rate*seconds + burst
		if math.Abs(float64(got)-want) > 1 {
			t.Errorf("rate %v: admitted %d, want %v within 1", rate, got, want)
		}
		if r := b.Rate(); math.Abs(r-rate)/rate > 1e-9 {
			t.Errorf("rate %v: bucket says %v", rate, r)
		}
	}
}

func TestBucketModelByteAccuracy(t *testing.T) {
	for _, bps := range []float64{1e9, 100e9} {
		rate := bps / 8
		for _, size := range []uint64{64, 1500} {
			b, err := NewBucket(rate, 64*1024, true)
			if err != nil {
				t.Fatal(err)
			}
			// Offer 1.5x the rate for 100 ms.
			step := uint64(float64(size) / rate * 1e9 / 1.5)
			if step == 0 {
				step = 1
			}
			d := uint64(100e6)
			got := float64(saturate(b, size, step, d)) * float64(size)
			want := rate*float64(d)/1e9 + 64*1024
			if math.Abs(got-want)/want > 0.001 {
				t.Errorf("%v bit/s, %d-byte packets: admitted %v bytes, want %v within 0.1%%", bps, size, got, want)
			}
		}
	}
}

func TestBucketRejectsUnrepresentable(t *testing.T) {
	for _, c := range []struct {
		rate, burst float64
		bytes       bool
	}{
		{0, 1, false}, {-1, 1, false}, {math.NaN(), 1, false}, {math.Inf(1), 1, false},
		{1, 0, false}, {1, math.Inf(1), false},
		{1, 86401, false},   // a burst longer than a day
		{10, 1e9, true},     // byte rate below 15 B/s: mult would overflow c*mult
		{1e-6, 1e-6, false}, // interval beyond 64 bits of 2^-22 ns
	} {
		if _, err := NewBucket(c.rate, c.burst, c.bytes); err == nil {
			t.Errorf("NewBucket(%v, %v, %v): no error", c.rate, c.burst, c.bytes)
		}
	}
}

// A burst of b packets fits whole, whatever the rounding of the interval.
func TestBucketBurstFitsWhole(t *testing.T) {
	for _, rate := range []float64{3, 7, 999, 1200, 3333, 1e7} {
		for _, burst := range []float64{1, 2, 5, 17, 1000} {
			b, err := NewBucket(rate, burst, false)
			if err != nil {
				t.Fatal(err)
			}
			tat := uint64(1e9) << TimeShift
			n := 0
			for range int(burst) + 5 {
				if b.GCRA(&tat, 1e9, 1) {
					n++
				}
			}
			if n != int(burst) {
				t.Errorf("rate %v burst %v: %d admitted at one instant", rate, burst, n)
			}
		}
	}
}

// The state wraps: a bucket near the end of the 64-bit time range keeps
// working across the wrap, and a TAT left far in the past is a full bucket.
func TestBucketWraps(t *testing.T) {
	b, err := NewBucket(1000, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	// now<<6 wraps at 2^58 ns; start 5 ms before.
	start := uint64(1)<<58 - 5_000_000
	tat := start << TimeShift // a fresh bucket: full at start
	n := 0
	for now := start; now < start+10_000_000; now += 100_000 {
		if b.GCRA(&tat, now, 1) {
			n++
		}
	}
	if n < 10 || n > 11 {
		t.Errorf("across the wrap: admitted %d in 10 ms at 1000/s, want 10 or 11", n)
	}
	// Idle for 5 years: full again, not drained.
	tat = 1e9 << TimeShift
	if !b.GCRA(&tat, 1e9+5*365*24*3600*1e9, 1) {
		t.Error("after 5 idle years the bucket is not full")
	}
}

// TestScaleAhead: the kernel's 64-bit rescale of a TAT's lead (bucket.h,
// xl_units_scale) is within 2^-30 of to (plus a unit) of the exact
// ahead·to/from, never above to, for tolerances up to MaxBurstTime.
func TestScaleAhead(t *testing.T) {
	maxTol := uint64(MaxBurstTime.Nanoseconds()) << TimeShift
	rng := rand.New(rand.NewPCG(26, 26))
	for range 200000 {
		from := 1 + rng.Uint64N(maxTol)
		to := 1 + rng.Uint64N(maxTol)
		if rng.IntN(4) == 0 {
			from = 1 + rng.Uint64N(1<<20)
		}
		ahead := rng.Uint64N(from + 1)
		got := ScaleAhead(ahead, from, to)
		exact := new(big.Int).Mul(new(big.Int).SetUint64(ahead), new(big.Int).SetUint64(to))
		exact.Quo(exact, new(big.Int).SetUint64(from))
		e := exact.Uint64()
		if got > to || math.Abs(float64(e)-float64(got)) > float64(to)/(1<<30)+1 {
			t.Fatalf("ScaleAhead(%d, %d, %d) = %d, exact %d", ahead, from, to, got, e)
		}
	}
	if got := ScaleAhead(5, 5, 7); got != 7 {
		t.Errorf("a lead of the whole tolerance: %d, want the whole new one 7", got)
	}
	if got := ScaleAhead(9, 5, 7); got != 7 {
		t.Errorf("a lead beyond the tolerance: %d, want it clamped to 7", got)
	}
}

// TestUnitsClaim: zeroed units (state from before the field) are taken as
// the settings in force, a full bucket stays full, and a drained one stays
// drained under the new tolerance.
func TestUnitsClaim(t *testing.T) {
	const now = 1 << 40
	units, tat := uint64(0), uint64(now+1000)
	UnitsClaim(&units, &tat, nil, 500, now)
	if units != 500 || tat != now+1000 {
		t.Errorf("unknown units: units %d tat %d, want 500 and the TAT unchanged", units, tat)
	}
	units, tat = 1000, now+1000
	UnitsClaim(&units, &tat, nil, 100, now)
	if units != 100 || tat != now+100 {
		t.Errorf("drained, tolerance 1000 to 100: units %d tat now+%d, want 100 and now+100", units, int64(tat-now))
	}
	units, tat = 1000, now-5
	UnitsClaim(&units, &tat, nil, 100, now)
	if tat != now-5 {
		t.Errorf("full: tat now%+d, want unchanged", int64(tat-now))
	}
}
