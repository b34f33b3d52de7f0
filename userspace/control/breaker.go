package control

import (
	"fmt"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// BreakerState is a circuit breaker's state.
type BreakerState uint8

const (
	// BreakerClosed: new connections pass; outcomes are counted.
	BreakerClosed BreakerState = iota
	// BreakerOpen: every new connection is dropped until the retry
	// timeout has passed.
	BreakerOpen
	// BreakerHalfOpen: a few probe connections pass; their outcomes
	// close the breaker or open it again.
	BreakerHalfOpen
)

var breakerStateNames = [...]string{"closed", "open", "half_open"}

func (s BreakerState) String() string {
	if int(s) < len(breakerStateNames) {
		return breakerStateNames[s]
	}
	return fmt.Sprintf("BreakerState(%d)", uint8(s))
}

// Transition is a change of state, with why it happened.
type Transition struct {
	From, To BreakerState
	Reason   string
}

// breakerBuckets is how many buckets the statistics window is cut into: a
// sliding window (Sentinel's LeapArray) whose edge moves in steps of a tenth
// of the window, so a burst of failures is not forgotten all at once.
const breakerBuckets = 10

type breakerBucket struct {
	start int64 // bucket start, ns since the breaker's epoch; -1 empty
	o     Outcomes
}

// Breaker is Sentinel's circuit breaker (docs/design.md §5.8) for one rule,
// driven by the control loop once per tick:
//
//   - CLOSED: each tick's outcomes go into a sliding window of Window. When
//     the window holds at least MinRequests calls and the error ratio
//     exceeds ErrorRatio, or holds at least MinRequests timed calls and the
//     slow ratio exceeds SlowRatio, the breaker opens. As in Sentinel, a
//     ratio equal to its threshold does not trip, except a threshold of 1,
//     which trips when every call failed (or was slow).
//   - OPEN: outcomes are ignored; at the first tick RetryTimeout after it
//     opened, the breaker goes HALF_OPEN.
//   - HALF_OPEN: the gate lets HalfOpenProbes new connections through per
//     round; any error or slow call opens the breaker again for
//     RetryTimeout; HalfOpenProbes successful calls close it with an empty
//     window. A round that is still undecided after Window gives way to a
//     new round (another HalfOpenProbes connections), so probes lost on
//     the way never leave the breaker stuck.
//
// A Breaker is not safe for concurrent use.
type Breaker struct {
	cfg       BreakerParams
	epoch     time.Time
	bucketLen int64
	buckets   [breakerBuckets]breakerBucket

	state      BreakerState
	retryAt    time.Time // OPEN: when to go HALF_OPEN
	roundStart time.Time // HALF_OPEN: when the current round began
	succeeded  int       // HALF_OPEN: successful probes so far
	round      uint32
}

// NewBreaker returns a closed breaker; now starts its window.
func NewBreaker(cfg BreakerParams, now time.Time) (*Breaker, error) {
	switch {
	case !(cfg.ErrorRatio >= 0 && cfg.ErrorRatio <= 1):
		return nil, invalid("new breaker: error ratio %v: must be in [0, 1]", cfg.ErrorRatio)
	case !(cfg.SlowRatio >= 0 && cfg.SlowRatio <= 1):
		return nil, invalid("new breaker: slow ratio %v: must be in [0, 1]", cfg.SlowRatio)
	case cfg.ErrorRatio == 0 && cfg.SlowRatio == 0:
		return nil, invalid("new breaker: neither an error ratio nor a slow ratio")
	case cfg.SlowRatio > 0 && cfg.SlowLatency <= 0:
		return nil, invalid("new breaker: slow latency %v: must be positive", cfg.SlowLatency)
	case cfg.MinRequests < 1:
		return nil, invalid("new breaker: min requests %d: must be at least 1", cfg.MinRequests)
	case cfg.Window <= 0:
		return nil, invalid("new breaker: window %v: must be positive", cfg.Window)
	case cfg.RetryTimeout <= 0:
		return nil, invalid("new breaker: retry timeout %v: must be positive", cfg.RetryTimeout)
	case cfg.HalfOpenProbes < 1:
		return nil, invalid("new breaker: half-open probes %d: must be at least 1", cfg.HalfOpenProbes)
	}
	// Rounds start from the clock, not from 0, so that a restarted daemon
	// does not reuse a round whose probes the kernel already counted.
	b := &Breaker{cfg: cfg, epoch: now, bucketLen: max(int64(cfg.Window)/breakerBuckets, 1), round: uint32(now.UnixMilli())}
	b.resetWindow()
	return b, nil
}

// State is the breaker's state.
func (b *Breaker) State() BreakerState { return b.state }

// Round is the number of the current half-open round (it changes at every
// new round, so the kernel starts counting probes afresh).
func (b *Breaker) Round() uint32 { return b.round }

// Gate is what the kernel must do to new connections in the current state.
func (b *Breaker) Gate() dataplane.Gate {
	switch b.state {
	case BreakerOpen:
		return dataplane.Gate{Drop: dataplane.GateAll, Round: b.round}
	case BreakerHalfOpen:
		return dataplane.Gate{Drop: dataplane.GateAll, Probes: uint32(min(b.cfg.HalfOpenProbes, 1<<31)), Round: b.round}
	}
	return dataplane.Gate{}
}

// Step feeds one tick's outcomes at time now and returns the transition it
// caused, if any. Outcomes that are not consistent (negative, more errors
// than requests) are ignored.
func (b *Breaker) Step(now time.Time, o Outcomes) (Transition, bool) {
	if !o.Valid() {
		o = Outcomes{}
	}
	switch b.state {
	case BreakerOpen:
		// What completes while OPEN was admitted before it opened, or
		// did not pass the gate at all: it says nothing new.
		if now.Before(b.retryAt) {
			return Transition{}, false
		}
		b.newRound(now)
		return b.move(BreakerHalfOpen, fmt.Sprintf("retry timeout %v passed", b.cfg.RetryTimeout)), true
	case BreakerHalfOpen:
		if o.Errors > 0 || o.Slow > 0 {
			b.retryAt = now.Add(b.cfg.RetryTimeout)
			return b.move(BreakerOpen, fmt.Sprintf("probe failed (%d errors, %d slow of %d)", o.Errors, o.Slow, o.Requests)), true
		}
		b.succeeded += o.Requests
		if b.succeeded >= b.cfg.HalfOpenProbes {
			b.resetWindow()
			return b.move(BreakerClosed, fmt.Sprintf("%d probes succeeded", b.succeeded)), true
		}
		if now.Sub(b.roundStart) >= b.cfg.Window {
			b.newRound(now)
		}
		return Transition{}, false
	}
	s := b.add(now, o)
	if reason, trip := b.exceeded(s); trip {
		b.retryAt = now.Add(b.cfg.RetryTimeout)
		return b.move(BreakerOpen, reason), true
	}
	return Transition{}, false
}

func (b *Breaker) exceeded(s Outcomes) (string, bool) {
	over := func(n, of int, threshold float64) (float64, bool) {
		if threshold <= 0 || of < b.cfg.MinRequests {
			return 0, false
		}
		r := float64(n) / float64(of)
		return r, r > threshold || (threshold == 1 && n == of)
	}
	if r, ok := over(s.Errors, s.Requests, b.cfg.ErrorRatio); ok {
		return fmt.Sprintf("error ratio %.2f over %d requests above %v", r, s.Requests, b.cfg.ErrorRatio), true
	}
	if r, ok := over(s.Slow, s.Timed, b.cfg.SlowRatio); ok {
		return fmt.Sprintf("slow ratio %.2f over %d timed requests above %v (slower than %v)", r, s.Timed, b.cfg.SlowRatio, b.cfg.SlowLatency), true
	}
	return "", false
}

func (b *Breaker) move(to BreakerState, reason string) Transition {
	t := Transition{From: b.state, To: to, Reason: reason}
	b.state = to
	return t
}

func (b *Breaker) newRound(now time.Time) {
	b.round++
	b.roundStart, b.succeeded = now, 0
}

func (b *Breaker) resetWindow() {
	for i := range b.buckets {
		b.buckets[i] = breakerBucket{start: -1}
	}
}

// add puts o into the bucket of now and returns the window's sum: the
// buckets that started within the last Window.
func (b *Breaker) add(now time.Time, o Outcomes) Outcomes {
	t := int64(now.Sub(b.epoch))
	start := t - t%b.bucketLen
	if t < 0 {
		// The clock went back before the epoch: restart the window.
		b.epoch, start = now, 0
		b.resetWindow()
	}
	bk := &b.buckets[(start/b.bucketLen)%breakerBuckets]
	if bk.start != start {
		*bk = breakerBucket{start: start}
	}
	bk.o.Requests += o.Requests
	bk.o.Errors += o.Errors
	bk.o.Timed += o.Timed
	bk.o.Slow += o.Slow
	var sum Outcomes
	for _, x := range b.buckets {
		if x.start < 0 || x.start > start || start-x.start >= int64(breakerBuckets)*b.bucketLen {
			continue
		}
		sum.Requests += x.o.Requests
		sum.Errors += x.o.Errors
		sum.Timed += x.o.Timed
		sum.Slow += x.o.Slow
	}
	return sum
}
