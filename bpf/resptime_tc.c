// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* xlimit_tc_resptime: the egress side of the response time (resptime.h).
 * A TCP segment with data that the host sends from a stamped flow's
 * service port answers its request: the time since the stamp goes into
 * the rule's histogram and the stamp is cleared, so only the first byte
 * of each response counts. A FIN or a RST forgets the flow. It never
 * changes a packet and always lets the next program run (TCX_NEXT).
 *
 * xlimit_tc_requests, at the interface's ingress, refuses the requests
 * that the XDP program found over their rule's cap on requests in flight
 * (request_tc.h).
 *
 * A separate object from the XDP program, loaded with the XDP object's
 * maps, and attached to the interface's egress through a TCX link (Linux
 * 6.6); where the kernel has no TCX, rules with signal response_time are
 * refused and everything else works (docs/kernels.md). */

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "clock.h"
#include "gen.h"
#include "maps.h"
#include "parse.h"
#include "request.h"
#include "request_tc.h"
#include "resptime.h"
#include "tc.h"
#include "types.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define XL_RESP_FIN 0x01
#define XL_RESP_RST 0x04

SEC("tc")
int xlimit_tc_resptime(struct __sk_buff *skb)
{
	__u32 zero = 0, gen;
	struct xl_globals *g = xl_tc_config(&zero, &gen);
	if (!g || !g->resp_time)
		return XL_TC_NEXT;

	struct xl_cursor cur;
	struct xl_pkt pkt = {};
	void *ip;
	struct xl_tcphdr *tcp = xl_tc_tcp(skb, &cur, &pkt, &ip);
	if (!tcp)
		return XL_TC_NEXT;

	/* The flow as its client sent it: the reply's destination is the
	 * client. */
	struct xl_flow_key k = {.family = pkt.family, .sport = tcp->dest, .dport = tcp->source};
	__u32 ip_len;
	if (pkt.family == 4) {
		struct xl_iphdr *ip4 = ip;
		if ((void *)(ip4 + 1) > cur.end)
			return XL_TC_NEXT;
		__builtin_memcpy(k.saddr, &ip4->daddr, 4);
		__builtin_memcpy(k.daddr, &ip4->saddr, 4);
		ip_len = bpf_ntohs(ip4->tot_len);
	} else {
		struct xl_ipv6hdr *ip6 = ip;
		if ((void *)(ip6 + 1) > cur.end)
			return XL_TC_NEXT;
		__builtin_memcpy(k.saddr, ip6->daddr, 16);
		__builtin_memcpy(k.daddr, ip6->saddr, 16);
		ip_len = bpf_ntohs(ip6->payload_len) + sizeof(*ip6);
	}
	/* A GSO packet bigger than 64 KiB (BIG TCP) has no IP length: the
	 * skb's is the one. */
	__u32 hdrs = ((void *)tcp - ip) + (tcp->doff_res >> 4) * 4;
	if (ip_len == 0 || ip_len == sizeof(struct xl_ipv6hdr))
		ip_len = skb->len - (ip - (void *)(long)skb->data);
	int data = ip_len > hdrs;
	int fin = tcp->flags & (XL_RESP_FIN | XL_RESP_RST);
	if (!data && !fin)
		return XL_TC_NEXT;

	struct xl_flow *f = bpf_map_lookup_elem(&xl_resp_flows, &k);
	if (!f)
		return XL_TC_NEXT;
	__u64 stamp = f->stamp_ns;
	__u32 slot = f->slot;
	/* The response's first byte: the request is answered (and counted
	 * out of flight, request.h), unless another CPU answered it first. */
	if (data && xl_req_done(f, stamp, slot)) {
		__u64 now = XL_NOW();
		__u64 ns = now > stamp ? now - stamp : 0;
		struct xl_resp_hist *h = bpf_map_lookup_elem(&xl_resp_hists, &slot);
		if (h) {
			__u32 b = xl_resp_bucket(ns);
			h->count++;
			h->sum_ns += ns;
			if (b < XL_RESP_BUCKETS)
				h->buckets[b]++;
		}
	}
	if (fin)
		xl_req_forget(&k);
	return XL_TC_NEXT;
}

SEC("tc")
int xlimit_tc_requests(struct __sk_buff *skb)
{
	return xl_req_ingress(skb);
}
