/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The refusal of a request over its rule's cap on requests in flight
 * (request.h), at TC ingress: what a proxy's 503 is at the NIC. The XDP
 * program marked the request's flow REFUSE and passed the segment; here
 * the segment becomes two resets, one out to the client and one in to the
 * local socket, so both ends learn at once that the connection is over:
 *   - to the client, cloned out of the interface the request came in on
 *     (bpf_clone_redirect): sequence number the request's acknowledgment
 *     number, which is exactly the client's next expected byte (RFC 5961
 *     accepts a reset there at once), no ACK;
 *   - to the service, the segment itself passed on: the request's own
 *     sequence number, which is the socket's next expected byte, RST|ACK.
 * The client's HTTP library sees its request fail on a reused connection
 * (most retry an idempotent request once, on a new connection, which
 * meets the rule's SYN gate and the cap again); the service's socket is
 * gone without a read, instead of idling until its keep-alive timeout.
 *
 * Why not a drop: a dropped request stalls its client until its timeout,
 * which issue 42 measured as the worst failure. Why not from XDP: an XDP
 * program sends one frame per frame it gets, and a reset to one side only
 * leaves the other side's socket open. Why it cannot be aimed: the flow
 * answered a request before (it is in xl_resp_flows), the reset goes to the
 * segment's own source, one per segment and no bigger than it.
 *
 * The reset's checksums are computed in full over the header. A segment
 * whose checksum the sender left to the hardware (CHECKSUM_PARTIAL: from a
 * local veth peer, or a virtio guest) keeps that state, which its receivers
 * on a veth or the local stack trust without checking. Included by
 * resptime_tc.c only. */
#ifndef XLIMIT_REQUEST_TC_H
#define XLIMIT_REQUEST_TC_H

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "parse.h"
#include "request.h"
#include "resptime.h"
#include "tc.h"

#define XL_REQ_RST 0x04
#define XL_REQ_ACK 0x10
/* The deepest TCP header the refusal rewrites: Ethernet, two VLAN tags,
 * IPv6 and its extension headers as far as the parser walks them. */
#define XL_REQ_L4_MAX 256

/* The checksum of a one's complement sum (of bpf_csum_diff's). */
static __always_inline __u16 xl_req_fold(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return ~sum & 0xffff;
}

/* Writes the reset in skb (linear up to l4 + 20, checked): addresses as
 * they are, seq and ack (network order), flags; and its checksums. Returns
 * 0, or -1 when the headers are not where they were. */
static __always_inline int xl_req_write(struct __sk_buff *skb, __u64 l3, __u64 l4, __u8 family,
					__be32 seq, __be32 ack, __u8 flags)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	if (l4 > XL_REQ_L4_MAX || l3 > XL_REQ_L4_MAX) /* not l3 < l4: see xl_req_swap */
		return -1;
	struct xl_tcphdr *tcp = data + l4;
	if ((void *)(tcp + 1) > end)
		return -1;
	tcp->seq = seq;
	tcp->ack_seq = ack;
	tcp->doff_res = 5 << 4;
	tcp->flags = flags;
	tcp->window = 0;
	tcp->urg_ptr = 0;
	tcp->check = 0;
	/* bpf_csum_diff sums in memory order, like the kernel's
	 * csum_partial: the pseudo-header's protocol and length are added in
	 * network order to match. */
	__s64 pseudo = bpf_htons(IPPROTO_TCP) + bpf_htons(sizeof(*tcp));
	__s64 s;
	if (family == 4) {
		struct xl_iphdr *ip = data + l3;
		if ((void *)(ip + 1) > end || (ip->ver_ihl & 0xf) != 5)
			return -1; /* IPv4 options: not rewritten */
		ip->tot_len = bpf_htons(sizeof(*ip) + sizeof(*tcp));
		ip->check = 0;
		s = bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0);
		if (s < 0)
			return -1;
		ip->check = xl_req_fold(s);
		s = bpf_csum_diff(NULL, 0, &ip->saddr, 8, 0);
	} else {
		struct xl_ipv6hdr *ip6 = data + l3;
		if ((void *)(ip6 + 1) > end)
			return -1;
		ip6->payload_len = bpf_htons(l4 - l3 - sizeof(*ip6) + sizeof(*tcp));
		s = bpf_csum_diff(NULL, 0, (__be32 *)ip6->saddr, 32, 0);
	}
	if (s < 0)
		return -1;
	pseudo += s;
	s = bpf_csum_diff(NULL, 0, (__be32 *)tcp, sizeof(*tcp), 0);
	if (s < 0)
		return -1;
	tcp->check = xl_req_fold(pseudo + s);
	return 0;
}

/* Swaps the frame's Ethernet addresses, IP addresses and ports. */
static __always_inline int xl_req_swap(struct __sk_buff *skb, __u64 l3, __u64 l4, __u8 family)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	/* Each offset bounded on its own: told l3 < l4, the compiler drops
	 * the IP header's bound check as implied by the TCP header's, which
	 * the verifier, tracking each pointer's range apart, needs. */
	if (l4 > XL_REQ_L4_MAX || l3 > XL_REQ_L4_MAX || data + 12 > end)
		return -1;
	struct xl_tcphdr *tcp = data + l4;
	if ((void *)(tcp + 1) > end)
		return -1;
	__u8 mac[6];
	__builtin_memcpy(mac, data, 6);
	__builtin_memcpy(data, data + 6, 6);
	__builtin_memcpy(data + 6, mac, 6);
	__be16 p = tcp->source;
	tcp->source = tcp->dest;
	tcp->dest = p;
	if (family == 4) {
		struct xl_iphdr *ip = data + l3;
		if ((void *)(ip + 1) > end)
			return -1;
		__be32 a = ip->saddr;
		ip->saddr = ip->daddr;
		ip->daddr = a;
		ip->ttl = 64;
	} else {
		struct xl_ipv6hdr *ip6 = data + l3;
		if ((void *)(ip6 + 1) > end)
			return -1;
		__u8 a[16];
		__builtin_memcpy(a, ip6->saddr, 16);
		__builtin_memcpy(ip6->saddr, ip6->daddr, 16);
		__builtin_memcpy(ip6->daddr, a, 16);
		ip6->hop_limit = 64;
	}
	return 0;
}

/* What became of a refusal (xl_req_reset). */
#define XL_REQ_DONE	 0 /* both resets made */
#define XL_REQ_UNTOUCHED 1 /* the segment could not be cut: as it was */
#define XL_REQ_BROKEN	 2 /* half rewritten: neither side's */

/* Refuses the request whose first segment skb is (l3, l4: its IP and TCP
 * headers' offsets; seq, ack: its numbers, network order): the reset to
 * the client is sent, the skb becomes the reset to the service. Returns
 * an XL_REQ_ outcome. */
static __always_inline int xl_req_reset(struct __sk_buff *skb, __u64 l3, __u64 l4, __u8 family,
					__be32 seq, __be32 ack)
{
	__u32 len = l4 + sizeof(struct xl_tcphdr);
	if (l4 > XL_REQ_L4_MAX)
		return XL_REQ_UNTOUCHED;
	if (skb->len > len && bpf_skb_change_tail(skb, len, 0))
		return XL_REQ_UNTOUCHED;
	if (bpf_skb_pull_data(skb, len))
		return XL_REQ_UNTOUCHED;
	/* To the client: addresses swapped, at its next expected byte. */
	if (xl_req_swap(skb, l3, l4, family) ||
	    xl_req_write(skb, l3, l4, family, ack, 0, XL_REQ_RST))
		return XL_REQ_BROKEN;
	bpf_clone_redirect(skb, skb->ifindex, 0);
	/* To the service: addresses back, at the request's own byte. */
	if (xl_req_swap(skb, l3, l4, family) ||
	    xl_req_write(skb, l3, l4, family, seq, ack, XL_REQ_RST | XL_REQ_ACK))
		return XL_REQ_BROKEN;
	return XL_REQ_DONE;
}

/* The TC ingress side of the refusal: a TCP segment of a flow the XDP
 * program marked REFUSE is refused (xl_req_reset) and its flow marked
 * REFUSED; everything else passes untouched. */
static __always_inline int xl_req_ingress(struct __sk_buff *skb)
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
	struct xl_flow_key k = {.family = pkt.family, .sport = tcp->source, .dport = tcp->dest};
	if (pkt.family == 4) {
		struct xl_iphdr *ip4 = ip;
		if ((void *)(ip4 + 1) > cur.end)
			return XL_TC_NEXT;
		__builtin_memcpy(k.saddr, &ip4->saddr, 4);
		__builtin_memcpy(k.daddr, &ip4->daddr, 4);
	} else {
		struct xl_ipv6hdr *ip6 = ip;
		if ((void *)(ip6 + 1) > cur.end)
			return XL_TC_NEXT;
		__builtin_memcpy(k.saddr, ip6->saddr, 16);
		__builtin_memcpy(k.daddr, ip6->daddr, 16);
	}
	struct xl_flow *f = bpf_map_lookup_elem(&xl_resp_flows, &k);
	if (!f || f->flags != XL_FLOW_REFUSE)
		return XL_TC_NEXT;
	if (__sync_val_compare_and_swap(&f->flags, XL_FLOW_REFUSE, XL_FLOW_REFUSED) !=
	    XL_FLOW_REFUSE)
		return XL_TC_NEXT; /* another CPU refused it */
	/* The headers' offsets, in 64 bits: a 32-bit difference of packet
	 * pointers is spilled in a way the verifier refuses. */
	__u64 base = (__u64)(long)(void *)(long)skb->data;
	__u64 l3 = (__u64)(long)ip - base;
	__u64 l4 = (__u64)(long)tcp - base;
	if (l4 > XL_REQ_L4_MAX || l3 > XL_REQ_L4_MAX)
		return XL_TC_NEXT;
	/* IPv4 with options is not rewritten (rare): it passes, counted
	 * refused all the same; so does a segment that could not be cut. The
	 * flow is followed again, so its next request meets the cap. A
	 * segment half rewritten is dropped: it is neither side's. */
	int done = XL_REQ_UNTOUCHED;
	if (pkt.family == 4 && l4 != l3 + sizeof(struct xl_iphdr))
		done = XL_REQ_UNTOUCHED;
	else
		done = xl_req_reset(skb, l3, l4, pkt.family, tcp->seq, tcp->ack_seq);
	if (done == XL_REQ_UNTOUCHED)
		f->flags = 0;
	return done == XL_REQ_BROKEN ? TC_ACT_SHOT : XL_TC_NEXT;
}

#endif /* XLIMIT_REQUEST_TC_H */
