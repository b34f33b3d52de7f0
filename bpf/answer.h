/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* What the host answers: the one policy for every frame that xlimit sends
 * back out of the interface with XDP_TX, the SYN cookies' SYN-ACKs
 * (syncookie.h) and the resets of refused SYNs (reset.h) alike
 * (docs/robustness.md, "What the host answers"). An answer goes to the
 * frame's own source, so whoever can forge that source chooses where the
 * host's answers go: a SYN is answered only when all of these hold, checked
 * in this order, and the first that fails is the SYN's class (enum
 * xl_answer), counted per rule and path in xl_answer_stats:
 *
 *   shape    its TCP header, whole in the frame, follows a plain IP header
 *            (IPv4 without options, IPv6 without extension headers, at
 *            most two VLAN tags): the frames the rewrites handle;
 *   flags    SYN without RST, FIN or ACK: what a listener answers. Linux
 *            discards SYN|RST and SYN|FIN in LISTEN (tcp_rcv_state_process)
 *            and a SYN|ACK is no connection request. URG, PSH, ECE and CWR
 *            are allowed: the kernel's listener answers such SYNs, ECE|CWR
 *            asks for ECN (RFC 3168), and none of them changes where the
 *            answer goes or how large it is: refusing them would only drop
 *            what the kernel would have served;
 *   src_mac  the Ethernet source is unicast (group bit clear): an answer to
 *            ff:ff:ff:ff:ff:ff or a multicast MAC reaches every host of
 *            the link, a reflector an on-link attacker could aim;
 *   src_ip   the IP source is an address a peer can have (not a martian):
 *            IPv4 not 0/8, 127/8, 224/4 (multicast) or 240/4 (reserved,
 *            255.255.255.255 included); IPv6 not ::/96 (::, ::1, the
 *            deprecated IPv4-compatible addresses), ::ffff:0:0/96
 *            (IPv4-mapped, which Linux drops on input, ip6_rcv_core) or
 *            ff00::/8 (multicast). Link-local sources (169.254/16,
 *            fe80::/10) are answered: they are on-link peers, and the
 *            answer goes back to the frame's unicast source MAC on the
 *            link it came from, as the kernel's own would;
 *   dst_mac  the map of the host's addresses is maintained (the
 *            daemon's lease, XL_HOST_LEASE, has not ended: otherwise an
 *            address added or removed since the daemon stopped is not in
 *            it, and the class is dst_ip, unlisted: syncookie.h leaves
 *            the SYN to the kernel), and the Ethernet destination is the
 *            interface's MAC (xl_host_addrs, XL_HOST_MAC): a frame for
 *            another host (a promiscuous or bridged interface) is not ours
 *            to answer;
 *   dst_ip   the IP destination is one of the host's addresses
 *            (xl_host_addrs): no broadcast or multicast destination, no
 *            address the host does not hold;
 *   src_own  the IP source is none of the host's own addresses: the host
 *            would answer itself (a LAND attack), and the kernel drops
 *            such a source as martian.
 *
 * What each path then does with a SYN it may not answer is its own
 * (syncookie.h, reset.h); the budgets of answers come after the policy, so
 * a refused frame spends none. */
#ifndef XLIMIT_ANSWER_H
#define XLIMIT_ANSWER_H

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "clock.h"
#include "maps.h"
#include "parse.h"
#include "types.h"

#define XL_TCP_FIN 0x01
#define XL_TCP_RST 0x04
/* Ethernet and two VLAN tags: the deepest IP header answered. */
#define XL_ANSWER_L3_MAX 22

/* The class of a SYN on an answering path: why it is, or is not, answered. */
enum xl_answer {
	XL_ANSWER_OK = 0,      /* answered (cookie: within the budget; reset: sent) */
	XL_ANSWER_SHAPE = 1,   /* not a plain IP header, or the TCP header cut short */
	XL_ANSWER_FLAGS = 2,   /* SYN with RST, FIN or ACK */
	XL_ANSWER_SRC_MAC = 3, /* multicast or broadcast Ethernet source */
	XL_ANSWER_SRC_IP = 4,  /* martian IP source */
	XL_ANSWER_DST_MAC = 5, /* not to the interface's MAC */
	XL_ANSWER_DST_IP = 6,  /* not to one of the host's addresses */
	XL_ANSWER_SRC_OWN = 7, /* from one of the host's own addresses */
	XL_ANSWER_SOCKET = 8,  /* cookie: the host has a socket for the 4-tuple */
	XL_ANSWER_BUDGET = 9,  /* the budget of answers is spent */
	XL_ANSWER_MAX = 10,
};

/* A rule's SYNs on each answering path, by class (per CPU). */
struct xl_answer_counters {
	__u64 cookie[XL_ANSWER_MAX]; /* SYNs the rule sent to the cookie path */
	__u64 reset[XL_ANSWER_MAX];  /* SYNs the rule refused with a reset wish */
	/* ACKs at TC whose cookie the kernel made, not xlimit (syncookie_tc.c):
	 * left to the kernel, uncharged. */
	__u64 kernel_cookie;
};

/* State. Key: slot. Value: the rule's answering classes. Per-CPU: counted
 * without contention by XDP and TC, readers sum over CPUs. A map of its
 * own, not fields of xl_counters or xl_cookie_counters: pins of earlier
 * releases keep the layouts they have and are adopted. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_answer_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_answer_stats SEC(".maps");

/* Counts a SYN of rule slot on a path (reset: 1, cookie: 0) in its class. */
static __always_inline void xl_answer_count(__u32 slot, __u32 reset, __u32 class)
{
	struct xl_answer_counters *c = bpf_map_lookup_elem(&xl_answer_stats, &slot);
	if (!c || class >= XL_ANSWER_MAX)
		return;
	if (reset)
		c->reset[class]++;
	else
		c->cookie[class]++;
}

/* Whether an IPv4 source (network order bytes) is martian. */
static __always_inline int xl_answer_martian4(const __u8 *a)
{
	return a[0] == 0 || a[0] == 127 || a[0] >= 224;
}

/* Whether an IPv6 source is martian. */
static __always_inline int xl_answer_martian6(const __u8 *a)
{
	if (a[0] == 0xff)
		return 1;
	__u32 w[3];
	__builtin_memcpy(w, a, sizeof(w));
	return w[0] == 0 && w[1] == 0 && (w[2] == 0 || w[2] == bpf_htonl(0xffff));
}

/* The flag xl_cookie_take adds to a DST_MAC or DST_IP class when
 * xl_host_addrs is incomplete (xl_answer_incomplete): the destination may
 * be the host's all the same, so the SYN is not dropped but goes on to
 * the rule's bucket, as without cookies (syncookie.h). Not a class: it is
 * counted as the class it carries. */
#define XL_ANSWER_UNLISTED 0x80
/* The flag xl_cookie_take adds to a SOCKET class when the socket is a
 * handshake in the SYN queue: the SYN is dropped, not handed to the
 * kernel (syncookie.h, xl_cookie_fallback). Counted as SOCKET. */
#define XL_ANSWER_QUEUED 0x40
/* The flag xl_cookie_take adds to a SOCKET class when the socket is an
 * MPTCP listener (syncookie.h, xl_cookie_mptcp): the SYN goes to the
 * kernel like a TIME_WAIT one, but through the share of the SYNs XDP
 * cannot answer, not the share of the host's sockets: anyone can send it,
 * where a SYN for a TIME_WAIT socket needs its 4-tuple. Counted as
 * SOCKET. */
#define XL_ANSWER_MPTCP 0x10

/* Whether the host key k, its address filled, is one of the host's. */
static __always_inline int xl_answer_host(const struct xl_host_key *k)
{
	return bpf_map_lookup_elem(&xl_host_addrs, k) != NULL;
}

/* Whether a daemon maintains xl_host_addrs: its lease (XL_HOST_LEASE)
 * is there and has not ended. Only the daemon follows the host's
 * addresses; the program enforces without it. A daemon stopped, crashed
 * or crash-looping leaves a map that no longer says which addresses are
 * the host's: an address added since would have every SYN of a
 * `syn_cookies: always` port dropped unanswered, and a removed one would
 * still be answered for. The clock is read inline: no call frame more on
 * the reset and cookie paths' chains (docs/kernels.md). A global
 * function: its key and the clock's value live in a frame of their own,
 * no larger than the fake clock's, not in xl_cookie_take's, whose chain
 * is at 6.1's bound of 512 bytes. */
__noinline int xl_answer_maintained(void)
{
	struct xl_host_key k = {.kind = XL_HOST_LEASE};
	struct xl_host_addr *v = bpf_map_lookup_elem(&xl_host_addrs, &k);
	if (!v)
		return 0;
	return xl_clock_ns_inline() / 1000000000ULL < v->ifindex;
}

/* Whether xl_host_addrs lists only part of the host's addresses: it
 * holds the XL_HOST_INCOMPLETE mark (more addresses than it holds, or the
 * daemon could not read them), or no daemon maintains it
 * (xl_answer_maintained). An unlisted destination is then not known to be
 * another host's, and an unlisted source not known to be foreign. */
static __always_inline int xl_answer_incomplete(void)
{
	struct xl_host_key k = {.kind = XL_HOST_INCOMPLETE};
	return xl_answer_host(&k) || !xl_answer_maintained();
}

/* The class of the SYN in ctx (pkt: its parse) under the policy at the top
 * of this file: XL_ANSWER_OK when it may be answered. Inlined into the
 * cookie path's global xl_cookie_take, and called by the reset path
 * through xl_answer_check: the call chains stay within 6.1's stack bound
 * (docs/kernels.md). */
static __always_inline __u32 xl_answer_class(struct xdp_md *ctx, const struct xl_pkt *pkt)
{
	/* Asked first, while little else is live: the call spills nothing
	 * into the frame of xl_cookie_take (6.1's stack bound). */
	int maintained = xl_answer_maintained();
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 l3 = pkt->l3_off;
	__u32 v4 = pkt->family == 4;
	__u32 iplen = v4 ? sizeof(struct xl_iphdr) : sizeof(struct xl_ipv6hdr);
	if (l3 > XL_ANSWER_L3_MAX || (!v4 && pkt->family != 6) || pkt->l4_off != l3 + iplen)
		return XL_ANSWER_SHAPE;
	struct xl_ethhdr *eth = data;
	struct xl_tcphdr *tcp = data + l3 + iplen;
	if ((void *)(eth + 1) > end || (void *)(tcp + 1) > end)
		return XL_ANSWER_SHAPE;
	__u32 hl = (tcp->doff_res >> 4) * 4;
	if (hl < sizeof(*tcp) || (void *)tcp + hl > end)
		return XL_ANSWER_SHAPE;
	__u8 fl = tcp->flags;
	if (!(fl & XL_TCP_SYN) || (fl & (XL_TCP_RST | XL_TCP_FIN | XL_TCP_ACK)))
		return XL_ANSWER_FLAGS;
	if (eth->src[0] & 1)
		return XL_ANSWER_SRC_MAC;

	/* The addresses are read from the packet into the key as needed: no
	 * other copy on the stack. */
	struct xl_host_key k = {};
	const __u8 *src, *dst;
	if (v4) {
		struct xl_iphdr *ip = data + l3;
		if ((void *)(ip + 1) > end)
			return XL_ANSWER_SHAPE;
		src = (const __u8 *)&ip->saddr;
		dst = (const __u8 *)&ip->daddr;
		if (xl_answer_martian4(src))
			return XL_ANSWER_SRC_IP;
	} else {
		struct xl_ipv6hdr *ip6 = data + l3;
		if ((void *)(ip6 + 1) > end)
			return XL_ANSWER_SHAPE;
		src = ip6->saddr;
		dst = ip6->daddr;
		if (xl_answer_martian6(src))
			return XL_ANSWER_SRC_IP;
	}
	/* A map no daemon maintains says nothing of the destination: left to
	 * the kernel (xl_answer_incomplete holds too). */
	if (!maintained)
		return XL_ANSWER_DST_IP;
	k.kind = XL_HOST_MAC;
	__builtin_memcpy(k.addr, eth->dst, 6);
	if (!xl_answer_host(&k))
		return XL_ANSWER_DST_MAC;
	__builtin_memset(k.addr, 0, sizeof(k.addr));
	if (v4) {
		k.kind = XL_HOST_IPV4;
		__builtin_memcpy(k.addr, dst, 4);
	} else {
		k.kind = XL_HOST_IPV6;
		__builtin_memcpy(k.addr, dst, 16);
	}
	if (!xl_answer_host(&k))
		return XL_ANSWER_DST_IP;
	if (v4)
		__builtin_memcpy(k.addr, src, 4);
	else
		__builtin_memcpy(k.addr, src, 16);
	if (xl_answer_host(&k))
		return XL_ANSWER_SRC_OWN;
	return XL_ANSWER_OK;
}

/* xl_answer_class as a global function: verified once, for the reset
 * path's callers. */
__noinline int xl_answer_check(struct xdp_md *ctx, const struct xl_pkt *pkt)
{
	if (!ctx || !pkt)
		return XL_ANSWER_SHAPE;
	return xl_answer_class(ctx, pkt);
}

#endif /* XLIMIT_ANSWER_H */
