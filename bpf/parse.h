/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing with a cursor: every parser checks its header against
 * data_end, advances the cursor and returns the next protocol. Loops (VLAN
 * tags, IPv6 extension headers) have explicit bounds. The wire formats are
 * declared here so the program needs no kernel networking headers. */
#ifndef XLIMIT_PARSE_H
#define XLIMIT_PARSE_H

#include <linux/types.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "types.h"

#define ETH_P_IP     0x0800
#define ETH_P_IPV6   0x86DD
#define ETH_P_8021Q  0x8100
#define ETH_P_8021AD 0x88A8

#define IPPROTO_HOPOPTS	 0
#define IPPROTO_ICMP	 1
#define IPPROTO_TCP	 6
#define IPPROTO_UDP	 17
#define IPPROTO_ROUTING	 43
#define IPPROTO_FRAGMENT 44
#define IPPROTO_AH	 51
#define IPPROTO_ICMPV6	 58
#define IPPROTO_DSTOPTS	 60

#define XL_VLAN_MAX 2

struct xl_ethhdr {
	__u8 dst[6];
	__u8 src[6];
	__be16 proto;
};

struct xl_vlanhdr {
	__be16 tci;
	__be16 proto;
};

struct xl_iphdr {
	__u8 ver_ihl;
	__u8 tos;
	__be16 tot_len;
	__be16 id;
	__be16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__sum16 check;
	__be32 saddr;
	__be32 daddr;
};

struct xl_ipv6hdr {
	__be32 ver_tc_flow;
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};

/* Hop-by-hop, routing and destination options share this start. */
struct xl_ipv6_opthdr {
	__u8 nexthdr;
	__u8 hdrlen; /* 8-octet units, not counting the first 8 */
};

struct xl_ipv6_fraghdr {
	__u8 nexthdr;
	__u8 reserved;
	__be16 frag_off; /* offset in 8-octet units << 3 | flags */
	__be32 id;
};

struct xl_tcphdr {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff_res; /* data offset in the high nibble */
	__u8 flags;
	__be16 window;
	__sum16 check;
	__be16 urg_ptr;
};

#define XL_TCP_SYN 0x02
#define XL_TCP_ACK 0x10

struct xl_udphdr {
	__be16 source;
	__be16 dest;
	__be16 len;
	__sum16 check;
};

struct xl_icmphdr {
	__u8 type;
	__u8 code;
	__sum16 check;
};

/* What the rest of the program needs to know about a packet. */
struct xl_pkt {
	__u8 saddr[16];	 /* IPv4 in the first 4 bytes */
	__u16 dport;	 /* host order; 0 when has_port is 0 */
	__u8 family;	 /* 4 or 6 */
	__u8 proto;	 /* enum xl_proto */
	__u8 has_port;	 /* TCP or UDP header present */
	__u8 syn;	 /* TCP SYN without ACK */
	__u8 fragment;	 /* non-first fragment: no L4 header */
	__u8 first_frag; /* first fragment of a fragmented datagram */
	__u8 exempt;	 /* never rule-limited (ICMPv6 neighbour discovery) */
	__u8 l3_off;	 /* offset of the IP header in the frame */
	__u8 l4;	 /* the IP protocol (valid once the IP header parsed) */
	__u8 hop_limit;	 /* IPv6 only */
	__u16 l4_off;	 /* offset of the L4 header (valid once parsed) */
	/* Fragments only (fragment or first_frag): the datagram's
	 * destination and identification, the rest of its xl_frag_key. */
	__u32 frag_id;
	__u8 daddr[16];
};

struct xl_cursor {
	void *pos;
	void *end;
};

/* Parser results below zero. */
#define XL_PARSE_MALFORMED  -1
#define XL_PARSE_EXT_LIMIT  -2
#define XL_PARSE_ND_INVALID -3
#define XL_PARSE_VLAN_DEPTH -4

/* Returns a pointer to the next len bytes and advances, or NULL. */
#define XL_PULL(cur, len)                                                                          \
	({                                                                                         \
		void *__p = (cur)->pos;                                                            \
		if (__p + (len) > (cur)->end)                                                      \
			__p = NULL;                                                                \
		else                                                                               \
			(cur)->pos = __p + (len);                                                  \
		__p;                                                                               \
	})

/* Parses Ethernet and up to XL_VLAN_MAX tags. Returns the ethertype in host
 * order, XL_PARSE_VLAN_DEPTH for more tags than that, or XL_PARSE_MALFORMED
 * when truncated. */
static __always_inline int xl_parse_eth(struct xl_cursor *cur)
{
	struct xl_ethhdr *eth = XL_PULL(cur, sizeof(*eth));
	if (!eth)
		return XL_PARSE_MALFORMED;
	__u16 proto = bpf_ntohs(eth->proto);

#pragma unroll
	for (int i = 0; i < XL_VLAN_MAX; i++) {
		if (proto != ETH_P_8021Q && proto != ETH_P_8021AD)
			return proto;
		struct xl_vlanhdr *vlan = XL_PULL(cur, sizeof(*vlan));
		if (!vlan)
			return XL_PARSE_MALFORMED;
		proto = bpf_ntohs(vlan->proto);
	}
	if (proto == ETH_P_8021Q || proto == ETH_P_8021AD)
		return XL_PARSE_VLAN_DEPTH;
	return proto;
}

/* Parses IPv4 with options. Returns the L4 protocol (setting pkt->fragment
 * for a non-first fragment, which has no L4 header, pkt->first_frag for a
 * first one) or XL_PARSE_MALFORMED. */
static __always_inline int xl_parse_ipv4(struct xl_cursor *cur, struct xl_pkt *pkt)
{
	struct xl_iphdr *ip = XL_PULL(cur, sizeof(*ip));
	if (!ip || (ip->ver_ihl >> 4) != 4)
		return XL_PARSE_MALFORMED;
	__u32 ihl = (ip->ver_ihl & 0x0f) * 4;
	if (ihl < sizeof(*ip) || !XL_PULL(cur, ihl - sizeof(*ip)))
		return XL_PARSE_MALFORMED;
	pkt->family = 4;
	__builtin_memcpy(pkt->saddr, &ip->saddr, 4);
	__u16 frag = bpf_ntohs(ip->frag_off);
	if (frag & 0x3fff) {
		/* MF or an offset: a fragment. */
		pkt->fragment = (frag & 0x1fff) != 0;
		pkt->first_frag = !pkt->fragment;
		pkt->frag_id = ip->id;
		__builtin_memcpy(pkt->daddr, &ip->daddr, 4);
	}
	return ip->protocol;
}

/* Parses IPv6 and up to XL_IPV6_EXT_MAX extension headers. Returns the L4
 * protocol (setting pkt->fragment for a non-first fragment),
 * XL_PARSE_MALFORMED, or XL_PARSE_EXT_LIMIT when the chain is longer. */
static __always_inline int xl_parse_ipv6(struct xl_cursor *cur, struct xl_pkt *pkt)
{
	struct xl_ipv6hdr *ip6 = XL_PULL(cur, sizeof(*ip6));
	if (!ip6 || (bpf_ntohl(ip6->ver_tc_flow) >> 28) != 6)
		return XL_PARSE_MALFORMED;
	pkt->family = 6;
	pkt->hop_limit = ip6->hop_limit;
	__builtin_memcpy(pkt->saddr, ip6->saddr, 16);
	__u8 next = ip6->nexthdr;

#pragma unroll
	for (int i = 0; i < XL_IPV6_EXT_MAX; i++) {
		switch (next) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS: {
			struct xl_ipv6_opthdr *opt = XL_PULL(cur, sizeof(*opt));
			if (!opt)
				return XL_PARSE_MALFORMED;
			next = opt->nexthdr;
			if (!XL_PULL(cur, (opt->hdrlen + 1) * 8 - sizeof(*opt)))
				return XL_PARSE_MALFORMED;
			break;
		}
		case IPPROTO_AH: {
			struct xl_ipv6_opthdr *opt = XL_PULL(cur, sizeof(*opt));
			if (!opt)
				return XL_PARSE_MALFORMED;
			next = opt->nexthdr;
			if (!XL_PULL(cur, (opt->hdrlen + 2) * 4 - sizeof(*opt)))
				return XL_PARSE_MALFORMED;
			break;
		}
		case IPPROTO_FRAGMENT: {
			struct xl_ipv6_fraghdr *frag = XL_PULL(cur, sizeof(*frag));
			if (!frag)
				return XL_PARSE_MALFORMED;
			next = frag->nexthdr;
			__u16 off = bpf_ntohs(frag->frag_off);
			if (off & 0xfff9) {
				/* An offset or M: a fragment (not an atomic one). */
				pkt->frag_id = frag->id;
				__builtin_memcpy(pkt->daddr, ip6->daddr, 16);
				if (off & 0xfff8) {
					pkt->fragment = 1;
					return next;
				}
				pkt->first_frag = 1;
			}
			break;
		}
		default:
			return next;
		}
	}
	switch (next) {
	case IPPROTO_HOPOPTS:
	case IPPROTO_ROUTING:
	case IPPROTO_DSTOPTS:
	case IPPROTO_AH:
	case IPPROTO_FRAGMENT:
		return XL_PARSE_EXT_LIMIT;
	}
	return next;
}

static __always_inline __u8 xl_proto_class(int l4)
{
	switch (l4) {
	case IPPROTO_TCP:
		return XL_PROTO_TCP;
	case IPPROTO_UDP:
		return XL_PROTO_UDP;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		return XL_PROTO_ICMP;
	}
	return XL_PROTO_OTHER;
}

/* Neighbour discovery (ICMPv6 133-137) that RFC 4861 lets a host accept,
 * by the checks that cost nothing: hop limit 255 (sent on the link, not
 * forwarded), code 0, the message's fixed part present, a link-local
 * source for router advertisements and redirects, and not a fragment (RFC
 * 6980). Only such messages are exempt from the rules; the host itself
 * discards the others. */
static __always_inline int xl_nd_valid(const struct xl_cursor *cur, const struct xl_pkt *pkt,
				       const struct xl_icmphdr *icmp)
{
	/* The smallest message of each type, ICMPv6 header included. */
	__u32 min = 24; /* neighbour solicitation and advertisement */
	if (icmp->type == 133)
		min = 8;
	else if (icmp->type == 134)
		min = 16;
	else if (icmp->type == 137)
		min = 40;
	if (pkt->hop_limit != 255 || icmp->code != 0 || pkt->first_frag)
		return 0;
	if ((void *)icmp + min > cur->end)
		return 0;
	if ((icmp->type == 134 || icmp->type == 137) &&
	    (pkt->saddr[0] != 0xfe || (pkt->saddr[1] & 0xc0) != 0x80))
		return 0;
	return 1;
}

/* Parses the L4 header of protocol l4. Returns 0, XL_PARSE_MALFORMED, or
 * XL_PARSE_ND_INVALID for neighbour discovery that xl_nd_valid refuses. */
static __always_inline int xl_parse_l4(struct xl_cursor *cur, struct xl_pkt *pkt, int l4)
{
	switch (l4) {
	case IPPROTO_TCP: {
		struct xl_tcphdr *tcp = XL_PULL(cur, sizeof(*tcp));
		if (!tcp || (tcp->doff_res >> 4) < 5)
			return XL_PARSE_MALFORMED;
		pkt->dport = bpf_ntohs(tcp->dest);
		pkt->has_port = 1;
		pkt->syn = (tcp->flags & (XL_TCP_SYN | XL_TCP_ACK)) == XL_TCP_SYN;
		return 0;
	}
	case IPPROTO_UDP: {
		struct xl_udphdr *udp = XL_PULL(cur, sizeof(*udp));
		if (!udp)
			return XL_PARSE_MALFORMED;
		pkt->dport = bpf_ntohs(udp->dest);
		pkt->has_port = 1;
		return 0;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: {
		struct xl_icmphdr *icmp = XL_PULL(cur, sizeof(*icmp));
		if (!icmp)
			return XL_PARSE_MALFORMED;
		/* Router/neighbour solicitation and advertisement, redirect:
		 * limiting them would cut the host off its IPv6 neighbours. */
		if (l4 == IPPROTO_ICMPV6 && pkt->family == 6 && icmp->type >= 133 &&
		    icmp->type <= 137) {
			if (!xl_nd_valid(cur, pkt, icmp))
				return XL_PARSE_ND_INVALID;
			pkt->exempt = 1;
		}
		return 0;
	}
	}
	return 0;
}

#endif /* XLIMIT_PARSE_H */
