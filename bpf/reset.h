/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Refusing a connection with a reset: the SYN a gate refused is rewritten
 * in place into the RST|ACK its sender's kernel expects (RFC 9293 3.10.7.1:
 * sequence 0, acknowledging the SYN) and sent back out of the interface
 * (XDP_TX), so the client fails at once instead of retrying its SYN for
 * seconds. A refused SYN is answered only when all of these hold, checked
 * in this order (the first that fails is counted in xl_counters.resets,
 * and its class in xl_answer_stats):
 *   - the answering policy of answer.h (its shape and flags, unicast
 *     non-martian addresses, to the interface's MAC and one of the host's
 *     addresses, not from one of them); counted unsupported (shape, flags),
 *     not_unicast (a source never answered) or not_local (not to the
 *     host);
 *   - the rule's own reset bucket, at the rule's rate, has room;
 *   - the reset bucket of all rules (xl_globals.reset) has room.
 * Others are dropped unanswered. The budgets bound what a spoofed SYN
 * flood can reflect: per rule, and for the host; the policy, what it can
 * aim at. */
#ifndef XLIMIT_RESET_H
#define XLIMIT_RESET_H

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "answer.h"
#include "bucket.h"
#include "clock.h"
#include "parse.h"
#include "stats.h"
#include "types.h"

#define XL_RESET_TTL 64

static __always_inline __u16 xl_csum_fold(__s64 sum)
{
	__u64 s = (__u64)sum & 0xffffffff;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* Swaps n bytes (a constant) between a and b. */
#define XL_SWAP(a, b, n)                                                                           \
	do {                                                                                       \
		__u8 __t[n];                                                                       \
		__builtin_memcpy(__t, a, n);                                                       \
		__builtin_memcpy(a, b, n);                                                         \
		__builtin_memcpy(b, __t, n);                                                       \
	} while (0)

/* The TCP header of the reset, from the SYN's: ports swapped, sequence 0,
 * acknowledging the SYN and its payload, no options, no window. */
static __always_inline void xl_reset_tcp(struct xl_tcphdr *tcp, __u32 payload)
{
	__be16 port = tcp->source;
	tcp->source = tcp->dest;
	tcp->dest = port;
	tcp->ack_seq = bpf_htonl(bpf_ntohl(tcp->seq) + 1 + payload);
	tcp->seq = 0;
	tcp->doff_res = 5 << 4;
	tcp->flags = XL_TCP_RST | XL_TCP_ACK;
	tcp->window = 0;
	tcp->urg_ptr = 0;
	tcp->check = 0;
}

/* Truncates the frame to want bytes. Returns 0, or -1 when it is shorter
 * or cannot be truncated. Packet pointers are invalid afterwards. */
static __always_inline int xl_truncate(struct xdp_md *ctx, __u32 want)
{
	__u32 have = ctx->data_end - ctx->data;
	if (have < want)
		return -1;
	if (have > want && bpf_xdp_adjust_tail(ctx, (int)want - (int)have))
		return -1;
	return 0;
}

static __always_inline int xl_reset4(struct xdp_md *ctx, __u32 l3)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct xl_iphdr *ip = data + l3;
	struct xl_tcphdr *tcp = (void *)(ip + 1);
	if ((void *)(tcp + 1) > end)
		return -1;
	__u32 hdrs = sizeof(*ip) + (tcp->doff_res >> 4) * 4;
	__u32 tot = bpf_ntohs(ip->tot_len);
	__u32 payload = tot > hdrs ? tot - hdrs : 0;
	if (xl_truncate(ctx, l3 + sizeof(*ip) + sizeof(*tcp)))
		return -1;

	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	struct xl_ethhdr *eth = data;
	ip = data + l3;
	tcp = (void *)(ip + 1);
	if ((void *)(eth + 1) > end || (void *)(tcp + 1) > end)
		return -1;
	XL_SWAP(eth->dst, eth->src, 6);
	__be32 a = ip->saddr;
	ip->saddr = ip->daddr;
	ip->daddr = a;
	ip->tos = 0;
	ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(*tcp));
	ip->id = 0;
	ip->frag_off = bpf_htons(0x4000); /* DF */
	ip->ttl = XL_RESET_TTL;
	ip->check = 0;
	ip->check = xl_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0));
	xl_reset_tcp(tcp, payload);

	struct {
		__be32 saddr;
		__be32 daddr;
		__u8 zero;
		__u8 proto;
		__be16 len;
	} ph = {ip->saddr, ip->daddr, 0, IPPROTO_TCP, bpf_htons(sizeof(*tcp))};
	__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
	tcp->check = xl_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)tcp, sizeof(*tcp), sum));
	return 0;
}

static __always_inline int xl_reset6(struct xdp_md *ctx, __u32 l3)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct xl_ipv6hdr *ip6 = data + l3;
	struct xl_tcphdr *tcp = (void *)(ip6 + 1);
	if ((void *)(tcp + 1) > end)
		return -1;
	__u32 hdr = (tcp->doff_res >> 4) * 4;
	__u32 plen = bpf_ntohs(ip6->payload_len);
	__u32 payload = plen > hdr ? plen - hdr : 0;
	if (xl_truncate(ctx, l3 + sizeof(*ip6) + sizeof(*tcp)))
		return -1;

	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	struct xl_ethhdr *eth = data;
	ip6 = data + l3;
	tcp = (void *)(ip6 + 1);
	if ((void *)(eth + 1) > end || (void *)(tcp + 1) > end)
		return -1;
	XL_SWAP(eth->dst, eth->src, 6);
	XL_SWAP(ip6->saddr, ip6->daddr, 16);
	ip6->ver_tc_flow = bpf_htonl(6 << 28);
	ip6->payload_len = bpf_htons(sizeof(*tcp));
	ip6->hop_limit = XL_RESET_TTL;
	xl_reset_tcp(tcp, payload);

	struct {
		__u8 saddr[16];
		__u8 daddr[16];
		__be32 len;
		__be32 next; /* three zero bytes, then the next header */
	} ph = {.len = bpf_htonl(sizeof(*tcp)), .next = bpf_htonl(IPPROTO_TCP)};
	__builtin_memcpy(ph.saddr, ip6->saddr, 16);
	__builtin_memcpy(ph.daddr, ip6->daddr, 16);
	__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
	tcp->check = xl_csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)tcp, sizeof(*tcp), sum));
	return 0;
}

/* Whether a SYN that a gate refused may be answered with a reset, inc
 * being its cost under the rule's bucket settings b: the resets spend
 * their own bucket at the rule's rate (st->reset_tat), so a spoofed flood
 * is not reflected beyond it. Charges the reset when it may be sent. *now
 * is read lazily (0: not yet). */
static __always_inline int xl_reset_admit(struct xl_bucket_state *st, const struct xl_bucket *b,
					  __u64 inc, __u64 *now)
{
	__u64 retry_u;
	__u64 now_u = xl_time(now) << XL_TIME_SHIFT;
	xl_state_units(st, b, now_u);
	return xl_gcra_take(&st->reset_tat, b->tol, now_u, inc, inc, &retry_u) != 0;
}

/* Takes one reset from the bucket of all rules of generation gen. */
static __always_inline int xl_reset_global(__u32 gen, __u64 *now)
{
	__u32 zero = 0;
	struct xl_globals *g = bpf_map_lookup_elem(&xl_config, &gen);
	__u64 *tat = bpf_map_lookup_elem(&xl_reset_budget, &zero);
	if (!g || !tat)
		return 0;
	__u64 inc = xl_bucket_inc(&g->reset, 1);
	__u64 retry_u;
	return xl_gcra_take(tat, g->reset.tol, xl_time(now) << XL_TIME_SHIFT, inc, inc, &retry_u) !=
	       0;
}

/* The reset outcome of a SYN the answering policy refused (its class). */
static __always_inline __u32 xl_reset_outcome(__u32 class)
{
	switch (class) {
	case XL_ANSWER_OK:
		return XL_RESET_SENT;
	case XL_ANSWER_DST_MAC:
	case XL_ANSWER_DST_IP:
		return XL_RESET_NOT_LOCAL;
	case XL_ANSWER_SRC_MAC:
	case XL_ANSWER_SRC_IP:
	case XL_ANSWER_SRC_OWN:
		return XL_RESET_NOT_UNICAST;
	}
	return XL_RESET_UNSUPPORTED;
}

/* Decides whether a SYN that rule slot refused is answered with a reset
 * (the checks at the top of this file) and counts the outcome and its
 * class. st, b and inc are the rule's bucket state, settings and the SYN's
 * cost under them. Returns XL_RESET_SENT when it is to be answered. */
static __always_inline __u32 xl_reset_decide(struct xdp_md *ctx, __u32 gen, __u32 slot,
					     const struct xl_pkt *pkt, struct xl_bucket_state *st,
					     const struct xl_bucket *b, __u64 inc, __u64 *now)
{
	__u32 class = pkt->syn ? xl_answer_check(ctx, pkt) : XL_ANSWER_FLAGS;
	__u32 why = xl_reset_outcome(class);
	if (!why && !xl_reset_admit(st, b, inc, now)) {
		why = XL_RESET_RULE_BUDGET;
		class = XL_ANSWER_BUDGET;
	}
	if (!why && !xl_reset_global(gen, now)) {
		why = XL_RESET_GLOBAL_BUDGET;
		class = XL_ANSWER_BUDGET;
	}
	xl_count_reset(slot, why);
	xl_answer_count(slot, 1, class);
	return why;
}

/* Rewrites the SYN in ctx into its reset. Returns 0 when the frame is to be
 * sent back (XDP_TX), -1 when it cannot be answered (and is dropped). */
static __always_inline int xl_reply_reset(struct xdp_md *ctx, const struct xl_pkt *pkt)
{
	__u32 l3 = pkt->l3_off;
	if (l3 > XL_ANSWER_L3_MAX || !pkt->syn)
		return -1;
	if (pkt->family == 4 && pkt->l4_off == l3 + sizeof(struct xl_iphdr))
		return xl_reset4(ctx, l3);
	if (pkt->family == 6 && pkt->l4_off == l3 + sizeof(struct xl_ipv6hdr))
		return xl_reset6(ctx, l3);
	return -1;
}

#endif /* XLIMIT_RESET_H */
