package control

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

func mustPaced(t *testing.T, rate float64, q time.Duration) *Paced {
	t.Helper()
	p, err := NewPaced(rate, q)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// docs/design.md §5.3's golden case: rate 10/s, queue 500 ms, 10 packets at the
// same instant: 6 admitted with waits 0, 100, ..., 500 ms, 4 rejected.
func TestPacedGolden(t *testing.T) {
	p := mustPaced(t, 10, 500*time.Millisecond)
	var waits []time.Duration
	rejected := 0
	for range 10 {
		ok, wait := p.Admit(t0)
		if !ok {
			rejected++
			continue
		}
		waits = append(waits, wait)
	}
	want := []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond}
	if !equal(waits, want) || rejected != 4 {
		t.Errorf("admitted with waits %v and rejected %d; want %v and 4", waits, rejected, want)
	}
	// The queue drains at the rate: 50 ms later one slot is free again
	// (wait 500 ms); 600 ms after the burst the queue is empty.
	for _, c := range []struct {
		at   time.Duration
		ok   bool
		wait time.Duration
	}{
		{50 * time.Millisecond, false, 0},
		{100 * time.Millisecond, true, 500 * time.Millisecond},
		{700 * time.Millisecond, true, 0},
		{700 * time.Millisecond, true, 100 * time.Millisecond},
	} {
		ok, wait := p.Admit(t0.Add(c.at))
		if ok != c.ok || wait != c.wait {
			t.Errorf("at +%v: admitted %v with wait %v, want %v with %v", c.at, ok, wait, c.ok, c.wait)
		}
	}
}

// The same test at every rate up to 10 Mpps admits exactly rate × queue +
// 1 simultaneous packets with waits k/rate, to the nanosecond: no rounding
// of the interval to milliseconds (docs/design.md §9).
func TestPacedExactAtEveryRate(t *testing.T) {
	for _, rate := range []float64{1, 10, 1e3, 1e4, 1e6, 1e7} {
		interval := time.Duration(1e9 / rate)
		for _, q := range []time.Duration{5 * interval, 500 * time.Millisecond} {
			t.Run(fmt.Sprintf("rate %g queue %v", rate, q), func(t *testing.T) {
				p := mustPaced(t, rate, q)
				if p.Interval() != interval {
					t.Errorf("interval %v, want %v", p.Interval(), interval)
				}
				want := int(math.Floor(rate*q.Seconds())) + 1
				admitted := 0
				for k := range want + 10 {
					ok, wait := p.Admit(t0)
					if ok != (k < want) {
						t.Fatalf("packet %d: admitted %v, want %v", k, ok, k < want)
					}
					if ok {
						admitted++
						if wait != time.Duration(k)*interval {
							t.Fatalf("packet %d: wait %v, want %v", k, wait, time.Duration(k)*interval)
						}
					}
				}
				if admitted != want {
					t.Errorf("admitted %d, want %d", admitted, want)
				}
			})
		}
	}
}

// Spaced exactly 1/rate apart, every packet passes at once, at every rate.
func TestPacedSpacedArrivals(t *testing.T) {
	for _, rate := range []float64{1, 1e3, 1e6, 1e7} {
		interval := time.Duration(1e9 / rate)
		p := mustPaced(t, rate, 10*interval)
		for k := range 1000 {
			if ok, wait := p.Admit(t0.Add(time.Duration(k) * interval)); !ok || wait != 0 {
				t.Fatalf("rate %g packet %d: admitted %v with wait %v, want at once", rate, k, ok, wait)
			}
		}
	}
}

// For queue: none the kernel's bucket with burst rate × queue + 1 admits
// exactly what Paced admits, on random traces at rates from 1/s to 10
// Mpps: Poisson arrivals above and below the rate, bursts of simultaneous
// packets with idle gaps up to a day, and arrivals aimed at the nanosecond
// around both tests' boundaries.
func TestPacedMatchesKernelBucket(t *testing.T) {
	rates := []float64{1, 7, 10, 333, 1e3, 2999, 1e4, 123457, 1e6, 3e6, 1e7}
	// Queues in intervals 1/rate: bursts of 1.5 to 1001.25 packets, whole
	// and fractional, short enough for the traces to fill them.
	queues := []float64{0.5, 1, 5.5, 50, 1000.25}
	const arrivals = 5000
	for _, rate := range rates {
		for _, k := range queues {
			q := time.Duration(math.Round(k * 1e9 / rate))
			for _, gen := range traceGenerators {
				name := fmt.Sprintf("rate %g queue %v %s", rate, q, gen.name)
				t.Run(name, func(t *testing.T) {
					p := mustPaced(t, rate, q)
					b, err := dataplane.NewBucket(rate, rate*q.Seconds()+1, false)
					if err != nil {
						t.Fatal(err)
					}
					if b != p.Bucket() {
						t.Fatalf("Paced's bucket %+v, NewBucket's %+v", p.Bucket(), b)
					}
					rng := rand.New(rand.NewPCG(uint64(rate*1e3), uint64(q)))
					now := uint64(t0.UnixNano())
					tat := now << dataplane.TimeShift // a new bucket starts at now
					pass, drop := 0, 0
					for i := range arrivals {
						now = gen.next(rng, p, now)
						okKernel := b.GCRA(&tat, now, 1)
						okPaced, _ := p.Admit(time.Unix(0, int64(now)))
						if okKernel != okPaced {
							t.Fatalf("arrival %d at %d ns: kernel %v, Paced %v", i, now, okKernel, okPaced)
						}
						if okPaced {
							pass++
						} else {
							drop++
						}
					}
					if gen.mustDrop && drop == 0 {
						t.Errorf("trace dropped nothing (%d passed): it tests nothing", pass)
					}
				})
			}
		}
	}
}

var traceGenerators = []struct {
	name string
	// next returns the next arrival time (ns) after now; it may look at
	// the pacer's state to aim at its boundaries.
	next     func(rng *rand.Rand, p *Paced, now uint64) uint64
	mustDrop bool
}{
	{"poisson at twice the rate", func(rng *rand.Rand, p *Paced, now uint64) uint64 {
		return now + uint64(rng.ExpFloat64()*float64(p.cost)/64/2)
	}, true},
	{"poisson at half the rate", func(rng *rand.Rand, p *Paced, now uint64) uint64 {
		return now + uint64(rng.ExpFloat64()*float64(p.cost)/64*2)
	}, false},
	{"bursts and idle gaps", func(rng *rand.Rand, p *Paced, now uint64) uint64 {
		// Bursts of simultaneous packets, on average a little more than
		// the queue holds, separated by gaps of up to twice the queueing
		// time and now and then by up to a day of silence.
		burst := int(p.maxQueue/p.cost) + 2
		switch {
		case rng.IntN(burst) != 0:
			return now
		case rng.IntN(100) != 0:
			return now + rng.Uint64N(2*p.maxQueue>>dataplane.TimeShift+1)
		default:
			return now + rng.Uint64N(uint64(24*time.Hour))
		}
	}, true},
	{"at the boundaries", func(rng *rand.Rand, p *Paced, now uint64) uint64 {
		// The next slot or the last instant the queue bound admits, give
		// or take a nanosecond: the ties of both tests.
		edge := p.latest + p.cost
		if rng.IntN(2) == 0 {
			edge -= p.maxQueue
		}
		ns := edge>>dataplane.TimeShift + uint64(rng.IntN(3)) - 1
		if int64(ns-now) < 0 {
			return now
		}
		return ns
	}, true},
}

func TestNewPacedRejects(t *testing.T) {
	for _, c := range []struct {
		rate float64
		q    time.Duration
	}{
		{0, time.Second}, {-1, time.Second}, {math.NaN(), time.Second}, {math.Inf(1), time.Second},
		{10, 0}, {10, -time.Millisecond},
		{1, 25 * time.Hour}, // a burst longer than the kernel allows
	} {
		if _, err := NewPaced(c.rate, c.q); err == nil {
			t.Errorf("NewPaced(%v, %v): no error", c.rate, c.q)
		} else if c.q <= 0 && !errors.Is(err, ErrInvalid) {
			t.Errorf("NewPaced(%v, %v): error %v, want ErrInvalid", c.rate, c.q, err)
		}
	}
}
