/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The flood memo: a drop in a run without clock reads, repeated without
 * the rule's work.
 *
 * In a flood a rule's bucket is empty and its CPU cache drops the next
 * XL_SKIP_DROPS packets short of credit without reading the clock
 * (bucket.h, xl_cache_empty). Those drops still cost the rule's lookups,
 * its limit, its gates and its exit. The memo records, per CPU, the
 * packet that such a drop answered: the generation, the rules it matched
 * and whether it was a SYN, and it takes the rest of the run over from the
 * rule's cache. A later packet that matches the same rules in the same
 * generation and tick takes one of those drops directly: one map lookup,
 * and one count in the memo's own entry (xl_flood.counts, which readers
 * add to the slot's and the global slot's counts for the rate).
 *
 * A memo is made only where the rule's decision depends on nothing but the
 * run: the dropping rule is the first the packet matched (no rule before it
 * charged the packet), the drop's reason is the rate (no cookie, reset,
 * shadow or gate), the packet is no fragment, the cost is a packet (a byte
 * rule's smaller packet may fit the credit), and a SYN's rule has no
 * SYN-only feature (cookies, `refuse: reset`, concurrency, the control
 * loop's gates and in-flight cap).
 *
 * Bound: the memo changes no count. The run is the one the cache was
 * granted after its clock read: the memo holds what was left of it, and a
 * packet of the rule that the memo does not answer finds the cache's run
 * over and reads the clock. So a run still drops at most XL_SKIP_DROPS
 * packets after the read that started it, within that read's tick. What
 * the memo skips is the rule's settings: a reload (the generation changes)
 * voids it at once, and so does a packet of the rule that finds the cache
 * filled under other settings (xl_cache_claim); otherwise a new limit
 * from the control loop, or one past its deadline, is seen by the memo's
 * packets at the next tick (at most 4 ms at HZ=250), as xl_limit_for sees
 * a deadline. */
#ifndef XLIMIT_FLOOD_H
#define XLIMIT_FLOOD_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "clock.h"
#include "gen.h"
#include "maps.h"
#include "parse.h"
#include "types.h"

/* The SYN-only features that make a SYN's drop more than the rate's. */
#define XL_FLOOD_SYN_FLAGS                                                                         \
	(XL_RULE_COOKIE_AUTO | XL_RULE_COOKIE_ALWAYS | XL_RULE_REFUSE_RESET | XL_RULE_CONCURRENCY)

/* Whether the drop of a packet that matched mask by rule r in slot (in a
 * run, for the rate) may be repeated for the packets that match as it did:
 * see above. */
static __always_inline int xl_flood_repeatable(const struct xl_rule *r, __u32 slot,
					       const struct xl_pkt *pkt, __u64 mask,
					       const struct xl_limit *lim)
{
	if ((mask & ((1ULL << slot) - 1)) || (pkt->fragment | pkt->first_frag))
		return 0;
	if (r->flags & (XL_RULE_SHADOW | XL_RULE_BYTES | XL_RULE_PER_SOURCE))
		return 0;
	if (!pkt->syn)
		return 1;
	return !(r->flags & XL_FLOOD_SYN_FLAGS) && (!lim || (!lim->gate_drop && !lim->conc_cap));
}

/* Records the drop of a packet that matched mask by the rule in slot,
 * whose cache c has drops left in its run, and takes the run over. */
static __always_inline void xl_flood_note(__u64 mask, __u32 slot, __u32 syn, struct xl_cache *c)
{
	__u32 zero = 0;
	__u64 gen = xl_gen_word(&zero);
	struct xl_flood *f = bpf_map_lookup_elem(&xl_flood, &zero);
	if (gen == XL_GEN_NONE || !f || !c->skip)
		return;
	f->mask = mask;
	f->tick = c->tick;
	f->gen = gen;
	f->left = c->skip;
	f->slot = slot;
	f->syn = syn;
	c->skip = 0;
}

/* Drops and counts the packet when this CPU's memo answers it: the same
 * generation (xl_gen's value, gen.h), rules (mask, not 0) and SYN flag, in the
 * memo's tick, with drops left in its run. Returns 1 when it did.
 *
 * Inlined, with the caller's key 0 (zero) for its lookups: a call (its
 * return goes through the kernel's return thunk) would cost more than the
 * rest, and a value the caller had to keep for it, or a key of its own,
 * would take a stack slot that 6.1's verifier does not allow xlimit_xdp
 * (docs/dataplane.md, docs/kernels.md). */
static __always_inline int xl_flood_drop(const __u32 *zero, __u64 mask, __u32 syn, __u64 len)
{
	struct xl_flood *f = bpf_map_lookup_elem(&xl_flood, zero);
	__u64 gen = xl_gen_word(zero);
	if (!f || f->mask != mask || f->gen != gen || f->syn != syn || !f->left ||
	    f->tick != xl_tick())
		return 0;
	__u32 slot = f->slot;
	if (slot >= XL_MAX_RULES)
		return 0;
	f->left--;
	f->counts[slot].packets++;
	f->counts[slot].bytes += len;
	return 1;
}

#endif /* XLIMIT_FLOOD_H */
