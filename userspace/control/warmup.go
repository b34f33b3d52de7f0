package control

import (
	"fmt"
	"math"
	"time"
)

// maxWarmUpTokens bounds period × count so that every token count is an
// exact integer in a float64 and the int64 arithmetic cannot overflow.
const maxWarmUpTokens = 1 << 53

// WarmUp is Sentinel's WarmUpController
// (com.alibaba.csp.sentinel.slots.block.flow.controller.WarmUpController,
// itself Guava's SmoothWarmingUp turned into a per-second count), with the
// same integer and floating-point arithmetic (docs/design.md §5.2):
//
//	warningToken = (int)(T·count) / (c − 1)          integer division
//	maxToken     = warningToken + (int)(2·T·count / (1 + c))
//	slope        = (c − 1) / count / (maxToken − warningToken)
//
// The stored tokens start at maxToken (cold), or at 0 when warningToken is
// 0, which is the state Sentinel's first sync leaves. Once per wall-clock second
// (Sentinel's syncToken, run by the first request of each second) they
// refill as Sentinel's coolDownTokens does, by (now − lastFilled) ms ×
// count / 1000, truncated, when they are below warningToken, and when they
// are above it only while the previous second's passed count is below
// (int)count / c (integer division); they are clamped at maxToken and the
// previous second's passed count is subtracted, not below 0. The allowed
// rate is count below warningToken and 1 / ((stored − warningToken)·slope +
// 1/count) at or above it: count / c when the bucket is full.
//
// Where Sentinel's types leave room, xlimit generalises: the period may be a
// fraction of a second (Sentinel takes whole seconds), the cold factor may
// be fractional (Sentinel takes an int; an integral factor gives exactly
// Sentinel's integer divisions, a fractional one the floor of the real
// quotient), and tokens are 64-bit (Sentinel's int casts saturate at 2^31 −
// 1 tokens, which byte rates reach).
//
// A WarmUp is not safe for concurrent use; the daemon owns one per rule.
type WarmUp struct {
	count        float64
	warningToken int64
	maxToken     int64
	slope        float64
	// coolThreshold is Sentinel's (int)count / coldFactor: the stored
	// tokens above the warning line refill only while the previous
	// second's passed count is below it.
	coolThreshold int64

	stored int64
	// lastFilled is the Unix millisecond, a multiple of 1000, of the last
	// sync; synced is false until the first one (Sentinel's lastFilledTime
	// starts at 0, so its first sync always fills the bucket).
	lastFilled int64
	synced     bool
}

// NewWarmUp returns the warm-up controller for a stable rate count per
// second, a warm-up period and a cold factor (> 1), starting cold.
func NewWarmUp(count float64, period time.Duration, coldFactor float64) (*WarmUp, error) {
	t := period.Seconds()
	switch {
	case !(count > 0) || math.IsInf(count, 0):
		return nil, fmtWarmUp(invalid("count %v: must be a positive number", count))
	case period <= 0:
		return nil, fmtWarmUp(invalid("period %v: must be positive", period))
	case !(coldFactor > 1) || math.IsInf(coldFactor, 0):
		return nil, fmtWarmUp(invalid("cold factor %v: must be a number greater than 1", coldFactor))
	case !(t*count < maxWarmUpTokens):
		return nil, fmtWarmUp(invalid("period %v × count %v: more than 2^53 tokens", period, count))
	}
	w := &WarmUp{count: count}
	tokens := math.Trunc(t * count) // Java's (int)(warmUpPeriodInSec * count)
	w.warningToken = floorDiv(tokens, coldFactor-1)
	w.maxToken = w.warningToken + int64(2*t*count/(1.0+coldFactor))
	if w.maxToken <= w.warningToken {
		// Sentinel would divide by zero here and compute a NaN rate that
		// blocks everything.
		return nil, fmtWarmUp(invalid("period %v × count %v: no tokens between the warning line and the top, need period × count ≥ (1 + cold factor) / 2", period, count))
	}
	w.slope = (coldFactor - 1.0) / count / float64(w.maxToken-w.warningToken)
	w.coolThreshold = floorDiv(math.Trunc(count), coldFactor)
	w.stored = w.maxToken
	if w.warningToken == 0 {
		// Sentinel starts with 0 stored tokens and its first sync fills the
		// bucket only from below the warning line: with the line at 0 the
		// bucket stays empty, on the line, and Sentinel passes count from
		// the start (there is no warm-up to speak of). Starting full here
		// would allow count / c and block Sentinel's requests.
		w.stored = 0
	}
	return w, nil
}

func fmtWarmUp(err error) error { return fmt.Errorf("new warm-up: %w", err) }

// floorDiv is ⌊a / b⌋ for a whole a ≥ 0 and b > 0: Java's int division
// when b is whole.
func floorDiv(a, b float64) int64 {
	if b == math.Trunc(b) {
		return int64(a) / int64(b)
	}
	return int64(math.Floor(a / b))
}

// WarningToken is the number of stored tokens below which the rule is
// warm and allowed count per second.
func (w *WarmUp) WarningToken() int64 { return w.warningToken }

// MaxToken is the number of stored tokens of a cold (idle) service.
func (w *WarmUp) MaxToken() int64 { return w.maxToken }

// Slope is the increase of the interval 1/rate per stored token above the
// warning line.
func (w *WarmUp) Slope() float64 { return w.slope }

// Stored is the number of stored tokens: maxToken when cold, below
// warningToken when warm.
func (w *WarmUp) Stored() int64 { return w.stored }

// Rate returns the rate to put in force at now, given the count the rule
// admitted in the previous whole wall-clock second (kernel counters).
//
// seen tells whether the rule has seen a packet, passed or dropped, since
// the start of the current second. Sentinel syncs its tokens when a request
// arrives; a second without requests syncs nothing, and the next request
// after an idle spell refills the whole gap at once. So when seen is true
// Rate performs the sync (once per second; later calls in the same second
// change nothing), and when it is false Rate returns the rate that the
// first packet of the second would be given without changing any state.
// A daemon that passed seen = true on every tick would sync every second
// even while idle, and an idle bucket that lands exactly on the warning
// line would then stay there (coolDownTokens refills neither below nor
// above it), never cooling down.
func (w *WarmUp) Rate(now time.Time, passedPrevSecond uint64, seen bool) float64 {
	stored := w.stored
	if cur, ok := w.due(now); ok {
		stored = w.cooled(cur, passedPrevSecond)
		if seen {
			w.commit(cur, stored)
		}
	}
	return w.rateAt(stored)
}

// CanPass is Sentinel's canPass(node, acquireCount) for a request at now:
// passedThisSecond and passedPrevSecond are Sentinel's node.passQps() and
// node.previousPassQps(). It syncs the tokens like every Sentinel request
// does and reports whether acquire more fit in the current second.
func (w *WarmUp) CanPass(now time.Time, acquire, passedThisSecond, passedPrevSecond uint64) bool {
	if cur, ok := w.due(now); ok {
		w.commit(cur, w.cooled(cur, passedPrevSecond))
	}
	want := float64(passedThisSecond) + float64(acquire)
	if w.stored >= w.warningToken {
		above := w.stored - w.warningToken
		warningQPS := math.Nextafter(1.0/(float64(above)*w.slope+1.0/w.count), math.Inf(1))
		return want <= warningQPS
	}
	return want <= w.count
}

// due returns the start of now's second in Unix milliseconds, as Sentinel
// computes it, and whether a sync is due.
func (w *WarmUp) due(now time.Time) (int64, bool) {
	cur := now.UnixMilli()
	cur -= cur % 1000
	return cur, !w.synced || cur > w.lastFilled
}

// cooled is Sentinel's coolDownTokens followed by the subtraction of the
// previous second's passed count.
func (w *WarmUp) cooled(cur int64, passed uint64) int64 {
	v := w.stored
	// The first sync fills the bucket, as Sentinel's does from
	// lastFilledTime 0; it is full already.
	if w.synced && (v < w.warningToken || (v > w.warningToken && passed < uint64(w.coolThreshold))) {
		f := float64(v) + float64(cur-w.lastFilled)*w.count/1000
		if f >= float64(w.maxToken) {
			v = w.maxToken
		} else {
			v = int64(f)
		}
	}
	v = min(v, w.maxToken)
	if passed >= uint64(v) {
		return 0
	}
	return v - int64(passed)
}

func (w *WarmUp) commit(cur, stored int64) {
	w.stored = stored
	w.lastFilled = cur
	w.synced = true
}

// rateAt is the allowed rate for the given stored tokens.
func (w *WarmUp) rateAt(stored int64) float64 {
	if stored >= w.warningToken {
		return 1.0 / (float64(stored-w.warningToken)*w.slope + 1.0/w.count)
	}
	return w.count
}
