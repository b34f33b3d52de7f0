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

/* Whether credit cr holds the packet's source for rule r in slot, under
 * the rule's settings: what xl_source_admit's `same` says, without
 * building the source's key. */
static __always_inline int xl_src_credit_holds(const struct xl_src_credit *cr,
					       const struct xl_rule *r, __u32 slot,
					       const struct xl_pkt *pkt)
{
	__s32 plen = pkt->family == 4 ? r->prefix4 : r->prefix6;
	if (cr->epoch != r->epoch || cr->mult != r->source.mult || cr->tol != r->source.tol ||
	    cr->key.slot != slot || cr->key.family != pkt->family || cr->key.prefixlen != plen)
		return 0;
	const __u32 *a = (const __u32 *)pkt->saddr;
	const __u32 *k = (const __u32 *)cr->key.addr;
	__u32 d = 0;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__s32 bits = plen - 32 * i;
		__u32 mask = bits >= 32	 ? 0xffffffff
			     : bits <= 0 ? 0
					 : bpf_htonl(0xffffffff << (32 - bits));
		d |= (a[i] & mask) ^ k[i];
	}
	return !d;
}

/* Gives the credit cr holds back to its source's bucket before another
 * source takes cr over: the TAT moves back by it (a bucket that has
 * refilled in the meantime stays full: a TAT behind now counts as now).
 * When the source's entry is gone (evicted, or reset for another rule),
 * is in other units than the credit (the rule's source rate changed
 * since, xl_units_claim), or the compare-and-swap keeps losing, the credit is
 * lost, and the source's limit errs low by at most that much. */
static __always_inline void xl_src_credit_return(struct xl_src_credit *cr, const struct xl_rule *r)
{
	__u64 credit = cr->credit;
	if (!credit)
		return;
	cr->credit = 0;
	struct xl_source *o = bpf_map_lookup_elem(&xl_sources, &cr->key);
	if (!o || o->epoch != cr->epoch || cr->tol != r->source.tol || o->units != r->source_units)
		return;
	__u64 old = *(volatile __u64 *)&o->tat;
	for (int i = 0; i < XL_CAS_RETRIES; i++) {
		__u64 seen = __sync_val_compare_and_swap(&o->tat, old, old - credit);
		if (seen == old)
			return;
		old = seen;
	}
}

/* Names cr, this CPU's credit for the rule, after the source of key k, as
 * a packet of another source than the one it held does: what it held goes
 * back first (xl_src_credit_return). */
static __always_inline void xl_src_credit_name(struct xl_src_credit *cr,
					       const struct xl_source_key *k,
					       const struct xl_rule *r, const struct xl_bucket *b)
{
	if (!cr)
		return;
	xl_src_credit_return(cr, r);
	cr->key = *k;
	cr->epoch = r->epoch;
	cr->mult = b->mult;
	cr->tol = b->tol;
}

/* xl_source_admit's generation for a caller without the front. */
#define XL_FRONT_NONE 2

/* The hash of a source's key that picks its set in xl_src_front (the Go
 * model's dataplane.SrcFrontHash is the same). */
static __always_inline __u32 xl_src_front_hash(const struct xl_source_key *k)
{
	const __u32 *w = (const __u32 *)k->addr;
	__u32 h = (k->slot | (k->family == 6 ? XL_FRONT_V6 : 0)) * 0x9e3779b1u;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		h = (h ^ w[i]) * 0x85ebca6bu;
		h ^= h >> 13;
	}
	return h;
}

/* The owner a front way is written with: the rule's epoch and its
 * per-source units, folded, never 0 (0: empty). A reload that keeps the
 * rule and its per-source settings keeps its ways: before, they were
 * owned by xl_gen's generation, so every reload freed them and let each
 * source seen only there within its emission interval pass once more
 * (TestOracle, a reload between a source's two packets). A change of the
 * per-source settings frees them (their TATs are in the old units): at
 * most one packet more per such source and CPU. */
static __always_inline __u32 xl_src_front_owner(const struct xl_rule *r)
{
	return (r->epoch ^ (r->source_units * 0x9e3779b1u)) | 1;
}

/* Whether front way w holds the source of key k (tag: its slot and family
 * bit) written by owner. */
static __always_inline int xl_src_front_is(const struct xl_src_front *w,
					   const struct xl_source_key *k, __u32 tag, __u32 owner)
{
	const __u32 *a = (const __u32 *)w->addr;
	const __u32 *b = (const __u32 *)k->addr;
	return w->gen == owner && w->slot == tag && w->prefixlen == k->prefixlen &&
	       !((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]));
}

/* Whether way w holds nothing at now_u (2^-6 ns): empty, of another
 * owner, or a source whose bucket is full again (its TAT passed). */
static __always_inline int xl_src_front_free(const struct xl_src_front *w, __u32 owner, __u64 now_u)
{
	return w->gen != owner || (__s64)(w->t - now_u) <= 0;
}

/* Returns 1 when the packet's source is within its own limit (and not
 * banned), charging its bucket. *now is read lazily (0: not yet).
 * gen: the rule's generation (0 or 1), or XL_FRONT_NONE for no front.
 *
 * The front (xl_src_front, per CPU, consulted when the shared LRU does not
 * hold the source): such a source whose way holds no packet (new to this
 * CPU, back after its bucket refilled, or evicted) is admitted, as its
 * full bucket admits it, and only written into a free way as seen, with
 * the TAT its packet left: no LRU insert, so a spoofed flood of sources
 * that never come back costs a front write each and evicts no source
 * from the LRU. When it comes back while its way still holds the packet
 * (its TAT ahead of now), it gets its entry, charged with that packet,
 * and is charged from then on as before; when it comes back within
 * XL_SRC_PROMOTE_NS after that TAT (a source that keeps sending below its
 * limit), it gets its entry too, full, so that it is not seen again and
 * again on the front's slower path. A way that holds a packet is
 * never overwritten (the packet is charged nowhere else): when both ways
 * of its set hold one, a new source gets an entry as without a front.
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
 * plus the credit the CPUs held at the start (one batch each), plus one
 * packet for each CPU whose front admitted one uncharged; below a rate of
 * one packet per batch (20000/s), the batch is a packet and every packet
 * takes the shared path, as without a credit.
 *
 * Races: the source's bucket advances by compare-and-swap like a rule's;
 * the ban fields are plain stores, so two CPUs may both start or end one
 * ban, which changes nothing. When the table cannot take a new source the
 * source check passes (fails open); the rule-wide bucket still applies. */
static __always_inline int xl_source_admit_in(const struct xl_rule *r, __u32 slot, __u32 gen,
					      const struct xl_pkt *pkt, __u64 *now,
					      struct xl_src_scratch *sc)
{
	const struct xl_bucket *b = &r->source;
	__u64 inc = xl_bucket_inc(b, 1);
	struct xl_source_key *kp = &sc->key;

	__builtin_memset(kp, 0, sizeof(*kp));
	xl_source_key(kp, r, slot, pkt);
	struct xl_src_credit *cr = xl_src_credit_for(r, slot);
	int same = cr && cr->epoch == r->epoch && cr->mult == b->mult && cr->tol == b->tol &&
		   xl_source_key_eq(&cr->key, kp);
	if (same && cr->credit >= inc) {
		cr->credit -= inc;
		return 1;
	}
	__u64 t = xl_time_inline(now);
	__u64 now_u = t << XL_TIME_SHIFT;
	struct xl_source *s = bpf_map_lookup_elem(&xl_sources, kp);
	if (!s) {
		__u64 tat = now_u;
		__u32 zero = 0;
		__u32 *active = bpf_map_lookup_elem(&xl_gen, &zero);
		__u32 g = active ? *active : 0;
		__u32 set = xl_src_front_hash(kp) & (XL_SRC_FRONT_SETS - 1);
		__u32 blk = set / XL_SRC_FRONT_BLOCK;
		struct xl_src_front_block *fb = NULL;
		if (g && (g & 1) == gen)
			fb = bpf_map_lookup_elem(&xl_src_front, &blk);
		if (fb) {
			struct xl_src_front_set *fs = &fb->set[set & (XL_SRC_FRONT_BLOCK - 1)];
			__u32 tag = slot | (kp->family == 6 ? XL_FRONT_V6 : 0);
			__u32 owner = xl_src_front_owner(r);
			struct xl_src_front *f = NULL;
			if (xl_src_front_is(&fs->way[0], kp, tag, owner))
				f = &fs->way[0];
			else if (xl_src_front_is(&fs->way[1], kp, tag, owner))
				f = &fs->way[1];
			if (f && !xl_src_front_free(f, owner, now_u)) {
				/* Back within its emission interval: its entry,
				 * charged with the packet the front let through. */
				tat = f->t;
				f->gen = 0;
			} else if (f &&
				   now_u - f->t < ((__u64)XL_SRC_PROMOTE_NS << XL_TIME_SHIFT)) {
				/* Back soon after its TAT: a source that keeps
				 * sending near its rate; its entry, full. */
				f->gen = 0;
			} else {
				struct xl_src_front *v = f;
				if (!v && xl_src_front_free(&fs->way[0], owner, now_u))
					v = &fs->way[0];
				else if (!v && xl_src_front_free(&fs->way[1], owner, now_u))
					v = &fs->way[1];
				if (v) {
					/* Its bucket is full: the packet passes;
					 * remember it. */
					__builtin_memcpy(v->addr, kp->addr, 16);
					v->t = now_u + inc;
					v->gen = owner;
					v->slot = tag;
					v->prefixlen = kp->prefixlen;
					if (!same)
						xl_src_credit_name(cr, kp, r, b);
					return 1;
				}
				/* Both ways hold a packet charged nowhere
				 * else: an entry, as without a front. */
			}
		}
		sc->fresh =
		    (struct xl_source){.tat = tat, .epoch = r->epoch, .units = r->source_units};
		bpf_map_update_elem(&xl_sources, kp, &sc->fresh, BPF_NOEXIST);
		s = bpf_map_lookup_elem(&xl_sources, kp);
		if (!s)
			return 1;
	}
	if (s->epoch != r->epoch) {
		/* Left by an earlier rule in this slot. */
		s->tat = now_u;
		s->units = r->source_units;
		s->over_since_ns = 0;
		s->banned_until_ns = 0;
		s->drops = 0;
		s->epoch = r->epoch;
	}
	/* A change of the source limit's rate keeps how full the source's
	 * bucket is (bucket.h, xl_units_claim). */
	if (s->units != r->source_units)
		xl_src_units_claim(&s->units, &s->tat, r->source_units, b->tol, now_u);
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
		xl_src_credit_name(cr, kp, r, b);
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

/* xl_source_admit_in through this CPU's front. slot_gen: the rule's slot,
 * and its generation (0 or 1) << 8. A global function: the verifier
 * checks it once, apart from xl_apply_rule's paths. */
__noinline int xl_source_admit(const struct xl_rule *r, __u32 slot_gen, const struct xl_pkt *pkt,
			       __u64 *now)
{
	__u32 slot = slot_gen & 0xff;
	__u32 zero = 0;
	struct xl_src_scratch *sc = bpf_map_lookup_elem(&xl_src_scratch, &zero);
	if (!r || !pkt || !now || !sc || slot >= XL_MAX_RULES)
		return 1;
	return xl_source_admit_in(r, slot, (slot_gen >> 8) & 1, pkt, now, sc);
}

/* Whether rule r's per-source limit, when it has one (XL_RULE_PER_SOURCE),
 * admits the packet: xl_source_admit, through this CPU's front for the
 * rule's generation gen (0 or 1). *now is read lazily (0: not yet), and
 * only for a rule with one. */
static __always_inline int xl_source_pass_front(const struct xl_rule *r, __u32 slot, __u32 gen,
						const struct xl_pkt *pkt, __u64 *now)
{
	if (!(r->flags & XL_RULE_PER_SOURCE))
		return 1;
	/* A hot source spends its credit here, inline: a call costs more
	 * than the rest of it (xl_source_admit would do the same). */
	struct xl_src_credit *cr = xl_src_credit_for(r, slot);
	if (cr && cr->credit && xl_src_credit_holds(cr, r, slot, pkt)) {
		__u64 inc = xl_bucket_inc(&r->source, 1);
		if (cr->credit >= inc) {
			cr->credit -= inc;
			return 1;
		}
	}
	return xl_source_admit(r, slot | gen << 8, pkt, now);
}

/* As xl_source_pass_front, without the front, and inlined (the TC
 * program's charge of a validated SYN cookie: its charges only move a TAT
 * forward, so the front's refusals stay exact). */
static __always_inline int xl_source_pass(const struct xl_rule *r, __u32 slot,
					  const struct xl_pkt *pkt, __u64 *now)
{
	if (!(r->flags & XL_RULE_PER_SOURCE))
		return 1;
	__u32 zero = 0;
	struct xl_src_scratch *sc = bpf_map_lookup_elem(&xl_src_scratch, &zero);
	return !sc || xl_source_admit_in(r, slot, XL_FRONT_NONE, pkt, now, sc);
}

#endif /* XLIMIT_SOURCE_H */
