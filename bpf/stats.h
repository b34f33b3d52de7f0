/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU counters: packets and bytes by verdict, packets by reason. */
#ifndef XLIMIT_STATS_H
#define XLIMIT_STATS_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "types.h"

static __always_inline void xl_count(__u32 slot, __u32 verdict, __u32 reason, __u64 bytes)
{
	struct xl_counters *c = bpf_map_lookup_elem(&xl_stats, &slot);
	if (!c || verdict >= XL_VERDICT_MAX || reason >= XL_REASON_MAX)
		return;
	c->packets[verdict]++;
	c->bytes[verdict] += bytes;
	c->reasons[reason]++;
}

/* Counts what became of a refused SYN's reset (enum xl_reset_outcome). */
static __always_inline void xl_count_reset(__u32 slot, __u32 outcome)
{
	struct xl_counters *c = bpf_map_lookup_elem(&xl_stats, &slot);
	if (c && outcome < XL_RESET_MAX)
		c->resets[outcome]++;
}

#endif /* XLIMIT_STATS_H */
