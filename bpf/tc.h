/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What xlimit's TC programs (resptime_tc.c at egress, syncookie_tc.c at
 * ingress) share: their verdicts, and the way to the only packets either
 * looks at, TCP segments. The way is two steps, the settings in force
 * (xl_tc_config) and the parse (xl_tc_tcp), because each program's own
 * gate on the settings comes between them: the resptime program sees
 * every packet the interface sends, and with no rule timing responses it
 * must cost two lookups, not a parse. */
#ifndef XLIMIT_TC_H
#define XLIMIT_TC_H

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "gen.h"
#include "maps.h"
#include "parse.h"
#include "types.h"

/* TCX verdicts, the values of the classic tc ones: NEXT (TC_ACT_UNSPEC
 * for a cls_bpf filter) hands the packet on to the next program and to
 * the classic tc filters behind them (xlimit's kernel queues redirect
 * from there), as if this program were not there; OK (TCX_PASS) ends the
 * chain and lets the packet through; SHOT (TCX_DROP) drops it. */
#define XL_TC_NEXT  -1
#define TC_ACT_OK   0
#define TC_ACT_SHOT 2

/* The generation in force (*gen) and its settings, or NULL when there
 * are none: the program has nothing to do. zero points to a key 0 of the
 * caller's. */
static __always_inline struct xl_globals *xl_tc_config(const __u32 *zero, __u32 *gen)
{
	__u64 word = xl_gen_word(zero);
	if (word == XL_GEN_NONE)
		return NULL;
	*gen = word & 1;
	return bpf_map_lookup_elem(&xl_config, gen);
}

/* Parses skb (cur, pkt: the caller's, pkt zeroed) up to its TCP header:
 * Ethernet and VLAN tags, IPv4 or IPv6 with their options and extension
 * headers, TCP and not a later fragment. Returns the TCP header, its 20
 * bytes within the packet, with *ip the IP header and cur left at the
 * TCP header (for xl_parse_l4); or NULL for any other packet, which the
 * program hands on. The caller's locals, not a struct of them: the
 * compiler keeps them in registers. */
static __always_inline struct xl_tcphdr *xl_tc_tcp(struct __sk_buff *skb, struct xl_cursor *cur,
						   struct xl_pkt *pkt, void **ip)
{
	cur->pos = (void *)(long)skb->data;
	cur->end = (void *)(long)skb->data_end;
	int l3 = xl_parse_eth(cur);
	*ip = cur->pos;
	int l4;
	if (l3 == ETH_P_IP)
		l4 = xl_parse_ipv4(cur, pkt);
	else if (l3 == ETH_P_IPV6)
		l4 = xl_parse_ipv6(cur, pkt);
	else
		return NULL;
	if (l4 != IPPROTO_TCP || pkt->fragment)
		return NULL;
	struct xl_tcphdr *tcp = cur->pos;
	if ((void *)(tcp + 1) > cur->end)
		return NULL;
	return tcp;
}

#endif /* XLIMIT_TC_H */
