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

/* Returns 1 when the packet's source is within its own limit (and not
 * banned), charging its bucket.
 *
 * Races: the source's bucket advances by compare-and-swap like a rule's;
 * the ban fields are plain stores, so two CPUs may both start or end one
 * ban, which changes nothing. When the table cannot take a new source the
 * source check passes (fails open); the rule-wide bucket still applies. */
static __always_inline int xl_source_admit(const struct xl_rule *r, __u32 slot,
					   const struct xl_pkt *pkt, __u64 now)
{
	struct xl_source_key k = {};
	__u64 now_u = now << XL_TIME_SHIFT;

	xl_source_key(&k, r, slot, pkt);
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

	int ok = xl_gcra(&s->tat, &r->source, now_u, 1);

	if (r->flags & XL_RULE_BAN) {
		if (s->banned_until_ns) {
			/* While banned the bucket keeps measuring the offered
			 * rate; when the ban ends, a source still over its limit
			 * is banned again (hysteresis), one within it released. */
			if (now < s->banned_until_ns)
				ok = 0;
			else if (!ok)
				s->banned_until_ns = now + r->ban_ns;
			else
				s->banned_until_ns = 0;
		} else if (!ok) {
			if (!s->over_since_ns)
				s->over_since_ns = now;
			if (now - s->over_since_ns >= r->ban_after_ns)
				s->banned_until_ns = now + r->ban_ns;
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
	return !(r->flags & XL_RULE_PER_SOURCE) || xl_source_admit(r, slot, pkt, xl_time(now));
}

#endif /* XLIMIT_SOURCE_H */
