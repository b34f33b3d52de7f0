package dataplane

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Bucket is a rule's token bucket in the kernel's fixed point (struct
// xl_bucket). A packet of cost c advances the theoretical arrival time by
// Inc(c) = (c*Mult + 2^15) >> 16 time units of 2^-6 ns, and conforms while
// it stays within Tol units of now. Mult is the emission interval 1/rate in
// 2^-22 ns. Inc is a whole number of units, so each packet can be off by
// half a unit: the admitted rate is within 0.5/Inc of the configured one.
// That is below 0.1 % for packet rates up to 1.28e8/s (Inc ≥ 500) and for
// byte rates up to 100 Gbit/s with frames of 100 bytes or more (0.15 % at
// most for 64-byte frames); the config's limits (1e8 packets/s, 1.25e10
// bytes/s) keep rules in that range.
type Bucket struct {
	Mult uint64
	Tol  uint64
}

// Limits that keep the fixed point exact and overflow-free; the config
// validation enforces the same ones with friendlier messages.
const (
	// MaxCost is the largest cost the kernel charges (a frame's length).
	MaxCost = 1<<16 - 1
	// MaxBurstTime bounds burst/rate so Tol stays below the bucket's
	// staleness horizon (StaleAhead, 1.6 days).
	MaxBurstTime = 24 * time.Hour
)

// NewBucket returns the bucket for rate units per second and burst units.
// bytes says whether a packet costs its length (MaxCost at most) or 1.
func NewBucket(rate, burst float64, bytes bool) (Bucket, error) {
	if !(rate > 0) || math.IsInf(rate, 0) {
		return Bucket{}, fmt.Errorf("rate %v: must be a positive number", rate)
	}
	if !(burst > 0) || math.IsInf(burst, 0) {
		return Bucket{}, fmt.Errorf("burst %v: must be a positive number", burst)
	}
	if burst/rate > MaxBurstTime.Seconds() {
		return Bucket{}, fmt.Errorf("burst %v at rate %v: lasts more than %v", burst, rate, MaxBurstTime)
	}
	mult := math.Round(1e9 * (1 << (TimeShift + MultShift)) / rate)
	maxMult := math.Ldexp(1, 64)
	if bytes {
		maxMult = math.Ldexp(1, 64) / (MaxCost + 1)
	}
	if mult < 1 || mult >= maxMult {
		return Bucket{}, fmt.Errorf("rate %v: outside the range the kernel can represent", rate)
	}
	b := Bucket{Mult: uint64(mult)}
	b.Tol = uint64(math.Round(burst * mult / (1 << MultShift)))
	if !bytes {
		// Whole packets of the burst must fit despite Inc's rounding.
		if whole := uint64(burst) * b.Inc(1); b.Tol < whole {
			b.Tol = whole
		}
	}
	return b, nil
}

// Inc is the number of time units a packet of the given cost takes.
func (b Bucket) Inc(cost uint64) uint64 {
	return (cost*b.Mult + 1<<(MultShift-1)) >> MultShift
}

// Rate is the rate the bucket enforces, in units per second.
func (b Bucket) Rate() float64 {
	if b.Mult == 0 {
		return 0
	}
	return 1e9 * (1 << (TimeShift + MultShift)) / float64(b.Mult)
}

// Burst is the burst the bucket allows, in units.
func (b Bucket) Burst() float64 {
	if b.Mult == 0 {
		return 0
	}
	return float64(b.Tol) * (1 << MultShift) / float64(b.Mult)
}

// StaleAhead is how far ahead of now a TAT can be before the bucket treats
// it as left over from a wrapped clock (bucket.h XL_STALE_AHEAD).
const StaleAhead = 1 << 53

// Take is the Go model of bucket.h's xl_gcra_take: it takes between need
// and want time units from the bucket at nowNS, as much as fits, and
// returns what it took; when not even need fits it returns 0 and the
// earliest time (2^-6 ns units, wrapping) at which it would.
func (b Bucket) Take(tat *uint64, nowNS, need, want uint64) (took, retryU uint64) {
	now := nowNS << TimeShift
	ahead := int64(*tat - now)
	base := *tat
	if ahead < 0 || uint64(ahead) > StaleAhead {
		base = now
	}
	room := int64(b.Tol) - int64(base-now)
	if room < int64(need) {
		return 0, base + need - b.Tol
	}
	took = min(want, uint64(room))
	*tat = base + took
	return took, 0
}

// ScaleAhead is the Go model of bucket.h's xl_units_scale: a TAT ahead of
// now under tolerance from, as the same part of tolerance to (at most to),
// with the kernel's 64-bit arithmetic (a fraction of 31 bits). A change of
// a bucket's settings keeps how full the bucket is, not its raw TAT.
func ScaleAhead(ahead, from, to uint64) uint64 {
	if ahead >= from {
		return to
	}
	for _, sh := range []uint{16, 8, 4, 2, 1} {
		if from>>(32+sh) != 0 {
			from >>= sh
			ahead >>= sh
		}
	}
	frac := (ahead << 31) / from
	n := (to>>31)*frac + ((to&(1<<31-1))*frac)>>31
	return min(n, to)
}

// rescaleTAT is the Go model of bucket.h's xl_tat_rescale: a full bucket
// (a TAT behind now, or stale) stays full.
func rescaleTAT(tat *uint64, from, to, nowU uint64) {
	ahead := int64(*tat - nowU)
	if ahead <= 0 || uint64(ahead) > StaleAhead {
		return
	}
	*tat = nowU + ScaleAhead(uint64(ahead), from, to)
}

// UnitsClaim is the Go model of bucket.h's xl_units_claim (one CPU): TATs
// written under the tolerance *units are rescaled to tol, tat2 too when
// not nil; *units 0 (unknown) is taken as tol.
func UnitsClaim(units, tat, tat2 *uint64, tol, nowU uint64) {
	from := *units
	if from == tol {
		return
	}
	*units = tol
	if from == 0 {
		return
	}
	rescaleTAT(tat, from, tol, nowU)
	if tat2 != nil {
		rescaleTAT(tat2, from, tol, nowU)
	}
}

// UnitsCode is the code of bucket.h's xl_units_decode: a tolerance in
// 32 bits for a per-source entry (the position of its highest bit + 1, and
// the 26 bits below it), 0 for 0.
func UnitsCode(tol uint64) uint32 {
	if tol == 0 {
		return 0
	}
	e := uint32(min(63-bits.LeadingZeros64(tol), 62))
	var m uint64
	if e >= 26 {
		m = tol >> (e - 26)
	} else {
		m = tol << (26 - e)
	}
	return (e+1)<<26 | uint32(m&(1<<26-1))
}

// UnitsDecode is the Go model of bucket.h's xl_units_decode: the
// tolerance a code stands for (code not 0).
func UnitsDecode(code uint32) uint64 {
	e := code>>26 - 1
	m := uint64(1)<<26 | uint64(code&(1<<26-1))
	if e >= 26 {
		return m << (e - 26)
	}
	return m >> (26 - e)
}

// srcUnitsClaim is the Go model of bucket.h's xl_src_units_claim.
func srcUnitsClaim(units *uint32, tat *uint64, tol, nowU uint64) {
	code := UnitsCode(tol)
	from := *units
	if from == code {
		return
	}
	*units = code
	if from != 0 {
		rescaleTAT(tat, UnitsDecode(from), tol, nowU)
	}
}

// GCRA is the Go model of bucket.h's xl_gcra: it admits a packet of the
// given cost at time nowNS against *tat (2^-6 ns units, wrapping) and
// reports whether it conformed.
func (b Bucket) GCRA(tat *uint64, nowNS uint64, cost uint64) bool {
	inc := b.Inc(cost)
	took, _ := b.Take(tat, nowNS, inc, inc)
	return took != 0
}

// Cache is the Go model of one CPU's token cache (struct xl_cache).
type Cache struct {
	Credit, RetryNS, Mult, Tol uint64
	// FreshNS is the cache's last clock read and Tick its tick (0: none).
	FreshNS, Tick uint64
	Epoch         uint32
	// Skip is how many drops are left without a clock read (SkipDrops at
	// most), within Tick.
	Skip uint32
}

// read is the Go model of bucket.h's xl_cache_read: a clock read at nowNS,
// remembered with its tick; a read in a new tick ends a run of drops
// without reads.
func (c *Cache) read(nowNS uint64) uint64 {
	if t := FakeTick(nowNS); c.Tick != t {
		c.Tick, c.Skip = t, 0
	}
	c.FreshNS = nowNS
	return nowNS
}

// Time is the time the cache answers a deadline with (bucket.h,
// xl_limit_for): its last read while the tick is the same, else a new
// read.
func (c *Cache) Time(nowNS uint64) uint64 {
	if c.Tick == FakeTick(nowNS) {
		return c.FreshNS
	}
	return c.read(nowNS)
}

// Claim is the Go model of bucket.h's xl_cache_claim: a cache filled for
// another rule or under other settings is emptied; its last read stays.
// It returns whether it emptied the cache (then the kernel also ends the
// run a flood memo took over from it).
func (c *Cache) Claim(b Bucket, epoch uint32) bool {
	if c.Epoch != epoch || c.Mult != b.Mult || c.Tol != b.Tol {
		c.Credit, c.RetryNS, c.Skip = 0, 0, 0
		c.Mult, c.Tol, c.Epoch = b.Mult, b.Tol, epoch
		return true
	}
	return false
}

// Empty is the Go model of bucket.h's xl_cache_empty: whether the cache
// knows the shared bucket has no room for inc, with up to SkipDrops drops
// without a read after a read found it empty, within the tick.
func (c *Cache) Empty(inc, nowNS uint64, runs bool) bool {
	if c.Credit >= inc {
		return false
	}
	if c.Skip > 0 && c.Tick == FakeTick(nowNS) {
		c.Skip--
		return true
	}
	if c.read(nowNS) >= c.RetryNS {
		return false
	}
	c.Skip = skipGrant(c.Tol, inc, runs)
	return true
}

// skipGrant is the Go model of bucket.h's xl_skip_grant.
func skipGrant(tol, inc uint64, runs bool) uint32 {
	if runs && tol >= inc+SkipMinTolNS<<TimeShift {
		return SkipDrops
	}
	return 0
}

// Admit is the Go model of bucket.h's xl_cached_admit: a packet taking inc
// time units conforms from the cache's credit, or by borrowing a batch from
// the shared bucket *tat, brought first from the units *units to b's (its
// other TAT tat2 too, when not nil: UnitsClaim).
func (c *Cache) Admit(tat, units, tat2 *uint64, b Bucket, inc, nowNS uint64, runs bool) bool {
	if c.Credit >= inc {
		c.Credit -= inc
		return true
	}
	if nowNS < c.RetryNS {
		return false
	}
	batch := min(uint64(BatchNS)<<TimeShift, b.Tol/4)
	need := inc - c.Credit
	want := max(need, batch)
	UnitsClaim(units, tat, tat2, b.Tol, nowNS<<TimeShift)
	took, retryU := b.Take(tat, nowNS, need, want)
	if took == 0 {
		if retryU != 0 {
			c.RetryNS = nowNS + (retryU-nowNS<<TimeShift+1<<TimeShift-1)/(1<<TimeShift)
			c.Skip = skipGrant(b.Tol, inc, runs)
		}
		return false
	}
	c.Credit = c.Credit + took - inc
	return true
}
