/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Source-prefix lookup and rule matching. */
#ifndef XLIMIT_MATCH_H
#define XLIMIT_MATCH_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "parse.h"
#include "types.h"

/* Looks the packet's source up in the generation's prefix trie. Returns the
 * entry, or NULL when no prefix contains it (or the trie is empty). */
static __always_inline struct xl_prefix *xl_lookup_source(const struct xl_pkt *pkt, __u32 gen,
							  const struct xl_globals *g)
{
	if (pkt->family == 4) {
		if (!(g->flags & XL_G_PREFIXES_V4))
			return NULL;
		struct xl_lpm4_key k = {.prefixlen = 32 + 32, .gen = gen};
		__builtin_memcpy(k.addr, pkt->saddr, 4);
		return bpf_map_lookup_elem(&xl_prefix4, &k);
	}
	if (!(g->flags & XL_G_PREFIXES_V6))
		return NULL;
	struct xl_lpm6_key k = {.prefixlen = 32 + 128, .gen = gen};
	__builtin_memcpy(k.addr, pkt->saddr, 16);
	return bpf_map_lookup_elem(&xl_prefix6, &k);
}

/* Returns the mask of the generation's rules that the packet matches. */
static __always_inline __u64 xl_match(const struct xl_pkt *pkt, __u32 gen,
				      const struct xl_globals *g, const struct xl_prefix *src)
{
	__u32 proto = pkt->proto;
	if (proto >= XL_PROTO_MAX || pkt->exempt)
		return 0;

	/* A later fragment has no port: frag.h adds its port rules. */
	__u64 mask = g->portless[proto];
	if (pkt->has_port && proto < XL_PORT_PROTOS) {
		__u32 key = (gen << 17) | (proto << 16) | pkt->dport;
		__u64 *ports = bpf_map_lookup_elem(&xl_ports, &key);
		if (ports)
			mask |= *ports;
	}
	if (!pkt->syn)
		mask &= ~g->syn_only;
	mask &= ~g->src_filtered | (src ? src->rules : 0);
	return mask;
}

#endif /* XLIMIT_MATCH_H */
