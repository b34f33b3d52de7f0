/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The XDP side of the response time (resptime.h): a passed TCP segment
 * with data, from a client to a port of a response_time rule, stamps its
 * flow unless a stamp is already waiting for the response (the time of
 * the first unanswered request byte); a FIN or a RST forgets the flow.
 * Included by xlimit.c only. */
#ifndef XLIMIT_RESPTIME_XDP_H
#define XLIMIT_RESPTIME_XDP_H

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "clock.h"
#include "conns.h"
#include "maps.h"
#include "parse.h"
#include "request.h"
#include "resptime.h"
#include "types.h"

#define XL_RESP_FIN 0x01
#define XL_RESP_RST 0x04

/* The rules of a response_time mask that the packet's port matches
 * (portless ones included). Unlike xl_match it keeps SYN-only rules: their
 * requests are the connection's data, not its SYN. */
static __always_inline __u64 xl_resp_rules(__u16 dport, __u32 gen, const struct xl_globals *g,
					   __u64 rules)
{
	__u64 mask = g->portless[XL_PROTO_TCP];
	__u32 key = (gen << 17) | (XL_PROTO_TCP << 16) | dport;
	__u64 *ports = bpf_map_lookup_elem(&xl_ports, &key);
	if (ports)
		mask |= *ports;
	return mask & rules;
}

/* The packet's facts xl_resp_ingress needs, in one scalar (a global
 * function that takes no pointer to the caller's stack keeps the main
 * program's verification from forking on it). */
#define XL_RESP_ARGS(pkt)                                                                          \
	((__u64)(pkt)->l3_off | (__u64)(pkt)->l4_off << 8 | (__u64)(pkt)->family << 24 |           \
	 (__u64)(pkt)->proto << 32 | (__u64)(pkt)->has_port << 40 | (__u64)(pkt)->syn << 41 |      \
	 (__u64)(pkt)->fragment << 42)

/* Stamps or forgets the packet's flow for the response_time rules of
 * rules (xl_globals.resp_time, filtered by the source's rules): TCP
 * segments but SYNs and fragments. Called for passed packets only; args is
 * XL_RESP_ARGS. A global function: verified once, apart from the main
 * program. */
__noinline int xl_resp_ingress(struct xdp_md *ctx, __u32 gen, __u64 rules, __u64 args)
{
	if (!ctx || gen >= XL_GENERATIONS)
		return 0;
	struct xl_globals *g = bpf_map_lookup_elem(&xl_config, &gen);
	if (!g)
		return 0;
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 l3 = args & 0xff;
	__u32 l4 = (args >> 8) & 0xffff;
	__u8 family = (args >> 24) & 0xff;
	/* TCP with its header, not a SYN nor a fragment. */
	if (((args >> 32) & 0x7ff) != (XL_PROTO_TCP | 1 << 8))
		return 0;
	if (l3 > 64 || l4 > 512)
		return 0;
	struct xl_tcphdr *tcp = data + l4;
	if ((void *)(tcp + 1) > end)
		return 0;
	__u64 mask = xl_resp_rules(bpf_ntohs(tcp->dest), gen, g, rules);
	if (!mask)
		return 0;
	struct xl_flow_key k = {.family = family, .sport = tcp->source, .dport = tcp->dest};
	/* The IP payload's length, from the IP header: a short frame may
	 * carry Ethernet padding that is no data. */
	__u32 ip_len;
	if (family == 4) {
		struct xl_iphdr *ip = data + l3;
		if ((void *)(ip + 1) > end)
			return 0;
		__builtin_memcpy(k.saddr, &ip->saddr, 4);
		__builtin_memcpy(k.daddr, &ip->daddr, 4);
		ip_len = bpf_ntohs(ip->tot_len);
	} else if (family == 6) {
		struct xl_ipv6hdr *ip6 = data + l3;
		if ((void *)(ip6 + 1) > end)
			return 0;
		__builtin_memcpy(k.saddr, ip6->saddr, 16);
		__builtin_memcpy(k.daddr, ip6->daddr, 16);
		ip_len = bpf_ntohs(ip6->payload_len) + sizeof(*ip6);
	} else {
		return 0;
	}
	__u32 hdrs = (l4 - l3) + (tcp->doff_res >> 4) * 4;

	if (tcp->flags & (XL_RESP_FIN | XL_RESP_RST)) {
		xl_req_forget(&k);
		return 0;
	}
	if (ip_len <= hdrs)
		return 0; /* no data: an ACK */

	/* A request starts where the flow has no stamp: its first one, or the
	 * next on a kept-alive connection (request.h counts it in flight). */
	struct xl_flow *f = bpf_map_lookup_elem(&xl_resp_flows, &k);
	__u32 slot = xl_lowest_bit(mask);
	if (f && (f->stamp_ns || f->flags))
		return 0; /* more of a request, a pipelined one, or refused */
	__u64 now = XL_NOW();
	if (!f) {
		/* Inserted unstamped, then stamped like any flow: a CPU that
		 * lost the race to insert finds the winner's entry. */
		struct xl_flow nf = {.slot = slot};
		bpf_map_update_elem(&xl_resp_flows, &k, &nf, BPF_NOEXIST);
		f = bpf_map_lookup_elem(&xl_resp_flows, &k);
		if (!f)
			return 0;
	}
	if (xl_req_refuse(f, gen, slot, now))
		return 0;
	if (!xl_req_start(f, slot, now))
		return 0; /* another CPU stamped it first */
	struct xl_resp_hist *h = bpf_map_lookup_elem(&xl_resp_hists, &slot);
	if (h)
		h->stamps++;
	return 0;
}

#endif /* XLIMIT_RESPTIME_XDP_H */
