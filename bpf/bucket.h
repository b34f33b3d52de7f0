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
 * admit more than the bucket allows. When the CAS keeps failing under heavy
 * contention the packet is dropped after XL_CAS_RETRIES attempts: a limiter
 * errs on the side of its limit. The bucket's settings may be read torn
 * while the daemon rewrites them (mult from the new rate, tol from the old);
 * each field alone is valid, so at most the packets racing one update see a
 * mix of two valid settings. */
#ifndef XLIMIT_BUCKET_H
#define XLIMIT_BUCKET_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "types.h"

#define XL_STALE_AHEAD (1ULL << 53)
#define XL_CAS_RETRIES 8

/* The time units a packet of cost `cost` takes from the bucket. */
static __always_inline __u64 xl_bucket_inc(const struct xl_bucket *b, __u64 cost)
{
	return (cost * b->mult + (1ULL << (XL_MULT_SHIFT - 1))) >> XL_MULT_SHIFT;
}

/* Admits a packet of cost `cost` at time now_u (2^-6 ns) against the bucket
 * settings b and state *tat. Returns 1 when it conforms (and charges it). */
static __always_inline int xl_gcra(__u64 *tat, const struct xl_bucket *b, __u64 now_u, __u64 cost)
{
	__u64 inc = xl_bucket_inc(b, cost);
	__u64 tol = b->tol;
	__u64 old = *(volatile __u64 *)tat;

	for (int i = 0; i < XL_CAS_RETRIES; i++) {
		__s64 ahead = (__s64)(old - now_u);
		__u64 base = (ahead < 0 || (__u64)ahead > XL_STALE_AHEAD) ? now_u : old;
		__u64 next = base + inc;

		if ((__s64)(next - now_u) > (__s64)tol)
			return 0;
		__u64 seen = __sync_val_compare_and_swap(tat, old, next);
		if (seen == old)
			return 1;
		old = seen;
	}
	return 0;
}

#endif /* XLIMIT_BUCKET_H */
