package control

import (
	"fmt"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Paced is Sentinel's ThrottlingController admission test (docs/design.md §5.3)
// for packets: admitted packets are spaced 1/rate apart; a packet arriving
// before the next free slot waits for it, and one whose wait would exceed
// the maximum queueing time is rejected. In Sentinel's terms, with
// latestPassedTime L and cost 1/rate:
//
//	if L + cost ≤ now:            admit, wait 0, L = now
//	else if L + cost − now > max: reject
//	else:                         admit, wait L + cost − now, L = L + cost
//
// Sentinel once rounded cost to whole milliseconds, which silently turned
// pacing off above 1000/s (docs/design.md §9). Paced keeps time in the kernel's
// units of 2^-6 ns and takes cost and the queueing bound from the bucket
// that the daemon writes for queue: none, dataplane.NewBucket(rate, rate ×
// maxQueue + 1, false): cost is the bucket's Inc(1), 1/rate rounded to
// 2^-6 ns, and the bound its Tol − Inc(1), which is maxQueue as the kernel
// represents it (Tol keeps room for every whole packet of the burst). So
// Paced and the kernel's GCRA admit the same packets, which the tests check
// on random traces; where 1/rate is a whole number of nanoseconds (rates 1,
// 10, 1000, 1e6, 1e7 per second, ...) both are exact, and elsewhere the
// bucket's own tests bound how far its rate is from the configured one.
//
// A Paced is not safe for concurrent use.
type Paced struct {
	bucket   dataplane.Bucket
	cost     uint64 // emission interval, 2^-6 ns
	maxQueue uint64 // longest wait, 2^-6 ns
	// latest is Sentinel's latestPassedTime in 2^-6 ns of the Unix clock,
	// wrapping like the kernel's clock; started is false until the first
	// packet (Sentinel starts latestPassedTime at −1).
	latest  uint64
	started bool
}

// NewPaced returns the pacer for rate packets per second and a maximum
// queueing time.
func NewPaced(rate float64, maxQueue time.Duration) (*Paced, error) {
	if maxQueue <= 0 {
		return nil, fmt.Errorf("new paced: %w", invalid("max queueing time %v: must be positive", maxQueue))
	}
	b, err := dataplane.NewBucket(rate, PacedBurst(rate, maxQueue), false)
	if err != nil {
		return nil, fmt.Errorf("build paced bucket: %w", err)
	}
	cost := b.Inc(1)
	if cost == 0 || b.Tol < cost {
		return nil, fmt.Errorf("new paced: %w", invalid("rate %v: interval below the kernel's time unit", rate))
	}
	return &Paced{bucket: b, cost: cost, maxQueue: b.Tol - cost}, nil
}

// PacedBurst is the burst of the queue: none bucket that admits what a
// pacer of this rate and maximum queueing time admits: the packet that
// passes at once plus rate × maxQueue that may wait (config's
// Rule.EffectiveBurst for packets).
func PacedBurst(rate float64, maxQueue time.Duration) float64 {
	return rate*maxQueue.Seconds() + 1
}

// Bucket is the kernel bucket equivalent to p.
func (p *Paced) Bucket() dataplane.Bucket { return p.bucket }

// Interval is the spacing of admitted packets, rounded to the nanosecond.
func (p *Paced) Interval() time.Duration { return unitsToDuration(p.cost) }

// Admit runs the admission test for one packet arriving at now. wait is
// how long the packet waits for its slot, rounded up to the nanosecond; it
// is zero for a rejected packet.
func (p *Paced) Admit(now time.Time) (ok bool, wait time.Duration) {
	t := uint64(now.UnixNano()) << dataplane.TimeShift
	if !p.started {
		p.started = true
		p.latest = t
		return true, 0
	}
	// ahead is expectedTime − now. Like the kernel, a slot more than
	// StaleAhead ahead is taken for a clock that wrapped or jumped back.
	ahead := int64(p.latest + p.cost - t)
	if ahead <= 0 || uint64(ahead) > dataplane.StaleAhead {
		p.latest = t
		return true, 0
	}
	if uint64(ahead) > p.maxQueue {
		return false, 0
	}
	p.latest += p.cost
	return true, unitsToDuration(uint64(ahead))
}

// unitsToDuration converts 2^-6 ns to a duration, rounding up.
func unitsToDuration(u uint64) time.Duration {
	const unit = 1 << dataplane.TimeShift
	return time.Duration((u + unit - 1) / unit)
}
