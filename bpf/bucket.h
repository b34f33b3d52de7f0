/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* GCRA token bucket (virtual scheduling), one 64-bit word of state.
 *
 * Time is in 2^-6 ns units and wraps every 9.1 years: every comparison is a
 * signed difference, so the state never overflows however long the host
 * runs. A theoretical arrival time (TAT) more than XL_STALE_AHEAD (1.6 days)
 * ahead of now cannot be legitimate: it is at most tol ahead, and the
 * daemon bounds tol to one day of burst. Such a TAT is left over from a
 * bucket idle for longer than the wrap period and is treated as full.
 *
 * Races: the TAT is advanced with compare-and-swap, so concurrent CPUs never
 * take more than the bucket allows. When the CAS keeps failing under heavy
 * contention the packet is dropped after XL_CAS_RETRIES attempts: a limiter
 * errs on the side of its limit. The bucket's settings may be read torn
 * while the daemon rewrites them (mult from the new rate, tol from the old);
 * each field alone is valid, so at most the packets racing one update see a
 * mix of two valid settings. */
#ifndef XLIMIT_BUCKET_H
#define XLIMIT_BUCKET_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "clock.h"
#include "maps.h"
#include "types.h"

#define XL_STALE_AHEAD (1ULL << 53)
#define XL_CAS_RETRIES 8

/* The time units a packet of cost `cost` takes from the bucket. */
static __always_inline __u64 xl_bucket_inc(const struct xl_bucket *b, __u64 cost)
{
	return (cost * b->mult + (1ULL << (XL_MULT_SHIFT - 1))) >> XL_MULT_SHIFT;
}

/* Takes between need and want time units from a shared bucket in one
 * compare-and-swap, as much as fits. Returns what it took; 0 when not even
 * need fits, and then *retry_u is the earliest time (2^-6 ns) at which it
 * can (0 when the CAS kept losing, which says nothing about the bucket). */
static __always_inline __u64 xl_gcra_take(__u64 *tat, __u64 tol, __u64 now_u, __u64 need,
					  __u64 want, __u64 *retry_u)
{
	__u64 old = *(volatile __u64 *)tat;

	*retry_u = 0;
	for (int i = 0; i < XL_CAS_RETRIES; i++) {
		__s64 ahead = (__s64)(old - now_u);
		__u64 base = (ahead < 0 || (__u64)ahead > XL_STALE_AHEAD) ? now_u : old;
		__s64 room = (__s64)tol - (__s64)(base - now_u);

		if (room < (__s64)need) {
			*retry_u = base + need - tol;
			return 0;
		}
		__u64 take = want < (__u64)room ? want : (__u64)room;
		__u64 seen = __sync_val_compare_and_swap(tat, old, base + take);
		if (seen == old)
			return take;
		old = seen;
	}
	return 0;
}

/* A change of a bucket's settings (a reload that keeps the rule, a
 * confirm's revert, the control loop's limit or its lapse) keeps how full
 * the bucket is, not its raw TAT: a TAT `ahead` of now under tolerance
 * `from` is the same part of tolerance `to`. A raw TAT would carry the old
 * rule's time units over: one held empty at 100/s with a burst of 1000 is
 * 10 s ahead, and at 1000/s (a tolerance of 1 s) nothing would conform
 * for 9 s; one held empty at 1000/s is 1 s ahead, and at 100/s (10 s) it
 * would admit 9 s of the new rate at once.
 *
 * Returns ahead * to / from (at most to) in 64 bits: from and ahead are
 * first shifted below 2^33, so the fraction keeps 31 bits (a relative
 * error below 2^-31; the Go model, dataplane.ScaleAhead, is the same). */
static __always_inline __u64 xl_units_scale(__u64 ahead, __u64 from, __u64 to)
{
	if (ahead >= from)
		return to;
	if (from >> 48) {
		from >>= 16;
		ahead >>= 16;
	}
	if (from >> 40) {
		from >>= 8;
		ahead >>= 8;
	}
	if (from >> 36) {
		from >>= 4;
		ahead >>= 4;
	}
	if (from >> 34) {
		from >>= 2;
		ahead >>= 2;
	}
	if (from >> 33) {
		from >>= 1;
		ahead >>= 1;
	}
	__u64 frac = (ahead << 31) / from; /* at most 2^31 */
	__u64 n = (to >> 31) * frac + (((to & ((1ULL << 31) - 1)) * frac) >> 31);
	return n < to ? n : to;
}

/* Rescales a TAT written under tolerance from to tolerance to at now_u
 * (2^-6 ns), by compare-and-swap: a full bucket (a TAT behind now, or a
 * stale one) stays full. When the CAS loses XL_CAS_RETRIES times in a
 * row, an exchange writes the rescale of the last TAT seen and gives back
 * what the CPUs that won charged since (the exchanged-out TAT's lead over
 * it, at most XL_STALE_AHEAD), so that the TAT is never left in the old
 * units (issue 41: it was, and a cut rate then stalled the bucket). */
static __always_inline void xl_tat_rescale(__u64 *tat, __u64 from, __u64 to, __u64 now_u)
{
	__u64 old = *(volatile __u64 *)tat;

	for (int i = 0; i < XL_CAS_RETRIES; i++) {
		__s64 ahead = (__s64)(old - now_u);
		if (ahead <= 0 || (__u64)ahead > XL_STALE_AHEAD)
			return;
		__u64 seen = __sync_val_compare_and_swap(
		    tat, old, now_u + xl_units_scale((__u64)ahead, from, to));
		if (seen == old)
			return;
		old = seen;
	}
	__s64 ahead = (__s64)(old - now_u);
	if (ahead <= 0 || (__u64)ahead > XL_STALE_AHEAD)
		return;
	__u64 prev = __sync_lock_test_and_set(tat, now_u + xl_units_scale((__u64)ahead, from, to));
	__s64 charged = (__s64)(prev - old);
	if (charged > 0 && (__u64)charged <= XL_STALE_AHEAD)
		__sync_fetch_and_add(tat, (__u64)charged);
}

/* Brings TATs written under the tolerance *units to tolerance tol (the
 * settings in force) before they are charged: tat, and tat2 when not
 * NULL. The CPU whose compare-and-swap moves *units to tol rescales them,
 * once; the others go on at once, and at most the packets racing that
 * CPU meet a TAT not yet rescaled: after a raise they find it further
 * ahead than the new tolerance and are dropped, after a cut they take
 * from it and are charged again, scaled, by the rescale. *units 0
 * (unknown: state left by an xlimit from before the field, or reset with
 * a TAT of now) is taken as tol. Settings racing each other (a torn read,
 * the generations of a reload) rescale back and forth, each time keeping
 * how full the bucket is. Callers compare *units with tol first: on the
 * path of every packet that reaches a bucket, that compare is all.
 * Returns 1 when it rescaled. */
static __always_inline int xl_units_claim_in(__u64 *units, __u64 *tat, __u64 *tat2, __u64 tol,
					     __u64 now_u)
{
	__u64 from = *(volatile __u64 *)units;

	if (from == tol || __sync_val_compare_and_swap(units, from, tol) != from || !from)
		return 0;
	xl_tat_rescale(tat, from, tol, now_u);
	if (tat2)
		xl_tat_rescale(tat2, from, tol, now_u);
	return 1;
}

/* A tolerance in 32 bits, for a per-source entry (xl_src_way.units): the
 * position of its highest bit + 1 in the top 6 bits, the 26 bits below
 * that bit in the others (a relative error below 2^-26); 0 for 0. The
 * daemon writes a rule's (dataplane.UnitsCode) in xl_rule.source_units:
 * it is not computed per packet. */

/* The code of tolerance tol (dataplane.UnitsCode), for state whose units
 * are computed where they are used (xl_cookie_share, off the path of
 * every packet): the highest bit's position found in six steps. */
static __always_inline __u32 xl_units_code(__u64 tol)
{
	if (!tol)
		return 0;
	__u32 e = 0;
	__u64 v = tol;
	if (v >> 32) {
		v >>= 32;
		e += 32;
	}
	if (v >> 16) {
		v >>= 16;
		e += 16;
	}
	if (v >> 8) {
		v >>= 8;
		e += 8;
	}
	if (v >> 4) {
		v >>= 4;
		e += 4;
	}
	if (v >> 2) {
		v >>= 2;
		e += 2;
	}
	if (v >> 1)
		e += 1;
	if (e > 62)
		e = 62;
	__u64 m = e >= 26 ? tol >> (e - 26) : tol << (26 - e);
	return (e + 1) << 26 | (__u32)(m & ((1U << 26) - 1));
}

/* The tolerance a code of xl_rule.source_units stands for (code not 0). */
static __always_inline __u64 xl_units_decode(__u32 code)
{
	__u32 e = (code >> 26) - 1;
	__u64 m = (1ULL << 26) | (code & ((1U << 26) - 1));
	return e >= 26 ? m << (e - 26) : m >> (26 - e);
}

/* xl_units_claim for a per-source entry, whose units are a code of its
 * tolerance (code: tol's, xl_rule.source_units; 0: unknown, nothing
 * done). */
static __always_inline void xl_src_units_claim(__u32 *units, __u64 *tat, __u32 code, __u64 tol,
					       __u64 now_u)
{
	__u32 from = *(volatile __u32 *)units;

	if (!code || from == code || __sync_val_compare_and_swap(units, from, code) != from ||
	    !from)
		return;
	xl_tat_rescale(tat, xl_units_decode(from), tol, now_u);
}

/* The rule's bucket state in the units of the settings b (xl_units_claim):
 * its TAT and its resets' TAT.
 *
 * xl_units_claim is a global function: the verifier checks it once, apart
 * from the paths of xl_apply_rule, which calls it twice. source.h inlines
 * xl_src_units_claim (xl_source_admit is a global function already). The
 * TC program defines XL_UNITS_EARLY: a frame below xl_cookie_charge's
 * would pass the stack that 6.1 allows, and inlined there the verifier's
 * limit, so it brings the state to the units before that call
 * (syncookie_tc.c, xl_cookie_units), and here this is nothing. */
#ifdef XL_UNITS_EARLY
#define xl_state_units(st, b, now_u) ((void)0)
#else
__noinline int xl_units_claim(__u64 *units, __u64 *tat, __u64 *tat2, __u64 tol, __u64 now_u)
{
	if (!units || !tat)
		return 0;
	return xl_units_claim_in(units, tat, tat2, tol, now_u);
}

static __always_inline void xl_state_units(struct xl_bucket_state *st, const struct xl_bucket *b,
					   __u64 now_u)
{
	if (st->units != b->tol)
		xl_units_claim(&st->units, &st->tat, &st->reset_tat, b->tol, now_u);
}
#endif

/* Admits a packet of cost `cost` at time now_u (2^-6 ns) against the bucket
 * settings b and state *tat. Returns 1 when it conforms (and charges it). */
static __always_inline int xl_gcra(__u64 *tat, const struct xl_bucket *b, __u64 now_u, __u64 cost)
{
	__u64 inc = xl_bucket_inc(b, cost);
	__u64 retry_u;

	return xl_gcra_take(tat, b->tol, now_u, inc, inc, &retry_u) != 0;
}

/* The drops a CPU may make without a clock read after a read found a
 * bucket of tolerance tol empty for a packet of inc (xl_cache_empty):
 * none when the tolerance leaves less than XL_SKIP_MIN_TOL_NS beyond the
 * packet, so that a take up to a tick late loses no tokens, and none
 * where the rule does not allow runs (runs 0: a per-source rule, whose
 * rule-wide bucket stays first come first served to the packet). */
static __always_inline __u32 xl_skip_grant(__u64 tol, __u64 inc, __u32 runs)
{
	return runs && tol >= inc + (XL_SKIP_MIN_TOL_NS << XL_TIME_SHIFT) ? XL_SKIP_DROPS : 0;
}

/* Per-CPU token cache in front of a shared bucket.
 *
 * A CPU borrows up to XL_BATCH_NS worth of the rate (at most a quarter of
 * the burst, at least the packet at hand) from the shared bucket in one
 * CAS and spends it on later packets without touching shared memory. When
 * the shared bucket has no room, the cache remembers until when, and drops
 * without touching shared memory until then (the TAT only moves forward, so
 * no packet is dropped that could have passed).
 *
 * Bound: tokens are charged to the shared bucket before they are spent, so
 * over any interval the CPUs together admit at most what the shared bucket
 * admits plus what the caches held at its start: at most one batch per CPU,
 * max(cost, XL_BATCH_NS x rate) each. Over the long run the rate is exact.
 * A cache filled under other settings (a new rate from the control loop, a
 * new rule in the slot) is emptied first: that loses at most one batch.
 * The shared state is brought to the settings' units before it is charged
 * (xl_state_units): a change of rate keeps how full the bucket is.
 * Returns 1 when the packet conforms; *now is read lazily (0: not yet). */
static __always_inline int xl_cached_admit(struct xl_cache *c, struct xl_bucket_state *st,
					   const struct xl_bucket *b, __u64 inc, __u32 runs,
					   __u64 now)
{
	if (c->credit >= inc) {
		c->credit -= inc;
		return 1;
	}
	if (now < c->retry_ns)
		return 0;

	__u64 batch = (__u64)XL_BATCH_NS << XL_TIME_SHIFT;
	if (batch > b->tol / 4)
		batch = b->tol / 4;
	__u64 need = inc - c->credit;
	__u64 want = need > batch ? need : batch;
	__u64 now_u = now << XL_TIME_SHIFT;
	__u64 retry_u;
	xl_state_units(st, b, now_u);
	__u64 took = xl_gcra_take(&st->tat, b->tol, now_u, need, want, &retry_u);

	if (!took) {
		/* Round up: no room strictly before retry_u. A take that finds
		 * the bucket empty starts a run of drops without clock reads
		 * (xl_cache_empty): now is this tick's read. */
		if (retry_u) {
			c->retry_ns = now + ((retry_u - now_u) + (1 << XL_TIME_SHIFT) - 1) /
						(1 << XL_TIME_SHIFT);
			c->skip = xl_skip_grant(b->tol, inc, runs);
		}
		return 0;
	}
	c->credit = c->credit + took - inc;
	return 1;
}

/* A rule's bucket: its state in the slot, the settings in force, and each
 * CPU's cache in front of it. An epoch other than the rule's marks state
 * left by an earlier rule in the slot. */

/* Claims the slot's bucket state for rule r: state left by another rule
 * (another epoch) starts full (a TAT of now), with no half-open probes
 * counted (the new rule's breaker may start at the round number the old
 * one had reached). Two CPUs may both reset; it starts full once. *now is
 * read lazily (0: not yet). */
static __always_inline void xl_state_claim(struct xl_bucket_state *st, const struct xl_rule *r,
					   __u64 *now)
{
	if (st->epoch != r->epoch) {
		st->tat = xl_time(now) << XL_TIME_SHIFT;
		st->units = 0;
		st->reset_tat = 0;
		st->probes = 0;
		st->epoch = r->epoch;
	}
}

/* A clock read for this CPU's cache of a slot, remembered with its tick:
 * a read in a new tick ends a run of drops without reads (c->skip). */
static __always_inline __u64 xl_cache_read(struct xl_cache *c, __u64 tick, __u64 *now)
{
	__u64 t = xl_time(now);
	if (c->tick != tick) {
		c->tick = tick;
		c->skip = 0;
	}
	c->fresh_ns = t;
	return t;
}

/* The control loop's limit for a rule while it is fresh and meant for this
 * rule; NULL otherwise, and then the static fallback applies (fail-static).
 * The deadline is checked against this CPU's last clock read of the slot
 * while the tick is the same (so it takes effect at most one tick late),
 * else against a new read. */
static __always_inline const struct xl_limit *xl_limit_for(const struct xl_rule *r, __u32 slot,
							   struct xl_cache *c, __u64 *now)
{
	struct xl_limit *lim = bpf_map_lookup_elem(&xl_limits, &slot);
	if (!lim || lim->epoch != r->epoch)
		return NULL;
	__u64 tick = xl_tick();
	__u64 t = c->tick == tick ? c->fresh_ns : xl_cache_read(c, tick, now);
	return t < lim->deadline_ns ? lim : NULL;
}

/* Claims this CPU's cache of a slot for rule r under the settings b: a
 * cache filled for another rule (another epoch) or under other settings is
 * emptied, and so is a run of drops this CPU's flood memo took over from it
 * (flood.h). Its last clock read stays: it is a fact about time, not about
 * the rule. */
static __always_inline void xl_cache_claim(struct xl_cache *c, const struct xl_rule *r,
					   const struct xl_bucket *b, __u32 slot)
{
	if (c->epoch != r->epoch || c->mult != b->mult || c->tol != b->tol) {
		c->credit = 0;
		c->retry_ns = 0;
		c->skip = 0;
		c->mult = b->mult;
		c->tol = b->tol;
		c->epoch = r->epoch;
		__u32 zero = 0;
		struct xl_flood *f = bpf_map_lookup_elem(&xl_flood, &zero);
		if (f && f->slot == slot)
			f->left = 0;
	}
}

/* Whether this CPU already knows the rule-wide bucket has no room for inc:
 * no credit left and before the time the bucket has room again.
 *
 * A read that finds the bucket empty lets the next XL_SKIP_DROPS packets
 * short of credit drop without a read while the tick stays the same:
 * during a flood the clock is read once per XL_SKIP_DROPS + 1 drops. Such
 * a drop may come after retry_ns, so this CPU sees the bucket refill at
 * most XL_SKIP_DROPS of its packets and at most one tick late. While the
 * shared TAT is still ahead of now, a late take loses nothing (it starts
 * from the TAT, not from now): a delay under tol - inc only moves
 * admissions later and the long-run count stays exact; beyond that the
 * bucket was full for the excess, which is all that can be lost
 * (docs/dataplane.md, "Drops without a clock read"). Reads the time only when the credit
 * is short and the run is over. */
static __always_inline int xl_cache_empty(struct xl_cache *c, __u64 inc, __u32 runs, __u64 *now)
{
	if (c->credit >= inc)
		return 0;
	__u64 tick = xl_tick();
	if (c->skip && c->tick == tick) {
		c->skip--;
		return 1;
	}
	if (xl_cache_read(c, tick, now) >= c->retry_ns)
		return 0;
	c->skip = xl_skip_grant(c->tol, inc, runs);
	return 1;
}

/* xl_cached_admit with the time read only when the credit is short (then
 * xl_cache_empty has read it for this packet). */
static __always_inline int xl_rule_admit(struct xl_cache *c, struct xl_bucket_state *st,
					 const struct xl_bucket *b, __u64 inc, __u32 runs,
					 __u64 *now)
{
	return xl_cached_admit(c, st, b, inc, runs, c->credit >= inc ? 0 : xl_time(now));
}

/* Whether rule r's CPU caches may drop without clock reads (xl_skip_grant):
 * not for a per-source rule. A run drops the packets that follow a read,
 * whenever they come within the tick, so in a flood that comes in bursts
 * a packet arriving in a gap, when the bucket has refilled, is refused
 * and the token goes to the flood's next burst: the count stays exact but
 * not first come first served, which a per-source rule promises its
 * legitimate sources (tests/source_test.go, TestPerSourceFlood). */
static __always_inline __u32 xl_runs(const struct xl_rule *r)
{
	return !(r->flags & XL_RULE_PER_SOURCE);
}

#endif /* XLIMIT_BUCKET_H */
