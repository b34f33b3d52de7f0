/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Fragments of datagrams to port rules. A later (non-first) fragment
 * carries no L4 header, so no port: it takes the port rules its datagram's
 * first fragment matched, remembered in xl_frags under (source,
 * destination, protocol, IP ID), and is charged to them like any packet
 * (its own length for byte rules). Once a rule drops a fragment, the rest
 * of the datagram, useless to the host, is dropped without a charge. A
 * later fragment whose first fragment was not seen (lost, reordered,
 * evicted, or never sent) is an orphan and is dropped: it cannot be
 * reassembled into anything the rules admitted.
 *
 * Only protocols with a port rule that takes fragments (xl_globals.
 * frag_match) are followed; a packet that is no fragment never reaches
 * this file (one flag test). docs/dataplane.md, "Fragments". */
#ifndef XLIMIT_FRAG_H
#define XLIMIT_FRAG_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "parse.h"
#include "types.h"

/* Whether the fragments of the packet's protocol are followed. */
static __always_inline int xl_frag_followed(const struct xl_pkt *pkt, const struct xl_globals *g)
{
	return pkt->proto < XL_PORT_PROTOS && g->frag_match[pkt->proto & 1];
}

static __always_inline void xl_frag_key(struct xl_frag_key *k, const struct xl_pkt *pkt)
{
	__builtin_memcpy(k->saddr, pkt->saddr, 16);
	__builtin_memcpy(k->daddr, pkt->daddr, 16);
	k->id = pkt->frag_id;
	k->family = pkt->family;
	k->proto = pkt->l4;
}

/* A later fragment of a followed protocol: adds the rules of its
 * datagram's first fragment to *mask and sets *entry. Returns 0, or the
 * reason it is dropped before any rule: XL_REASON_FRAGMENT_ORPHAN, or
 * XL_REASON_FRAGMENT when a fragment of the datagram was dropped already
 * (*slot is then the rule that dropped it). */
static __always_inline __u32 xl_frag_follow(const struct xl_pkt *pkt, __u64 *mask,
					    struct xl_frag **entry, __u32 *slot)
{
	struct xl_frag_key k = {};
	xl_frag_key(&k, pkt);
	struct xl_frag *e = bpf_map_lookup_elem(&xl_frags, &k);
	if (!e)
		return XL_REASON_FRAGMENT_ORPHAN;
	if (e->dropped) {
		*slot = e->dropped - 1;
		return XL_REASON_FRAGMENT;
	}
	*mask |= e->rules;
	*entry = e;
	return 0;
}

/* After the rules, dropped being the slot + 1 of the rule that dropped the
 * packet (0: none). A first fragment of a followed protocol records the
 * rules it matched (mask) that take fragments, and its fate; a later
 * fragment (entry from xl_frag_follow) that a rule dropped marks its
 * datagram dropped. */
static __always_inline void xl_frag_done(const struct xl_pkt *pkt, const struct xl_globals *g,
					 struct xl_frag *entry, __u64 mask, __u32 dropped)
{
	if (entry) {
		if (dropped)
			entry->dropped = dropped;
		return;
	}
	if (!pkt->first_frag || !xl_frag_followed(pkt, g))
		return;
	struct xl_frag_key k = {};
	xl_frag_key(&k, pkt);
	struct xl_frag v = {.rules = mask & g->frag_match[pkt->proto & 1], .dropped = dropped};
	bpf_map_update_elem(&xl_frags, &k, &v, BPF_ANY);
}

#endif /* XLIMIT_FRAG_H */
