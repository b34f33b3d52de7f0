/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-source ("hot parameter") limits: each source, aggregated to the
 * rule's prefix length, gets its own bucket in a set-associative table
 * (xl_src_table), with an optional ban for sources that stay over their
 * limit. */
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

/* The per-source table's sets, a power of two: set by the loader to
 * xl_src_table's size. */
volatile const __u32 xl_cfg_src_sets = XL_SRC_SETS;

/* A way's drop count stops here (xl_src_way.drops): below the 32 bits'
 * end by more than any count of CPUs can add at once. */
#define XL_SRC_DROPS_MAX 0xffff0000u

/* The way's meta for key k (xl_src_way.meta), never 0. */
static __always_inline __u32 xl_src_meta(const struct xl_source_key *k)
{
	return k->slot << 16 | (__u32)k->family << 8 | k->prefixlen;
}

/* Whether key k's address is longer than a way holds (IPv6 beyond /64):
 * its rest is in xl_src_exts. */
static __always_inline int xl_src_long(const struct xl_source_key *k)
{
	return k->family == 6 && k->prefixlen > 64;
}

/* The hash of a source's key under the table's seed (xl_globals.src_seed)
 * that picks its set (the Go model's dataplane.SrcHash is the same). Keyed,
 * so that a spoofer cannot aim sources at one set without knowing it. */
static __always_inline __u32 xl_src_hash(const struct xl_source_key *k, __u32 seed)
{
	const __u32 *w = (const __u32 *)k->addr;
	__u32 h = (seed ^ xl_src_meta(k)) * 0x9e3779b1u;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		h = (h ^ w[i]) * 0x85ebca6bu;
		h ^= h >> 13;
	}
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h;
}

/* Sets of xl_src_table in a page (4 KiB of 128-byte sets): a source's
 * second set is in its first's page, so that looking in both takes one
 * address translation, not two (each a walk of two page tables in a VM). */
#define XL_SRC_PAGE_SETS 32

/* The two sets of the key of hash h (xl_src_hash under the table's seed):
 * pl->set[0] its first, pl->set[1] its second, another set of the same page
 * (the same only in a table of one set). */
static __always_inline void xl_src_sets(__u32 h, struct xl_src_place *pl)
{
	__u32 mask = xl_cfg_src_sets - 1;
	__u32 near = mask & (XL_SRC_PAGE_SETS - 1);
	__u32 g = h * 0x9e3779b1u;
	pl->set[0] = h & mask;
	pl->set[1] = (pl->set[0] & ~near) | ((g ^ (g >> 16)) & near);
	if (pl->set[1] == pl->set[0])
		pl->set[1] = pl->set[0] ^ (near & 1);
}

/* The way of set s that holds key k (es: the set's rests, for a key longer
 * than a way holds), or -1. */
static __always_inline int xl_src_find_in(const struct xl_src_set *s,
					  const struct xl_src_ext_set *es,
					  const struct xl_source_key *k)
{
	__u64 hi = *(const __u64 *)&k->addr[0];
#pragma unroll
	for (int i = 0; i < XL_SRC_WAYS; i++) {
		const struct xl_src_way *w = &s->way[i];
		if (w->addr == hi && (w->meta & ~XL_SRC_BANNED) == xl_src_meta(k) &&
		    (!es || (es->ext[i].addr == *(const __u64 *)&k->addr[8] &&
			     es->ext[i].meta == xl_src_meta(k))))
			return i;
	}
	return -1;
}

/* The way of set s whose loss costs least at now_u, and in *lead how much
 * its source owes (its TAT's lead over now): an empty way first, a source
 * under a ban last (es: the set's rests, which say till when; NULL when
 * the set has none). Returns the way | the count of ways whose source owes
 * something << 8. */
static __always_inline int xl_src_victim(const struct xl_src_set *s,
					 const struct xl_src_ext_set *es, __u64 now_u, __s64 *lead)
{
	int v = 0, owing = 0;
	__s64 least = 0x7fffffffffffffffLL;
#pragma unroll
	for (int i = 0; i < XL_SRC_WAYS; i++) {
		const struct xl_src_way *w = &s->way[i];
		__s64 l = !w->meta ? -0x7fffffffffffffffLL : (__s64)(w->tat - now_u);
		if ((w->meta & XL_SRC_BANNED) && es &&
		    es->ext[i].banned_until_ns > now_u >> XL_TIME_SHIFT)
			l = 0x7ffffffffffffffeLL;
		owing += l > 0;
		if (l < least) {
			least = l;
			v = i;
		}
	}
	*lead = least;
	return (v & (XL_SRC_WAYS - 1)) | owing << 8;
}

/* Whether a way of set s holds a source under a ban. */
static __always_inline int xl_src_any_banned(const struct xl_src_set *s)
{
	return (s->way[0].meta | s->way[1].meta | s->way[2].meta | s->way[3].meta) & XL_SRC_BANNED;
}

/* Finds the way of key k in xl_src_table: in its first set, else in its
 * second (xl_src_sets: two choices, so that a set that more sources hash
 * to than it has ways spills into another rather than forgetting one;
 * with four ways a set, a table holds nearly as many sources as it has
 * ways before it forgets any). With claim, a key neither set holds takes
 * a way, written as a full bucket of rule r at now_u: the one whose loss
 * costs least (xl_src_victim) of the set where fewer sources owe something
 * (its first on a tie), or, both full, of the two. What the table forgets is what costs
 * least: nothing for a source whose bucket has refilled, at most its TAT's
 * lead over now for the others (a source forgotten before its bucket
 * refilled is admitted that much early, at most its burst; one seen once,
 * as a spoofed source is, owes one packet).
 *
 * h: the key's hash under the table's seed (xl_src_hash), which the
 * caller may have needed already. Inlined (a call more would pass the
 * stack 6.1 allows the programs' chains of calls), its place written off
 * the stack (pl, in xl_src_scratch): pl->set[0] the set, the lookups' key,
 * pl->way the way. Returns the way, or NULL.
 *
 * Races: a claim writes its way with plain stores, meta last; a CPU that
 * reads the way meanwhile may match it with another key's TAT, or two CPUs
 * claim one way for two sources, or one source twice in its two sets, and
 * one is charged with the other's first packet: either way one source's
 * bucket errs by a packet. */
static __always_inline struct xl_src_way *xl_src_locate(const struct xl_source_key *k,
							const struct xl_rule *r, __u64 now_u,
							__u32 h, __u32 claim,
							struct xl_src_place *pl)
{
	xl_src_sets(h, pl);
	int lng = xl_src_long(k);
	/* Loops, not unrolled: the compiler keeps one set's values at a time
	 * in registers, not both sets' on the stack. */
#pragma nounroll
	for (int t = 0; t < 2; t++) {
		struct xl_src_set *s = bpf_map_lookup_elem(&xl_src_table, &pl->set[t]);
		if (!s)
			return NULL;
		struct xl_src_ext_set *es = NULL;
		if (lng) {
			es = bpf_map_lookup_elem(&xl_src_exts, &pl->set[t]);
			if (!es)
				return NULL;
		}
		int i = xl_src_find_in(s, es, k);
		if (i >= 0) {
			pl->set[0] = pl->set[t];
			pl->way = i;
			return &s->way[i & (XL_SRC_WAYS - 1)];
		}
	}
	if (!claim)
		return NULL;

#pragma nounroll
	for (int t = 0; t < 2; t++) {
		struct xl_src_set *s = bpf_map_lookup_elem(&xl_src_table, &pl->set[t]);
		if (!s)
			return NULL;
		struct xl_src_ext_set *es = NULL;
		/* Their rests say till when their bans last. */
		if (xl_src_any_banned(s)) {
			es = bpf_map_lookup_elem(&xl_src_exts, &pl->set[t]);
			if (!es)
				return NULL;
		}
		__s64 lead;
		int v = xl_src_victim(s, es, now_u, &lead);
		int n = v >> 8;
		/* The set where fewer sources owe (two choices balance the
		 * sets); both full, the way that owes least. */
		if (!t || n < pl->owed ||
		    (n == XL_SRC_WAYS && pl->owed == XL_SRC_WAYS && lead < pl->best)) {
			pl->best = lead;
			pl->owed = n;
			pl->chosen = pl->set[t];
			pl->way = v & (XL_SRC_WAYS - 1);
		}
	}
	pl->set[0] = pl->chosen;
	struct xl_src_set *s = bpf_map_lookup_elem(&xl_src_table, &pl->set[0]);
	if (!s)
		return NULL;
	struct xl_src_way *w = &s->way[pl->way & (XL_SRC_WAYS - 1)];
	w->meta = 0;
	w->addr = *(const __u64 *)&k->addr[0];
	w->tat = now_u;
	w->units = r->source_units;
	w->epoch = r->epoch;
	w->drops = 0;
	if (lng) {
		struct xl_src_ext_set *es = bpf_map_lookup_elem(&xl_src_exts, &pl->set[0]);
		if (!es)
			return NULL;
		struct xl_src_ext *x = &es->ext[pl->way & (XL_SRC_WAYS - 1)];
		__u64 lo = *(const __u64 *)&k->addr[8];
		if (x->addr != lo || x->meta != xl_src_meta(k)) {
			/* Another source's: its ban is not this one's. */
			x->addr = lo;
			x->meta = xl_src_meta(k);
			x->over_since_ns = 0;
			x->banned_until_ns = 0;
		}
	}
	*(volatile __u32 *)&w->meta = xl_src_meta(k);
	return w;
}

/* Gives the credit cr holds back to its source's bucket before another
 * source takes cr over: the TAT moves back by it (a bucket that has
 * refilled in the meantime stays full: a TAT behind now counts as now).
 * When the source's way is gone (taken by another source, or reset for
 * another rule), is in other units than the credit (the rule's source
 * rate changed since, xl_units_claim), or the compare-and-swap keeps
 * losing, the credit is lost, and the source's limit errs low by at most
 * that much. */
static __always_inline void xl_src_credit_return(struct xl_src_credit *cr, const struct xl_rule *r,
						 __u32 seed, struct xl_src_place *pl)
{
	__u64 credit = cr->credit;
	if (!credit)
		return;
	cr->credit = 0;
	struct xl_src_way *o = xl_src_locate(&cr->key, r, 0, xl_src_hash(&cr->key, seed), 0, pl);
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
					       const struct xl_rule *r, const struct xl_bucket *b,
					       __u32 seed, struct xl_src_place *pl)
{
	if (!cr)
		return;
	xl_src_credit_return(cr, r, seed, pl);
	cr->key = *k;
	cr->epoch = r->epoch;
	cr->mult = b->mult;
	cr->tol = b->tol;
}

/* A ban rule's verdict at t for the source of way w (sc: its key, place,
 * and whether its bucket had refilled before this packet), given the
 * bucket's ok: its
 * ban state is in xl_src_exts, valid while that holds w's key and epoch
 * (else it starts afresh). While banned the bucket keeps measuring the
 * offered rate; when the ban ends, a source still over its limit is
 * banned again (hysteresis), one within it released. The fields are plain
 * stores: two CPUs may both start or end one ban, which changes nothing. */
static __always_inline int xl_src_ban(struct xl_src_way *w, struct xl_src_scratch *sc,
				      const struct xl_rule *r, __u64 t, int ok)
{
	const struct xl_source_key *k = &sc->key;
	struct xl_src_ext_set *es = bpf_map_lookup_elem(&xl_src_exts, &sc->pl.set[0]);
	if (!es)
		return ok;
	struct xl_src_ext *x = &es->ext[sc->pl.way & (XL_SRC_WAYS - 1)];
	__u32 meta = xl_src_meta(k);
	__u64 addr = xl_src_long(k) ? *(const __u64 *)&k->addr[8] : w->addr;
	if (x->meta != meta || x->addr != addr || x->epoch != w->epoch) {
		x->addr = addr;
		x->meta = meta;
		x->epoch = w->epoch;
		x->over_since_ns = 0;
		x->banned_until_ns = 0;
	}
	/* A bucket that refilled completely ends an over-limit run. */
	if (sc->refilled)
		x->over_since_ns = 0;
	if (x->banned_until_ns) {
		if (t < x->banned_until_ns)
			ok = 0;
		else if (!ok)
			x->banned_until_ns = t + r->ban_ns;
		else
			x->banned_until_ns = 0;
	} else if (!ok) {
		if (!x->over_since_ns)
			x->over_since_ns = t;
		if (t - x->over_since_ns >= r->ban_after_ns)
			x->banned_until_ns = t + r->ban_ns;
	}
	/* The filter must let the source's packets reach the table by then. */
	sc->fnext_ns = x->banned_until_ns ? x->banned_until_ns
		       : x->over_since_ns ? x->over_since_ns + r->ban_after_ns
					  : 0;
	__u32 m = w->meta;
	__u32 want = x->banned_until_ns ? m | XL_SRC_BANNED : m & ~XL_SRC_BANNED;
	if (m && want != m)
		w->meta = want;
	return ok;
}

/* The per-source filter's lines per CPU (a power of two), and the CPUs
 * it has lines for: set by the loader to xl_src_filter's size. A CPU
 * beyond them goes without. */
volatile const __u32 xl_cfg_srcf_lines = XL_SRCF_LINES;
volatile const __u32 xl_cfg_srcf_cpus = 1;

/* The fingerprint of key k in the filter under seed, for rule r's
 * per-source settings: a hash apart from the set's, over the rule's epoch
 * and units too, so that an entry written under other settings matches
 * nothing. Never 0 (an empty entry's). */
static __always_inline __u32 xl_srcf_fp(const struct xl_source_key *k, __u32 seed,
					const struct xl_rule *r)
{
	__u32 salt = 0x6a09e667u ^ r->epoch * 0x9e3779b1u ^ r->source_units * 0x85ebca6bu;
	return xl_src_hash(k, seed ^ salt) | 1;
}

/* This CPU's line of the filter for the source of sc (picked by its set
 * hash, sc->hash), its key kept in sc->fline (~0: none), or NULL. */
static __always_inline struct xl_srcf_line *xl_srcf_line(struct xl_src_scratch *sc)
{
	__u32 cpu = bpf_get_smp_processor_id();
	sc->fline = ~0u;
	if (cpu >= xl_cfg_srcf_cpus)
		return NULL;
	sc->fline = cpu * xl_cfg_srcf_lines + (sc->hash & (xl_cfg_srcf_lines - 1));
	return bpf_map_lookup_elem(&xl_src_filter, &sc->fline);
}

/* Whether entry e still refuses its source at n (now in the filter's
 * units): its till is ahead of n, by no more than an entry holds. */
static __always_inline int xl_srcf_live(__u64 e, __u32 n)
{
	__u32 d = ((__u32)(e >> 8) - n) & 0xffffff;
	return d && d <= XL_SRCF_MAX_WAIT;
}

/* Whether entry i of line l still refuses its source at now_ns: a line
 * written more than XL_SRCF_MAX_WAIT_NS ago holds none (its tills could
 * read as ahead once their 24 bits wrap). */
static __always_inline int xl_srcf_holds(const struct xl_srcf_line *l, __u64 e, __u64 now_ns)
{
	return now_ns - l->stamp_ns <= XL_SRCF_MAX_WAIT_NS &&
	       xl_srcf_live(e, now_ns >> XL_SRCF_SHIFT);
}

/* The entry of line l with fingerprint fp, or -1. */
static __always_inline int xl_srcf_find(const struct xl_srcf_line *l, __u32 fp)
{
	int f = -1;
#pragma unroll
	for (int i = 0; i < XL_SRCF_WAYS; i++)
		if ((__u32)(l->e[i] >> 32) == fp)
			f = i;
	return f;
}

/* Writes the filter's entry for the source of sc (its line, fingerprint
 * and entry, xl_source_admit_in's lookup) at now_ns: refused till till_ns,
 * or, when that is not a whole unit ahead, no entry. Before an entry is
 * written, every entry of the line that refuses no more is marked so (its
 * till: now; its fingerprint and count kept), and the line stamped: after
 * a write every till is within XL_SRCF_MAX_WAIT of the stamp. A new entry takes an
 * empty or lapsed one, else one picked by its fingerprint (what that
 * loses: the count of the packets it refused since its source last
 * reached the table, which its way's drops then never get). */
static __always_inline void xl_srcf_write(struct xl_src_scratch *sc, __u64 now_ns, __u64 till_ns)
{
	if (sc->fline == ~0u)
		return;
	struct xl_srcf_line *l = bpf_map_lookup_elem(&xl_src_filter, &sc->fline);
	if (!l)
		return;
	__u32 n = now_ns >> XL_SRCF_SHIFT;
	/* In whole units, from now's (all 64 bits: n is cut to 32, which
	 * 2^52 ns of uptime, 52 days, pass). */
	__u64 w = till_ns > now_ns ? (till_ns >> XL_SRCF_SHIFT) - (now_ns >> XL_SRCF_SHIFT) : 0;
	if (w > XL_SRCF_MAX_WAIT)
		w = XL_SRCF_MAX_WAIT;
	__u32 i = sc->fway;
	if (!w) {
		/* Nothing written: the line and its stamp stay as they are. */
		if (i < XL_SRCF_WAYS)
			l->e[i] = 0;
		return;
	}
	int stale = now_ns - l->stamp_ns > XL_SRCF_MAX_WAIT_NS;
#pragma unroll
	for (int j = 0; j < XL_SRCF_WAYS; j++) {
		__u64 e = l->e[j];
		if (e && (stale || !xl_srcf_live(e, n)))
			l->e[j] = (e & ~(0xffffffull << 8)) | (__u64)(n & 0xffffff) << 8;
	}
	l->stamp_ns = now_ns;
	if (i >= XL_SRCF_WAYS) {
		i = sc->fp % XL_SRCF_WAYS;
#pragma unroll
		for (int j = XL_SRCF_WAYS - 1; j >= 0; j--)
			if (!(l->e[j] >> 32) || !xl_srcf_live(l->e[j], n))
				i = j;
	}
	/* Kept from the compiler, which knows the bound, for the verifier,
	 * which does not know a remainder's. */
	asm volatile("" : "+r"(i));
	if (i < XL_SRCF_WAYS)
		l->e[i] = (__u64)sc->fp << 32 | (__u64)((n + (__u32)w) & 0xffffff) << 8;
}

/* xl_source_admit_in's answer when the source's way is in other units
 * than the rule's per-source settings (their rate changed since it was
 * written): xl_src_rescale first, then again. */
#define XL_SRC_RESCALE 2

/* Brings the way of the packet's source for rule r in slot to the units of
 * the rule's per-source settings (bucket.h, xl_units_claim): a change of
 * rate keeps how full its bucket is. Apart from xl_source_admit_in, whose
 * frame its arithmetic would pass the stack 6.1 allows the chain of calls
 * (sc: the scratch, its key written here). */
static __always_inline void xl_src_rescale_in(const struct xl_rule *r, __u32 slot, __u32 seed,
					      const struct xl_pkt *pkt, __u64 *now,
					      struct xl_src_scratch *sc)
{
	__builtin_memset(&sc->key, 0, sizeof(sc->key));
	xl_source_key(&sc->key, r, slot, pkt);
	__u64 now_u = xl_time_inline(now) << XL_TIME_SHIFT;
	struct xl_src_way *w =
	    xl_src_locate(&sc->key, r, now_u, xl_src_hash(&sc->key, seed), 0, &sc->pl);
	if (w && w->epoch == r->epoch && w->units != r->source_units)
		xl_src_units_claim(&w->units, &w->tat, r->source_units, r->source.tol, now_u);
}

/* Returns 1 when the packet's source is within its own limit (and not
 * banned), charging its bucket in xl_src_table (its way found or taken by
 * xl_src_locate). *now is read lazily (0: not yet). seed: the table's
 * (xl_globals.src_seed).
 *
 * A CPU's credit in front of the shared bucket (xl_src_credits, as
 * xl_cache is for a rule's): when the same source comes twice in a row to
 * this CPU, the second packet borrows up to XL_BATCH_NS worth of the
 * source's rate (at most a quarter of its burst) in one compare-and-swap,
 * and the source's next packets spend it without touching the shared
 * way or reading the clock. A packet of another source gives what is
 * left back to the source that held it (xl_src_credit_return), so a mix
 * of sources on one CPU loses nothing. Bound: tokens are charged before
 * they are spent, so a source is admitted no more than its bucket allows
 * plus the credit the CPUs held at the start (one batch each), plus what
 * its evictions forgot (xl_src_locate); below a rate of one packet per
 * batch (20000/s), the batch is a packet and every packet takes the shared
 * path, as without a credit.
 *
 * Races: the source's bucket advances by compare-and-swap like a rule's.
 * Without a table (it failed to load) the source check passes (fails
 * open); the rule-wide bucket still applies. XL_SRC_RESCALE: the way is
 * in other units (xl_src_rescale). */
static __always_inline int xl_source_admit_in(const struct xl_rule *r, __u32 slot, __u32 seed,
					      const struct xl_pkt *pkt, __u64 *now,
					      struct xl_src_scratch *sc)
{
	const struct xl_bucket *b = &r->source;
	__u64 inc = xl_bucket_inc(b, 1);

	__builtin_memset(&sc->key, 0, sizeof(sc->key));
	xl_source_key(&sc->key, r, slot, pkt);
	struct xl_src_credit *cr = xl_src_credit_for(r, slot);
	int same = cr && cr->epoch == r->epoch && cr->mult == b->mult && cr->tol == b->tol &&
		   xl_source_key_eq(&cr->key, &sc->key);
	if (same && cr->credit >= inc) {
		cr->credit -= inc;
		return 1;
	}
	/* What the rest needs after the lookup is kept in the scratch, and
	 * the credit looked up again, not spilled: xl_source_admit's frame
	 * stays within 6.1's chain of calls. */
	sc->same = same;
	sc->seed = seed;
	sc->hash = xl_src_hash(&sc->key, seed);
	sc->held = 0;
	__u64 now_ns = xl_time_inline(now);
	/* The filter: a source the table refused and whose bucket refuses it
	 * still is dropped here, on the CPU's own line, and counted there. */
	sc->fway = -1;
	sc->fcarry = 0;
	sc->fnext_ns = 0;
	struct xl_srcf_line *l = xl_srcf_line(sc);
	if (l) {
		sc->fp = xl_srcf_fp(&sc->key, seed, r);
		__u32 i = xl_srcf_find(l, sc->fp);
		if (i < XL_SRCF_WAYS) {
			__u64 *e = &l->e[i];
			if (xl_srcf_holds(l, *e, now_ns) && (*e & 0xff) < XL_SRCF_COUNT_MAX) {
				*e += 1;
				return 0;
			}
			sc->fway = i;
			sc->fcarry = *e & 0xff;
		}
	}
	__u64 now_u = now_ns << XL_TIME_SHIFT;
	struct xl_src_way *s = xl_src_locate(&sc->key, r, now_u, sc->hash, 1, &sc->pl);
	if (!s)
		return 1;
	if (s->epoch != r->epoch) {
		/* Left by an earlier rule in this slot. */
		s->tat = now_u;
		s->units = r->source_units;
		s->drops = 0;
		s->epoch = r->epoch;
		s->meta &= ~XL_SRC_BANNED;
	}
	/* A change of the source limit's rate keeps how full the source's
	 * bucket is (xl_src_rescale): that first. */
	if (s->units != r->source_units)
		return XL_SRC_RESCALE;
	sc->refilled = (__s64)(s->tat - now_u) <= 0;

	int ok;
	b = &r->source;
	inc = xl_bucket_inc(b, 1);
	cr = xl_src_credit_for(r, sc->key.slot);
	if (sc->same && cr) {
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
		else
			sc->held = cr->credit;
	} else {
		xl_src_credit_name(cr, &sc->key, r, b, sc->seed, &sc->cpl);
		ok = xl_gcra(&s->tat, b, now_u, 1);
	}

	if (r->flags & XL_RULE_BAN)
		ok = xl_src_ban(s, sc, r, now_u >> XL_TIME_SHIFT, ok);
	/* The filter's count of this source's drops comes with this one. */
	__u32 add = !ok + sc->fcarry;
	if (add && s->drops < XL_SRC_DROPS_MAX)
		__sync_fetch_and_add(&s->drops, add);

	/* Refused: till when its bucket refuses it anyway, for the filter.
	 * It conforms once its TAT, less the credit this CPU holds for it
	 * (sc->held: it goes back to the TAT before anything else can spend
	 * it), is within the tolerance of the packet's increment. A ban
	 * rule's source reaches the table again when its ban ends or would
	 * start. */
	__u64 till = 0;
	if (!ok) {
		__s64 ahead = (__s64)(s->tat + inc - b->tol - sc->held - now_u);
		if (ahead > 0)
			till = now_u / (1 << XL_TIME_SHIFT) + (__u64)ahead / (1 << XL_TIME_SHIFT);
		if ((r->flags & XL_RULE_BAN) && sc->fnext_ns && sc->fnext_ns < till)
			till = sc->fnext_ns;
	}
	xl_srcf_write(sc, now_u >> XL_TIME_SHIFT, till);
	return ok;
}

/* The table's seed for generation gen's rules (xl_globals.src_seed). */
static __always_inline __u32 xl_src_seed(struct xl_src_scratch *sc, __u32 gen)
{
	sc->gen = gen;
	struct xl_globals *g = bpf_map_lookup_elem(&xl_config, &sc->gen);
	return g ? g->src_seed : 0;
}

/* The scratch of xl_source_admit and xl_src_rescale (slot_gen as
 * theirs), its seed read into sc->seed, or NULL when an argument is
 * missing or out of range. */
static __always_inline struct xl_src_scratch *xl_src_enter(const struct xl_rule *r, __u32 slot_gen,
							   const struct xl_pkt *pkt, __u64 *now)
{
	__u32 zero = 0;
	struct xl_src_scratch *sc = bpf_map_lookup_elem(&xl_src_scratch, &zero);
	if (!r || !pkt || !now || !sc || (slot_gen & 0xff) >= XL_MAX_RULES)
		return NULL;
	sc->seed = xl_src_seed(sc, (slot_gen >> 8) & 1);
	return sc;
}

/* xl_source_admit_in for the XDP program. slot_gen: the rule's slot, and
 * its generation (0 or 1) << 8. A global function: the verifier checks it
 * once, apart from xl_apply_rule's paths. */
__noinline int xl_source_admit(const struct xl_rule *r, __u32 slot_gen, const struct xl_pkt *pkt,
			       __u64 *now)
{
	struct xl_src_scratch *sc = xl_src_enter(r, slot_gen, pkt, now);
	if (!sc)
		return 1;
	return xl_source_admit_in(r, slot_gen & 0xff, sc->seed, pkt, now, sc);
}

/* xl_src_rescale_in for the XDP program, as xl_source_admit. A global
 * function of its own, called beside xl_source_admit, not below it. */
__noinline int xl_src_rescale(const struct xl_rule *r, __u32 slot_gen, const struct xl_pkt *pkt,
			      __u64 *now)
{
	struct xl_src_scratch *sc = xl_src_enter(r, slot_gen, pkt, now);
	if (sc)
		xl_src_rescale_in(r, slot_gen & 0xff, sc->seed, pkt, now, sc);
	return 0;
}

/* Whether rule r's per-source limit, when it has one (XL_RULE_PER_SOURCE),
 * admits the packet: xl_source_admit, for the rule of generation gen (0 or
 * 1). *now is read lazily (0: not yet), and only for a rule with one. */
static __always_inline int xl_source_check(const struct xl_rule *r, __u32 slot, __u32 gen,
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
	int ok = xl_source_admit(r, slot | gen << 8, pkt, now);
	if (ok == XL_SRC_RESCALE) {
		xl_src_rescale(r, slot | gen << 8, pkt, now);
		/* In the rule's units now (again XL_SRC_RESCALE only if its
		 * settings changed meanwhile: then it passes, once). */
		ok = xl_source_admit(r, slot | gen << 8, pkt, now);
	}
	return ok != 0;
}

/* As xl_source_check, inlined (the TC program's charge of a validated SYN
 * cookie), after xl_src_rescale_in (xl_cookie_units): a way still in
 * other units (the settings changed in between) passes, once. */
static __always_inline int xl_source_pass(const struct xl_rule *r, __u32 slot, __u32 gen,
					  const struct xl_pkt *pkt, __u64 *now)
{
	if (!(r->flags & XL_RULE_PER_SOURCE))
		return 1;
	__u32 zero = 0;
	struct xl_src_scratch *sc = bpf_map_lookup_elem(&xl_src_scratch, &zero);
	return !sc || xl_source_admit_in(r, slot, xl_src_seed(sc, gen), pkt, now, sc);
}

#endif /* XLIMIT_SOURCE_H */
