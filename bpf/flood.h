/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The flood memo: a drop in a run without clock reads, repeated without
 * the rule's work.
 *
 * In a flood a rule's bucket is empty and its CPU cache drops the next
 * XL_SKIP_DROPS packets short of credit without reading the clock
 * (bucket.h, xl_cache_empty). Those drops still cost the rule's lookups,
 * its limit, its gates and its exit. The memo records, per CPU, the
 * packet that such a drop answered: the generation, the rules it matched
 * and whether it was a SYN. A later packet that matches the same rules in
 * the same generation and tick takes one of the run's drops directly and
 * is counted as the rule would count it.
 *
 * A memo is made only where the rule's decision depends on nothing but the
 * run: the dropping rule is the first the packet matched (no rule before it
 * charged the packet), the drop's reason is the rate (no cookie, reset,
 * shadow or gate), the packet is no fragment, the cost is a packet (a byte
 * rule's smaller packet may fit the credit), and a SYN's rule has no
 * SYN-only feature (cookies, `refuse: reset`, concurrency, the control
 * loop's gates and in-flight cap).
 *
 * Bound: the memo changes no count. The run is the cache's (c->skip): a
 * memo hit takes one of its drops, so a CPU still reads the clock at least
 * once per XL_SKIP_DROPS + 1 drops of a rule and at least once per tick.
 * What the memo skips is the rule's settings: a reload (the generation
 * changes) voids it at once; a new limit from the control loop, or one
 * past its deadline, is seen by the memo's packets at the next tick (at
 * most 4 ms at HZ=250), as xl_limit_for sees a deadline. */
#ifndef XLIMIT_FLOOD_H
#define XLIMIT_FLOOD_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "clock.h"
#include "maps.h"
#include "parse.h"
#include "stats.h"
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
 * whose cache c has drops left in its run. */
static __always_inline void xl_flood_note(__u64 mask, __u32 slot, __u32 syn,
					  const struct xl_cache *c)
{
	__u32 zero = 0;
	__u32 *gen = bpf_map_lookup_elem(&xl_gen, &zero);
	struct xl_flood *f = bpf_map_lookup_elem(&xl_flood, &zero);
	if (!gen || !f || !c->skip)
		return;
	f->mask = mask;
	f->tick = c->tick;
	f->gen = *gen;
	f->slot = slot;
	f->syn = syn;
}

/* Drops and counts the packet when this CPU's memo answers it: the same
 * generation (gen, xl_gen's raw value), rules (mask, not 0) and SYN flag,
 * in the memo's tick, with drops left in the rule's run. Returns 1 when
 * it did. A global function: the verifier checks it once. */
__noinline int xl_flood_drop(__u64 mask, __u32 syn, __u32 gen, __u64 len)
{
	__u32 zero = 0;
	struct xl_flood *f = bpf_map_lookup_elem(&xl_flood, &zero);
	if (!f || f->mask != mask || f->gen != gen || f->syn != syn)
		return 0;
	__u64 tick = xl_tick();
	__u32 slot = f->slot;
	if (f->tick != tick || slot >= XL_MAX_RULES)
		return 0;
	struct xl_cache *c = bpf_map_lookup_elem(&xl_caches, &slot);
	if (!c || !c->skip || c->tick != tick)
		return 0;
	c->skip--;
	xl_count(slot, XL_VERDICT_DROP, XL_REASON_RULE, len);
	xl_count(XL_GLOBAL_SLOT, XL_VERDICT_DROP, XL_REASON_RULE, len);
	return 1;
}

#endif /* XLIMIT_FLOOD_H */
