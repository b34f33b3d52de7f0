/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-source ("hot parameter") limits: each source, aggregated to the
 * rule's prefix length, gets its own bucket in an LRU map, with an optional
 * ban for sources that stay over their limit. */
#ifndef XLIMIT_SOURCE_H
#define XLIMIT_SOURCE_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "bucket.h"
#include "clock.h"
#include "maps.h"
#include "parse.h"
#include "types.h"

/* Fills key with the packet's source masked to the rule's prefix length. */
static __always_inline void xl_source_key(struct xl_source_key *k, const struct xl_rule *r,
					  __u32 slot, const struct xl_pkt *pkt)
{
	__s32 plen = pkt->family == 4 ? r->prefix4 : r->prefix6;

	k->slot = slot;
	k->family = pkt->family;
	k->prefixlen = plen;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		__s32 bits = plen - 8 * i;
		__u8 mask = bits >= 8 ? 0xff : bits <= 0 ? 0 : (__u8)(0xff << (8 - bits));
		k->addr[i] = pkt->saddr[i] & mask;
	}
}

/* Whether two source keys are the same (they are zeroed before they are
 * filled, so their padding agrees). */
static __always_inline int xl_source_key_eq(const struct xl_source_key *a,
					    const struct xl_source_key *b)
{
	const __u32 *x = (const __u32 *)a;
	const __u32 *y = (const __u32 *)b;
	__u32 d = 0;
#pragma unroll
	for (int i = 0; i < (int)(sizeof(*a) / 4); i++)
		d |= x[i] ^ y[i];
	return !d;
}

/* This CPU's credit for rule r's sources (xl_src_credits), when the rule
 * may hold one: not under a ban, which another CPU may start at any time
 * and which must hold at once. */
static __always_inline struct xl_src_credit *xl_src_credit_for(const struct xl_rule *r, __u32 slot)
{
	if (r->flags & XL_RULE_BAN)
		return NULL;
	return bpf_map_lookup_elem(&xl_src_credits, &slot);
}

/* Gives the credit cr holds back to its source's bucket before another
 * source takes cr over: the TAT moves back by it (a bucket that has
 * refilled in the meantime stays full: a TAT behind now counts as now).
 * When the source's entry is gone (evicted, or reset for another rule) or
 * the compare-and-swap keeps losing, the credit is lost, and the source's
 * limit errs low by at most that much. */
static __always_inline void xl_src_credit_return(struct xl_src_credit *cr)
{
	__u64 credit = cr->credit;
	if (!credit)
		return;
	cr->credit = 0;
	struct xl_source *o = bpf_map_lookup_elem(&xl_sources, &cr->key);
	if (!o || o->epoch != cr->epoch)
		return;
	__u64 old = *(volatile __u64 *)&o->tat;
	for (int i = 0; i < XL_CAS_RETRIES; i++) {
		__u64 seen = __sync_val_compare_and_swap(&o->tat, old, old - credit);
		if (seen == old)
			return;
		old = seen;
	}
}

/* Returns 1 when the packet's source is within its own limit (and not
 * banned), charging its bucket. *now is read lazily (0: not yet).
 *
 * A CPU's credit in front of the shared bucket (xl_src_credits, as
 * xl_cache is for a rule's): when the same source comes twice in a row to
 * this CPU, the second packet borrows up to XL_BATCH_NS worth of the
 * source's rate (at most a quarter of its burst) in one compare-and-swap,
 * and the source's next packets spend it without touching the shared
 * entry or reading the clock. A packet of another source gives what is
 * left back to the source that held it (xl_src_credit_return), so a mix
 * of sources on one CPU loses nothing. Bound: tokens are charged before
 * they are spent, so a source is admitted no more than its bucket allows
 * plus the credit the CPUs held at the start (one batch each); below a
 * rate of one packet per batch (20000/s), the batch is a packet and every
 * packet takes the shared path, as without a credit.
 *
 * Races: the source's bucket advances by compare-and-swap like a rule's;
 * the ban fields are plain stores, so two CPUs may both start or end one
 * ban, which changes nothing. When the table cannot take a new source the
 * source check passes (fails open); the rule-wide bucket still applies. */
static __always_inline int xl_source_admit(const struct xl_rule *r, __u32 slot,
					   const struct xl_pkt *pkt, __u64 *now)
{
	struct xl_source_key k = {};
	const struct xl_bucket *b = &r->source;
	__u64 inc = xl_bucket_inc(b, 1);

	xl_source_key(&k, r, slot, pkt);
	struct xl_src_credit *cr = xl_src_credit_for(r, slot);
	int same = cr && cr->epoch == r->epoch && cr->mult == b->mult && cr->tol == b->tol &&
		   xl_source_key_eq(&cr->key, &k);
	if (same && cr->credit >= inc) {
		cr->credit -= inc;
		return 1;
	}
	__u64 t = xl_time(now);
	__u64 now_u = t << XL_TIME_SHIFT;
	struct xl_source *s = bpf_map_lookup_elem(&xl_sources, &k);
	if (!s) {
		struct xl_source fresh = {.tat = now_u, .epoch = r->epoch};
		bpf_map_update_elem(&xl_sources, &k, &fresh, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&xl_sources, &k);
		if (!s)
			return 1;
	}
	if (s->epoch != r->epoch) {
		/* Left by an earlier rule in this slot. */
		s->tat = now_u;
		s->over_since_ns = 0;
		s->banned_until_ns = 0;
		s->drops = 0;
		s->epoch = r->epoch;
	}
	/* A bucket that refilled completely ends an over-limit run. */
	if ((__s64)(s->tat - now_u) <= 0)
		s->over_since_ns = 0;

	int ok;
	if (same) {
		__u64 batch = (__u64)XL_BATCH_NS << XL_TIME_SHIFT;
		if (batch > b->tol / 4)
			batch = b->tol / 4;
		__u64 need = inc - cr->credit;
		__u64 retry_u;
		__u64 took = xl_gcra_take(&s->tat, b->tol, now_u, need, need > batch ? need : batch,
					  &retry_u);
		ok = took != 0;
		if (ok)
			cr->credit = cr->credit + took - inc;
	} else {
		if (cr) {
			xl_src_credit_return(cr);
			cr->key = k;
			cr->epoch = r->epoch;
			cr->mult = b->mult;
			cr->tol = b->tol;
		}
		ok = xl_gcra(&s->tat, b, now_u, 1);
	}

	if (r->flags & XL_RULE_BAN) {
		if (s->banned_until_ns) {
			/* While banned the bucket keeps measuring the offered
			 * rate; when the ban ends, a source still over its limit
			 * is banned again (hysteresis), one within it released. */
			if (t < s->banned_until_ns)
				ok = 0;
			else if (!ok)
				s->banned_until_ns = t + r->ban_ns;
			else
				s->banned_until_ns = 0;
		} else if (!ok) {
			if (!s->over_since_ns)
				s->over_since_ns = t;
			if (t - s->over_since_ns >= r->ban_after_ns)
				s->banned_until_ns = t + r->ban_ns;
		}
	}
	if (!ok)
		__sync_fetch_and_add(&s->drops, 1);
	return ok;
}

/* Whether rule r's per-source limit, when it has one (XL_RULE_PER_SOURCE),
 * admits the packet: xl_source_admit. *now is read lazily (0: not yet),
 * and only for a rule with one. */
static __always_inline int xl_source_pass(const struct xl_rule *r, __u32 slot,
					  const struct xl_pkt *pkt, __u64 *now)
{
	return !(r->flags & XL_RULE_PER_SOURCE) || xl_source_admit(r, slot, pkt, now);
}

#endif /* XLIMIT_SOURCE_H */
