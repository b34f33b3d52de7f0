/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* SYN cookies at the NIC (docs/dataplane.md, "SYN cookies").
 *
 * A rule with syn_cookies answers SYNs from XDP with a SYN-ACK whose
 * sequence number is the kernel's own SYN cookie
 * (bpf_tcp_raw_gen_syncookie_ipv4/6), instead of passing or dropping them:
 * every SYN of an `always` rule, and in `auto` every SYN while the SYNs
 * offered to the rule are over its rate (and for XL_COOKIE_HOLD_NS after).
 * Such a SYN is not charged to the rule. The returning ACK is checked by
 * the TC program (syncookie_tc.c) with bpf_tcp_raw_check_syncookie_ipv4/6;
 * only a valid one is charged to the rule (breaker, concurrency,
 * per_source, rate, exactly as a SYN would be) and handed to the listener
 * with bpf_sk_assign_tcp_reqsk, which creates the connection from the
 * attributes below. A spoofed source never returns the ACK, so it never
 * spends the rule's rate.
 *
 * The cookie itself carries only the MSS (one of four values). The rest
 * travels in the low byte of the SYN-ACK's timestamp, which the client
 * echoes (as the kernel does for its own cookies):
 *   bits 0-3 the client's window scale (15: none), bit 4 SACK permitted,
 *   bit 5 ECN, bits 6-7 the index of the cookie's MSS.
 * A client without timestamps gets no window scaling and no SACK, and its
 * connection the smallest MSS of the table (536, or 1220 for IPv6): the
 * conservative fallback, as the kernel's own cookies do.
 *
 * The SYN-ACK's sequence number is the kernel's cookie plus an offset,
 * xl_cookie_link.offset + 4 * the answering rule's slot: the offset (K,
 * random per attachment, its top byte in [64, 191]) moves the cookie's
 * top byte, the minute counter that the kernel's check accepts only as the
 * current minute or the one before, out of that window. So a cookie the
 * kernel made never passes the TC program's check (ack - 1 - K - 4 * slot)
 * and goes to the kernel, uncharged, and one of xlimit's never passes the
 * kernel's own (docs/dataplane.md, "SYN cookies"); the slot tells the TC
 * program which rule answered, so that the ACK charges that rule and those
 * after it, the ones the SYN did not reach.
 *
 * A SYN is answered only under the answering policy (answer.h), when the
 * host has no socket for its 4-tuple other than a listener, and within the
 * host-wide budget of answers (xl_cookie_cfg.budget), in this order
 * (xl_cookie_take). A SYN refused by the policy's address or flag checks
 * is dropped unanswered: no host should answer it; but for one to a
 * destination the host-address map does not list when the map is
 * incomplete (XL_ANSWER_UNLISTED): it goes to the bucket. A SYN whose TCP
 * header runs past the frame or its IP packet (a data offset of 15 with 20
 * bytes present) is dropped as malformed_l4: Linux would discard it
 * (XL_ANSWER_DISCARD). Any other SYN the program cannot answer here (its
 * shape, a socket of the host's, a spent budget) goes to the rule's gates
 * and bucket as it would without cookies, but first through a share of its
 * own, a quarter of the rule's rate and burst (xl_cookie_share_take; one
 * share for the SYNs to a socket the host has, one for the others): what
 * the rule admits reaches the kernel, which answers it itself, and no flood
 * of such SYNs takes more than those quarters of the bucket that validated
 * cookies are charged to at TC (docs/dataplane.md, "SYN cookies"). */
#ifndef XLIMIT_SYNCOOKIE_H
#define XLIMIT_SYNCOOKIE_H

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "answer.h"
#include "bucket.h"
#include "clock.h"
#include "maps.h"
#include "parse.h"
#include "types.h"

/* After the SYNs offered to an `auto` rule were last over its rate, its
 * SYNs are answered with cookies for this long. */
#define XL_COOKIE_HOLD_NS 1000000000ULL
/* An `auto` rule checks returning ACKs for this long after its last
 * cookie: a cookie is valid for up to two minutes (MAX_SYNCOOKIE_AGE). */
#define XL_COOKIE_GRACE_NS (130 * 1000000000ULL)
/* The window scale the host announces in its SYN-ACKs (the kernel's usual
 * for a 6 MiB receive buffer), and the window of the SYN-ACK itself. */
#define XL_COOKIE_RCV_WSCALE 7
#define XL_COOKIE_WINDOW     65535
#define XL_COOKIE_TTL	     64
/* TCP options of the SYN-ACK to a SYN with timestamps: 20 bytes (MSS,
 * SACK_PERM or NOP NOP, timestamps, NOP and window scale or NOPs). To a
 * SYN without, the MSS alone (XL_COOKIE_OPTS_MSS): the cookie carries
 * nothing else then (xl_cookie_fit). */
#define XL_COOKIE_OPTS	   20
#define XL_COOKIE_OPTS_MSS 4
#define XL_TCP_ECE	   0x40
#define XL_TCP_CWR	   0x80
/* Options parsed per SYN or ACK: enough for every option a stack sends. */
#define XL_COOKIE_OPT_STEPS 10
/* The TS low byte (see above). */
#define XL_TSOPT_WSCALE_NONE 0x0f
#define XL_TSOPT_SACK	     0x10
#define XL_TSOPT_ECN	     0x20
#define XL_TSOPT_MSS_SHIFT   6

/* The counters of a rule's cookies (per CPU, XL_MAX_RULES slots). */
struct xl_cookie_counters {
	__u64 sent;	     /* SYN-ACKs with a cookie sent (XDP_TX) */
	__u64 over_budget;   /* SYNs not answered: the budget was spent (to the rule's bucket) */
	__u64 not_local;     /* SYNs not answered: not to the interface's MAC and a host address */
	__u64 unanswerable;  /* SYNs not answered: shape, flags, source (answer.h), rewrite */
	__u64 validated;     /* ACKs with a valid cookie, charged and handed over */
	__u64 failed;	     /* ACKs to a listener with an invalid cookie */
	__u64 refused;	     /* valid cookies the rule refused (its rate, gates) */
	__u64 assign_failed; /* valid, admitted, but the kernel refused the socket */
};

/* Per generation: the budget of answers and what the SYN-ACKs announce. */
struct xl_cookie_cfg {
	/* The host-wide bucket of SYN-ACKs (packets), all rules together. */
	struct xl_bucket budget;
	/* Rules with syn_cookies, not shadow: the TC program's first test. */
	__u64 rules;
	/* The MSS announced over IPv4 and IPv6; 0: the interface's
	 * (xl_cookie_link). Set only by tests. */
	__u16 mss4;
	__u16 mss6;
	__u32 _pad;
};

/* The attachment's cookie settings, whatever the generation (written by
 * the daemon, maps.Tables.SetCookieLink). */
struct xl_cookie_link {
	/* K: every cookie's offset (see the top of this file). Random per
	 * attachment, kept across restarts and reloads by the pin; 0 until
	 * the daemon writes it (the cookies are then the kernel's own). */
	__u32 offset;
	__u16 mss4; /* the MSS announced over IPv4: the interface's MTU - 40; 0: 1460 */
	__u16 mss6; /* over IPv6: MTU - 60; 0: 1440 */
};

/* A rule's cookie state (slot) and, in slot XL_GLOBAL_SLOT, the budget's. */
struct xl_cookie_state {
	__u64 syn_tat;	/* GCRA of the SYNs offered (the budget's, in its slot) */
	__u64 until_ns; /* `auto`: cookies until this time */
	__u64 last_ns;	/* the last cookie sent for the rule */
	__u32 epoch;
	__u32 _pad;
};

/* bpf_sk_assign_tcp_reqsk's attributes (include/net/tcp.h, 6.9). */
struct bpf_tcp_req_attrs {
	__u32 rcv_tsval;
	__u32 rcv_tsecr;
	__u16 mss;
	__u8 rcv_wscale;
	__u8 snd_wscale;
	__u8 ecn_ok;
	__u8 wscale_ok;
	__u8 sack_ok;
	__u8 tstamp_ok;
	__u8 usec_ts_ok;
	__u8 reserved[3];
};

/* Config. Key: generation. Value: the budget, the cookie rules, the MSS.
 * Array: two fixed entries, read on each answered SYN and checked ACK. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_GENERATIONS);
	__type(key, __u32);
	__type(value, struct xl_cookie_cfg);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_cookie_cfg SEC(".maps");

/* Config. Key: 0. Value: the attachment's cookie offset and MSS. Array:
 * one entry, read on each answered SYN and checked ACK; not per
 * generation, since the MTU changes whatever the rules do and the offset
 * must outlive every reload. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xl_cookie_link);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_cookie_link SEC(".maps");

/* State. Key: slot, and XL_GLOBAL_SLOT for the host's budget. Value: the
 * rule's offered-SYN bucket and cookie window. Shared array: one state
 * whichever CPU a SYN arrives on. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_COUNTER_SLOTS);
	__type(key, __u32);
	__type(value, struct xl_cookie_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_cookie_state SEC(".maps");

/* State. Key: slot. Value: the rule's cookie counters. Per-CPU: the XDP
 * and TC programs count without contention; readers sum over CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_cookie_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_cookie_stats SEC(".maps");

/* State. Key: slot. Value: the SYNs of the rule's cookie path that the
 * host already had a socket for, other than a listener (a TIME_WAIT
 * socket, an open connection, a request in the kernel's SYN queue), left
 * to it (XDP_PASS) instead of answered. Per-CPU, readers sum over CPUs. A
 * map of its own rather than a field of xl_cookie_counters: pins of
 * earlier releases keep the layout they have. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_cookie_sock SEC(".maps");

/* State. Key: slot. Value: the ACKs of valid cookies that a rule with
 * refuse: reset refused (of xl_cookie_counters.refused), left to the
 * kernel's listener, which has no request for them and answers each with a
 * reset (syncookie_tc.c). Per-CPU, readers sum over CPUs. A map of its own:
 * pins of earlier releases keep the layout of xl_cookie_counters. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_cookie_reset SEC(".maps");

/* The share of a rule's rate and burst that the SYNs its cookie path
 * cannot answer may take (xl_cookie_share_take): 2^-XL_COOKIE_SHARE_SHIFT,
 * for each of its two shares. */
#define XL_COOKIE_SHARE_SHIFT 2
/* The offset in xl_cookie_share of the rules' second share: the SYNs for a
 * socket the host has (class socket: a TIME_WAIT socket they recycle, an
 * open connection). The first, at the rule's slot, takes the other SYNs
 * XDP cannot answer (shape, budget, unlisted). Two shares, so that a
 * spoofed flood of the first kind, free to make from any source, cannot
 * refuse a client reusing a 4-tuple the host holds in TIME_WAIT (its SYN
 * is the kernel's to answer), which a spoofer cannot aim at without
 * knowing the 4-tuple. */
#define XL_COOKIE_SHARE_SOCKET XL_MAX_RULES

/* A rule's share for the SYNs XDP cannot answer. */
struct xl_cookie_share {
	__u64 tat; /* GCRA, in the units of the rule's bucket: a quarter of its rate */
	__u32 epoch;
	__u32 units; /* xl_units_code of the tolerance of tat; 0: unknown */
};

/* State. Key: slot, or XL_COOKIE_SHARE_SOCKET + slot. Value: the rule's
 * bucket for the SYNs its cookie path cannot answer, for a socket the
 * host has at the second key (xl_cookie_share_take). Shared array: one
 * bucket whichever CPU a SYN arrives on. A map of its own: pins of earlier
 * releases keep the layout of xl_cookie_state. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_cookie_share);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_cookie_share SEC(".maps");

/* include/net/tcp_states.h */
#define XL_TCP_LISTEN	    10
#define XL_TCP_NEW_SYN_RECV 12

/* The TCP socket, a listener or anything else, that a segment from ip's
 * source to its destination belongs to: a referenced socket for
 * bpf_sk_release, or NULL. ip is a plain IP header of family in ctx's
 * packet (XDP or TC), followed by tcp; end is the packet's end. */
static __always_inline struct bpf_sock *
xl_cookie_socket(void *ctx, void *ip, const struct xl_tcphdr *tcp, void *end, __u32 family)
{
	struct bpf_sock_tuple t = {};
	__u32 tlen;
	if ((void *)(tcp + 1) > end)
		return NULL;
	if (family == 4) {
		struct xl_iphdr *ip4 = ip;
		if ((void *)(ip4 + 1) > end)
			return NULL;
		t.ipv4.saddr = ip4->saddr;
		t.ipv4.daddr = ip4->daddr;
		t.ipv4.sport = tcp->source;
		t.ipv4.dport = tcp->dest;
		tlen = sizeof(t.ipv4);
	} else {
		struct xl_ipv6hdr *ip6 = ip;
		if ((void *)(ip6 + 1) > end)
			return NULL;
		__builtin_memcpy(t.ipv6.saddr, ip6->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, ip6->daddr, 16);
		t.ipv6.sport = tcp->source;
		t.ipv6.dport = tcp->dest;
		tlen = sizeof(t.ipv6);
	}
	return bpf_skc_lookup_tcp(ctx, &t, tlen, BPF_F_CURRENT_NETNS, 0);
}

/* xl_cookie_has_socket's answers for a handshake in the SYN queue and for
 * an MPTCP listener. */
#define XL_SOCKET_QUEUED 2
#define XL_SOCKET_MPTCP	 3

/* Set by the loader (maps.Options, from the kernel's BTF) where the kernel
 * has MPTCP (struct mptcp_sock): xl_cookie_has_socket then asks whether a
 * listener is MPTCP. Where it has not, the verifier prunes the call, whose
 * return type it would refuse there (a BTF pointer to a type the kernel
 * lacks), and no listener can be MPTCP. */
volatile const __u32 xl_cfg_mptcp = 0;

/* Whether the listener sk is MPTCP: its socket in the TCP tables is then a
 * subflow that bpf_skc_to_mptcp_sock maps to its MPTCP socket (the kernel's
 * own test, sk_is_mptcp). bpf_sk_assign_tcp_reqsk refuses such a listener
 * (-EINVAL, net/core/filter.c since 6.9): a cookie the XDP program answered
 * for it could never become a connection, and its ACK would meet the
 * kernel's listener, fail the kernel's cookie check and be reset. */
static __always_inline int xl_cookie_mptcp(struct bpf_sock *sk)
{
	if (!xl_cfg_mptcp)
		return 0;
	return bpf_skc_to_mptcp_sock(sk) != NULL;
}

/* Whether the host has a socket other than a listener for the SYN at l3
 * in ctx, a plain IP header of pkt's family, or its listener is MPTCP
 * (xl_cookie_mptcp): then the SYN is the kernel's business, not the
 * cookie path's. A SYN to a TIME_WAIT socket starts the next connection
 * of its 4-tuple (the kernel recycles the socket); a cookie would instead
 * answer with a SYN-ACK whose ACK meets the TIME_WAIT socket at TC and
 * never reaches the listener. Returns 1, or XL_SOCKET_QUEUED for a request
 * socket (the kernel answered an earlier SYN of the 4-tuple and waits for
 * its ACK), or XL_SOCKET_MPTCP for an MPTCP listener, or 0. */
static __always_inline int xl_cookie_has_socket(struct xdp_md *ctx, __u32 l3, __u32 family)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (l3 > XL_ANSWER_L3_MAX)
		return 0;
	void *ip = data + l3;
	void *tcp = ip + (family == 4 ? sizeof(struct xl_iphdr) : sizeof(struct xl_ipv6hdr));
	struct bpf_sock *sk = xl_cookie_socket(ctx, ip, tcp, end, family);
	if (!sk)
		return 0;
	__u32 state = sk->state;
	int mptcp = state == XL_TCP_LISTEN && xl_cookie_mptcp(sk);
	bpf_sk_release(sk);
	if (mptcp)
		return XL_SOCKET_MPTCP;
	return state == XL_TCP_NEW_SYN_RECV ? XL_SOCKET_QUEUED : state != XL_TCP_LISTEN;
}

/* MSS values a cookie can carry (the kernel's msstab, syncookies.c). */
static __always_inline __u16 xl_cookie_mss(__u32 family, __u32 idx)
{
	if (family == 4)
		return idx == 0 ? 536 : idx == 1 ? 1300 : idx == 2 ? 1440 : 1460;
	return idx == 0 ? 1220 : idx == 1 ? 1420 : idx == 2 ? 1440 : 8940;
}

static __always_inline __u32 xl_cookie_mss_index(__u32 family, __u32 mss)
{
	__u32 i = 0;
#pragma unroll
	for (__u32 j = 1; j < 4; j++)
		if (mss >= xl_cookie_mss(family, j))
			i = j;
	return i;
}

/* Claims the slot's cookie state for rule r (state of another rule starts
 * afresh). */
static __always_inline void xl_cookie_claim(struct xl_cookie_state *cs, const struct xl_rule *r,
					    __u64 now)
{
	if (cs->epoch != r->epoch) {
		cs->syn_tat = now << XL_TIME_SHIFT;
		cs->until_ns = 0;
		cs->last_ns = 0;
		cs->epoch = r->epoch;
	}
}

/* Whether a SYN of rule r is answered with a cookie before the rule's
 * buckets see it (b: the rule's bucket settings in force, inc the SYN's
 * cost under them): always for `always`; for `auto` while the SYNs offered
 * are over the rule's rate, measured by their own bucket (syn_tat), and
 * XL_COOKIE_HOLD_NS after. *now is read lazily. */
static __always_inline int xl_cookie_first(const struct xl_rule *r, __u32 slot,
					   const struct xl_pkt *pkt, const struct xl_bucket *b,
					   __u64 inc, __u64 *now)
{
	if (!pkt->syn || !(r->flags & (XL_RULE_COOKIE_AUTO | XL_RULE_COOKIE_ALWAYS)))
		return 0;
	if (r->flags & XL_RULE_COOKIE_ALWAYS)
		return 1;
	struct xl_cookie_state *cs = bpf_map_lookup_elem(&xl_cookie_state, &slot);
	if (!cs)
		return 0;
	__u64 t = xl_time(now);
	xl_cookie_claim(cs, r, t);
	__u64 retry_u;
	if (!xl_gcra_take(&cs->syn_tat, b->tol, t << XL_TIME_SHIFT, inc, inc, &retry_u))
		cs->until_ns = t + XL_COOKIE_HOLD_NS;
	return t < cs->until_ns;
}

/* `auto`: a SYN the rule-wide bucket refused is answered with a cookie too,
 * and opens the cookie window. */
static __always_inline int xl_cookie_overflow(const struct xl_rule *r, __u32 slot,
					      const struct xl_pkt *pkt, __u64 *now)
{
	if (!pkt->syn || !(r->flags & XL_RULE_COOKIE_AUTO))
		return 0;
	struct xl_cookie_state *cs = bpf_map_lookup_elem(&xl_cookie_state, &slot);
	if (!cs)
		return 0;
	__u64 t = xl_time(now);
	xl_cookie_claim(cs, r, t);
	cs->until_ns = t + XL_COOKIE_HOLD_NS;
	return 1;
}

static __always_inline struct xl_cookie_counters *xl_cookie_counters(__u32 slot)
{
	return bpf_map_lookup_elem(&xl_cookie_stats, &slot);
}

/* The options of a SYN that its cookie answer carries. */
struct xl_syn_opts {
	__u32 tsval;
	__u32 tsecr;
	__u16 mss;
	__u8 wscale; /* XL_TSOPT_WSCALE_NONE: none */
	__u8 sack;
	__u8 ts;
};

/* The SYN's TCP header, copied to the stack: the cookie helpers need
 * th_len == doff * 4 bytes, a length the verifier cannot bound on the
 * packet itself, and the options are parsed from the copy. */
struct xl_tcp_copy {
	__u8 b[64]; /* 60 bytes at most, and room for index masks */
};

/* Parses the TCP options of the header copied in th (hdr_len bytes). Stops
 * at the end of the list, a malformed option or after XL_COOKIE_OPT_STEPS
 * options; what it did not reach counts as absent. A global function:
 * verified once, whatever the caller's state. Returns 0. */
__noinline int xl_cookie_parse_opts(const struct xl_tcp_copy *th, __u32 hdr_len,
				    struct xl_syn_opts *o)
{
	if (!th || !o)
		return 0;
	__u32 off = sizeof(struct xl_tcphdr);
	o->wscale = XL_TSOPT_WSCALE_NONE;
	/* Linux's own SYN, the commonest there is, in three word compares:
	 * MSS, SACK_PERM, timestamps, NOP, window scale (tcp_options_write),
	 * parsed as the loop below would. */
	__u32 w[5];
	__builtin_memcpy(w, th->b + off, sizeof(w));
	if (hdr_len == sizeof(struct xl_tcphdr) + 20 &&
	    (w[0] & bpf_htonl(0xffff0000)) == bpf_htonl(0x02040000) &&
	    w[1] == bpf_htonl(0x0402080a) &&
	    (w[4] & bpf_htonl(0xffffff00)) == bpf_htonl(0x01030300)) {
		__u8 ws = bpf_ntohl(w[4]) & 0xff;
		o->mss = bpf_ntohl(w[0]) & 0xffff;
		o->sack = 1;
		o->ts = 1;
		__u32 tsval, tsecr;
		__builtin_memcpy(&tsval, th->b + off + 8, 4);
		__builtin_memcpy(&tsecr, th->b + off + 12, 4);
		o->tsval = bpf_ntohl(tsval);
		o->tsecr = bpf_ntohl(tsecr);
		o->wscale = ws > 14 ? 14 : ws;
		return 0;
	}
	if (hdr_len > sizeof(th->b))
		hdr_len = sizeof(th->b);
	for (int i = 0; i < XL_COOKIE_OPT_STEPS; i++) {
		if (off >= hdr_len || off >= sizeof(th->b))
			return 0;
		/* Every index masked into the 64-byte copy: older verifiers
		 * (6.1) lose the 32-bit bound of off across the loop. */
		__u8 kind = th->b[off & 63];
		if (kind == 0)
			return 0;
		if (kind == 1) {
			off++;
			continue;
		}
		if (off + 1 >= hdr_len)
			return 0;
		__u32 len = th->b[(off + 1) & 63];
		if (len < 2 || off + len > hdr_len || off + len > sizeof(th->b))
			return 0;
		if (kind == 2 && len == 4) {
			o->mss = (__u16)th->b[(off + 2) & 63] << 8 | th->b[(off + 3) & 63];
		} else if (kind == 3 && len == 3) {
			__u8 ws = th->b[(off + 2) & 63];
			o->wscale = ws > 14 ? 14 : ws;
		} else if (kind == 4 && len == 2) {
			o->sack = 1;
		} else if (kind == 8 && len == 10) {
			o->ts = 1;
			o->tsval = (__u32)th->b[(off + 2) & 63] << 24 |
				   (__u32)th->b[(off + 3) & 63] << 16 |
				   (__u32)th->b[(off + 4) & 63] << 8 | th->b[(off + 5) & 63];
			o->tsecr = (__u32)th->b[(off + 6) & 63] << 24 |
				   (__u32)th->b[(off + 7) & 63] << 16 |
				   (__u32)th->b[(off + 8) & 63] << 8 | th->b[(off + 9) & 63];
		}
		off += len;
	}
	return 0;
}

/* The checksum field for a one's complement sum of 32-bit words (in the
 * packet's byte order, as loaded or stored), summed in 64 bits. */
static __always_inline __u16 xl_cookie_fold(__u64 s)
{
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* The options of the SYN-ACK (XL_COOKIE_OPTS bytes) as words in the
 * packet's byte order, for a SYN with options o, announcing mss, with the
 * TS low byte tsopt: MSS; then, for a SYN with timestamps, SACK_PERM (or
 * NOP NOP), timestamps, NOP and window scale (or NOPs); else NOPs, which
 * the answer leaves out (xl_cookie_fit). */
static __always_inline void xl_cookie_opts(__u32 w[XL_COOKIE_OPTS / 4], const struct xl_syn_opts *o,
					   __u16 mss, __u32 tsopt, __u64 now)
{
	w[0] = bpf_htonl(0x02040000 | mss);
	if (!o->ts) {
		w[1] = w[2] = w[3] = w[4] = 0x01010101;
		return;
	}
	/* tsval: a millisecond-ish clock with the options in its low byte. */
	__u32 tsval = ((__u32)(now >> 20) & ~0xffu) | tsopt;
	w[1] = o->sack ? bpf_htonl(0x0402080a) : bpf_htonl(0x0101080a);
	w[2] = bpf_htonl(tsval);
	w[3] = bpf_htonl(o->tsval);
	w[4] = o->wscale != XL_TSOPT_WSCALE_NONE ? bpf_htonl(0x01030300 | XL_COOKIE_RCV_WSCALE)
						 : 0x01010101;
}

/* The TS low byte for a SYN with options o and ECN wish ecn. */
static __always_inline __u32 xl_cookie_tsopt(const struct xl_syn_opts *o, __u32 ecn, __u32 mss_idx)
{
	return (o->wscale & 0x0f) | (o->sack ? XL_TSOPT_SACK : 0) | (ecn ? XL_TSOPT_ECN : 0) |
	       (mss_idx & 3) << XL_TSOPT_MSS_SHIFT;
}

/* Resizes the frame to want bytes. Returns 0, or -1. Packet pointers are
 * invalid afterwards. */
static __always_inline int xl_cookie_resize(struct xdp_md *ctx, __u32 want)
{
	__u32 have = ctx->data_end - ctx->data;
	if (have != want && bpf_xdp_adjust_tail(ctx, (int)want - (int)have))
		return -1;
	return 0;
}

/* Resizes the frame to its answer, hdrs bytes up to the TCP options and
 * the options' length, and returns that length (or -1): XL_COOKIE_OPTS for
 * a SYN with timestamps (ts), XL_COOKIE_OPTS_MSS without; nothing beyond
 * what the answer carries. A frame that cannot grow so far (no tailroom:
 * on a veth, a frame that came as a raw socket's skb) gets the longest
 * answer that fits: without timestamps (the cookie then holds the MSS
 * alone, as the kernel's does for a SYN without them: no window scale,
 * no SACK), then without options (the client then sends segments of the
 * default MSS, 536 bytes over IPv4 and 1220 over IPv6). Packet pointers
 * are invalid afterwards. */
static __always_inline int xl_cookie_fit(struct xdp_md *ctx, __u32 hdrs, int ts)
{
	if (ts && !xl_cookie_resize(ctx, hdrs + XL_COOKIE_OPTS))
		return XL_COOKIE_OPTS;
	if (!xl_cookie_resize(ctx, hdrs + XL_COOKIE_OPTS_MSS))
		return XL_COOKIE_OPTS_MSS;
	if (!xl_cookie_resize(ctx, hdrs))
		return 0;
	return -1;
}

/* Rewrites the SYN at l3, a plain IP header of family (4 or 6, a
 * constant at each call: one source for both, specialized by the
 * compiler), into its SYN-ACK with a cookie, the kernel's plus off,
 * announcing mss, stamped with now. Returns 0 to send it (XDP_TX), -1
 * when it cannot be answered.
 *
 * The frame is rewritten once, in place, a word at a time: every word of
 * the answer is made in a register, stored, and added to its checksum
 * there; no word is read back from the packet after a store to it (a
 * load over narrower stores just made waits for them to drain, and a
 * bpf_csum_diff call per range cost more than the sum itself,
 * bench/results/issue28). */
static __always_inline int xl_cookie_answer(struct xdp_md *ctx, __u32 l3, __u32 family, __u16 mss,
					    __u32 off, __u64 now)
{
	const __u32 iplen = family == 4 ? sizeof(struct xl_iphdr) : sizeof(struct xl_ipv6hdr);
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	void *ip = data + l3;
	struct xl_tcphdr *tcp = ip + iplen;
	if ((void *)(tcp + 1) > end)
		return -1;
	__u32 hl = (tcp->doff_res >> 4) * 4;
	if (hl < sizeof(*tcp) || hl > 60)
		return -1;
	__u8 flags = tcp->flags;

	struct xl_tcp_copy th = {};
	/* Opaque to the compiler, so that it keeps the bound check the
	 * verifier needs right before the helper. */
	__u32 n = hl;
	asm volatile("%0 &= 0x3c" : "+r"(n));
	if (n < sizeof(*tcp))
		return -1;
	if (bpf_xdp_load_bytes(ctx, l3 + iplen, th.b, n))
		return -1;
	struct xl_syn_opts o = {};
	xl_cookie_parse_opts(&th, n, &o);
	__s64 c = family == 4 ? bpf_tcp_raw_gen_syncookie_ipv4(ip, (void *)th.b, n)
			      : bpf_tcp_raw_gen_syncookie_ipv6(ip, (void *)th.b, n);
	if (c < 0)
		return -1;

	int optlen = xl_cookie_fit(ctx, l3 + iplen + sizeof(struct xl_tcphdr), o.ts);
	if (optlen < 0)
		return -1;
	if (optlen != XL_COOKIE_OPTS)
		o.ts = 0;
	const __u32 tcplen = sizeof(struct xl_tcphdr) + optlen;
	__u32 ecn = (flags & (XL_TCP_ECE | XL_TCP_CWR)) == (XL_TCP_ECE | XL_TCP_CWR) && o.ts;
	__u32 tsopt =
	    xl_cookie_tsopt(&o, ecn, xl_cookie_mss_index(family, (__u32)(c >> 32) & 0xffff));
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	struct xl_ethhdr *eth = data;
	ip = data + l3;
	tcp = ip + iplen;
	__u32 *ow = (void *)(tcp + 1);
	/* The frame is its answer's length now (xl_cookie_fit): the options'
	 * bound is checked where they are written. */
	if ((void *)(eth + 1) > end || (void *)ow > end)
		return -1;

	/* Ethernet: the addresses swapped. */
	__u32 d0 = *(__u32 *)eth->dst, s0 = *(__u32 *)eth->src;
	__u16 d1 = *(__u16 *)(eth->dst + 4), s1 = *(__u16 *)(eth->src + 4);
	*(__u32 *)eth->dst = s0;
	*(__u16 *)(eth->dst + 4) = s1;
	*(__u32 *)eth->src = d0;
	*(__u16 *)(eth->src + 4) = d1;

	/* IP: the addresses swapped (their sum, the pseudo-header's, does
	 * not depend on their order), the rest set. */
	__u64 sum;
	if (family == 4) {
		struct xl_iphdr *ip4 = ip;
		__u32 *w = ip;
		__u32 sa = ip4->saddr, da = ip4->daddr;
		/* Version 4, IHL 5 (xl_answer_class), TOS 0, the length; ID 0,
		 * DF; TTL, TCP, the checksum. */
		__u32 w0 = bpf_htonl(0x45000000 | (sizeof(*ip4) + tcplen));
		__u32 w1 = bpf_htonl(0x00004000);
		__u32 w2 = bpf_htonl(XL_COOKIE_TTL << 24 | IPPROTO_TCP << 16);
		w[0] = w0;
		w[1] = w1;
		w[2] = w2;
		ip4->saddr = da;
		ip4->daddr = sa;
		ip4->check = xl_cookie_fold((__u64)w0 + w1 + w2 + sa + da);
		sum = (__u64)sa + da + bpf_htonl(IPPROTO_TCP << 16 | tcplen);
	} else {
		struct xl_ipv6hdr *ip6 = ip;
		__u32 *sa = (__u32 *)ip6->saddr, *da = (__u32 *)ip6->daddr;
		sum = (__u64)bpf_htonl(tcplen) + bpf_htonl(IPPROTO_TCP);
#pragma unroll
		for (int i = 0; i < 4; i++) {
			__u32 s = sa[i], d = da[i];
			sa[i] = d;
			da[i] = s;
			sum += (__u64)s + d;
		}
		/* Version 6, traffic class and flow label 0; the length, TCP,
		 * the hop limit. */
		__u32 *w = ip;
		w[0] = bpf_htonl(6 << 28);
		w[1] = bpf_htonl(tcplen << 16 | IPPROTO_TCP << 8 | XL_COOKIE_TTL);
	}

	/* TCP: the ports swapped, the cookie, the SYN's sequence + 1; data
	 * offset, SYN|ACK (and ECE for ECN), the window; the checksum and
	 * the urgent pointer 0; the options. */
	__u32 *tw = (__u32 *)tcp;
	__u32 ports = tw[0];
	__u32 t0 = ports >> 16 | ports << 16;
	__u32 t1 = bpf_htonl((__u32)c + off);
	__u32 t2 = bpf_htonl(bpf_ntohl(tcp->seq) + 1);
	__u32 t3 =
	    bpf_htonl((tcplen / 4) << 28 |
		      (XL_TCP_SYN | XL_TCP_ACK | (ecn ? XL_TCP_ECE : 0)) << 16 | XL_COOKIE_WINDOW);
	__u32 ow_[XL_COOKIE_OPTS / 4];
	xl_cookie_opts(ow_, &o, mss, tsopt, now);
	sum += (__u64)t0 + t1 + t2 + t3;
	if (optlen == XL_COOKIE_OPTS) {
		if ((void *)(ow + XL_COOKIE_OPTS / 4) > end)
			return -1;
#pragma unroll
		for (int i = 0; i < XL_COOKIE_OPTS / 4; i++) {
			ow[i] = ow_[i];
			sum += ow_[i];
		}
	} else if (optlen == XL_COOKIE_OPTS_MSS) {
		if ((void *)(ow + 1) > end)
			return -1;
		ow[0] = ow_[0];
		sum += ow_[0];
	}
	tw[0] = t0;
	tw[1] = t1;
	tw[2] = t2;
	tw[3] = t3;
	tcp->check = xl_cookie_fold(sum);
	tcp->urg_ptr = 0;
	return 0;
}

/* Counts a SYN that rule slot sent to the cookie path in its class
 * (xl_answer_stats) and, when it is not answered, in the legacy counter
 * of xl_cookie_counters and xl_cookie_sock. */
static __always_inline void xl_cookie_count(__u32 slot, __u32 class)
{
	xl_answer_count(slot, 0, class & ~(XL_ANSWER_QUEUED | XL_ANSWER_MPTCP));
	/* A SYN for a handshake in the SYN queue: counted in its class, and
	 * as a drop of the rule's (`cookie`). */
	if (class == XL_ANSWER_OK || (class & XL_ANSWER_QUEUED))
		return;
	if ((class & ~XL_ANSWER_MPTCP) == XL_ANSWER_SOCKET) {
		__u64 *n = bpf_map_lookup_elem(&xl_cookie_sock, &slot);
		if (n)
			(*n)++;
		return;
	}
	struct xl_cookie_counters *cnt = xl_cookie_counters(slot);
	if (!cnt)
		return;
	if (class == XL_ANSWER_BUDGET)
		cnt->over_budget++;
	else if (class == XL_ANSWER_DST_MAC || class == XL_ANSWER_DST_IP)
		cnt->not_local++;
	else
		cnt->unanswerable++;
}

/* Takes one answer from the host's budget (generation gen's settings):
 * XL_ANSWER_OK, or XL_ANSWER_BUDGET when it is spent. */
static __always_inline __u32 xl_cookie_budget(__u32 gen, __u64 *now)
{
	__u32 budget_slot = XL_GLOBAL_SLOT;
	struct xl_cookie_cfg *cfg = bpf_map_lookup_elem(&xl_cookie_cfg, &gen);
	struct xl_cookie_state *bs = bpf_map_lookup_elem(&xl_cookie_state, &budget_slot);
	if (!cfg || !bs || !cfg->budget.tol ||
	    !xl_gcra(&bs->syn_tat, &cfg->budget, xl_time(now) << XL_TIME_SHIFT, 1))
		return XL_ANSWER_BUDGET;
	return XL_ANSWER_OK;
}

/* The flag xl_cookie_take adds to a SHAPE class when the SYN's TCP header
 * runs past the frame or past its IP packet's length: Linux discards such
 * a segment (tcp_v4_rcv, tcp_v6_rcv: pskb_may_pull of doff * 4 fails), so
 * it is dropped as malformed_l4, never given to the rule's bucket, where
 * it would spend a token for nothing. Counted as SHAPE. */
#define XL_ANSWER_DISCARD 0x20

/* Whether the TCP header of the SYN in ctx (pkt: its parse) runs past the
 * frame or past the end its IP header gives (IPv4's total length, IPv6's
 * payload length; a jumbogram's 0 gives none). */
static __always_inline int xl_cookie_discard(struct xdp_md *ctx, const struct xl_pkt *pkt)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 l3 = pkt->l3_off, l4 = pkt->l4_off;
	if (l4 > 1024 || l4 < l3)
		return 0;
	struct xl_tcphdr *tcp = data + l4;
	if ((void *)(tcp + 1) > end)
		return 0;
	__u32 want = l4 + (tcp->doff_res >> 4) * 4;
	if (want > (__u32)(end - data))
		return 1;
	/* The IP header's length field, read with the helper: its offset
	 * differs by family. */
	__be16 len = 0;
	__u32 v4 = pkt->family == 4;
	if (bpf_xdp_load_bytes(ctx, l3 + (v4 ? 2 : 4), &len, sizeof(len)))
		return 0;
	__u32 n = bpf_ntohs(len);
	if (!v4 && !n)
		return 0;
	return want > l3 + n + (v4 ? 0 : sizeof(struct xl_ipv6hdr));
}

/* Whether the SYN in ctx, which the rule of key (generation * 64 + slot)
 * sends to the cookie path, is answered with a cookie: the answering
 * policy (answer.h), no socket of the host's for its 4-tuple other than a
 * listener (xl_cookie_has_socket), the host's budget of answers, in this
 * order. Counts the class. Returns XL_ANSWER_OK to answer, or the class:
 * the caller drops the SYN, or gives it to the rule's bucket for the
 * classes xl_cookie_fallback names. *now is read lazily. A global
 * function: verified once; its map lookups come after the checks, so
 * that few values live across calls (its frame is in 6.1's bound on the
 * stack of xlimit_xdp -> xl_apply_rule -> here, docs/kernels.md). */
__noinline int xl_cookie_take(struct xdp_md *ctx, const struct xl_pkt *pkt, __u32 key, __u64 *now)
{
	if (!ctx || !pkt || !now || key >= XL_GENERATIONS * XL_MAX_RULES)
		return XL_ANSWER_SHAPE;
	__u32 class = xl_answer_class(ctx, pkt);
	if (!class) {
		int sk = xl_cookie_has_socket(ctx, pkt->l3_off, pkt->family);
		if (sk)
			class = sk == XL_SOCKET_QUEUED	? XL_ANSWER_SOCKET | XL_ANSWER_QUEUED
				: sk == XL_SOCKET_MPTCP ? XL_ANSWER_SOCKET | XL_ANSWER_MPTCP
							: XL_ANSWER_SOCKET;
	}
	if (!class)
		class = xl_cookie_budget(key / XL_MAX_RULES, now);
	xl_cookie_count(key % XL_MAX_RULES, class);
	if (class == XL_ANSWER_SHAPE && xl_cookie_discard(ctx, pkt))
		class |= XL_ANSWER_DISCARD;
	if ((class == XL_ANSWER_DST_MAC || class == XL_ANSWER_DST_IP) && xl_answer_incomplete())
		class |= XL_ANSWER_UNLISTED;
	return class;
}

/* Whether a SYN of class (not answered) goes on to the rule's gates and
 * bucket rather than being dropped: what XDP cannot answer but the kernel
 * may (a shape the rewrite does not handle, a socket the host has, a spent
 * budget), and one to a destination xl_host_addrs does not list when it
 * is incomplete (XL_ANSWER_UNLISTED: it may be the host's). The other
 * classes are frames no host should answer, and a SYN for a handshake in
 * the kernel's SYN queue (XL_ANSWER_QUEUED): the kernel retransmits its
 * SYN-ACK on its own timer, and a spoofer that repeats the 4-tuples of
 * the handshakes it opened would otherwise keep the rule's bucket empty
 * and refuse the clients whose cookies it validates. */
static __always_inline int xl_cookie_fallback(__u32 class)
{
	return (class & XL_ANSWER_UNLISTED) || class == XL_ANSWER_SHAPE ||
	       class == XL_ANSWER_SOCKET || class == (XL_ANSWER_SOCKET | XL_ANSWER_MPTCP) ||
	       class == XL_ANSWER_BUDGET;
}

/* The reason a SYN the cookie path keeps (not xl_cookie_fallback) is
 * counted under: malformed_l4 for one the kernel would discard, else
 * cookie. */
static __always_inline __u32 xl_cookie_reason(__u32 class)
{
	return (class & XL_ANSWER_DISCARD) ? XL_REASON_MALFORMED_L4 : XL_REASON_COOKIE;
}

/* The key in xl_cookie_share of rule slot's share for a SYN of class
 * (xl_cookie_take) that its cookie path cannot answer. A SYN for an MPTCP
 * listener (XL_ANSWER_MPTCP) takes the share of the SYNs XDP cannot
 * answer: a spoofed flood can send it, as it can those. */
static __always_inline __u32 xl_cookie_share_key(__u32 slot, __u32 class)
{
	return class == XL_ANSWER_SOCKET ? XL_COOKIE_SHARE_SOCKET + slot : slot;
}

/* Takes a SYN of cost inc (in the units of the rule's bucket, tolerance
 * tol) that a rule's cookie path cannot answer (xl_cookie_fallback) from
 * the rule's share for such SYNs at key k (xl_cookie_share_key): a quarter
 * of its rate and of its burst (at least one SYN). Returns 1 when it fits
 * (the SYN goes on to the rule's gates and bucket), 0 when the share is
 * spent (dropped, reason rule). So the SYNs that XDP cannot answer take at
 * most 2 * (rate/4 * t + burst/4) of the rule's bucket, and the ACKs of
 * validated cookies, charged to that bucket at TC, always find at least
 * half of it; a flood that knows no 4-tuple of the host's sockets, at
 * least three quarters (docs/dataplane.md, "SYN cookies"). A share starts
 * full when the rule (its epoch) is new, and keeps how full it is across
 * a change of the rule's rate (issue 41). A global function: verified
 * once. */
__noinline int xl_cookie_share_take(__u32 k, __u32 epoch, __u64 tol, __u64 inc, __u64 *now)
{
	if (!now || k >= 2 * XL_MAX_RULES)
		return 1;
	struct xl_cookie_share *s = bpf_map_lookup_elem(&xl_cookie_share, &k);
	if (!s)
		return 1;
	__u64 t = xl_time(now) << XL_TIME_SHIFT;
	__u64 need = inc << XL_COOKIE_SHARE_SHIFT;
	__u64 stol = tol > need ? tol : need;
	__u32 code = xl_units_code(stol);
	if (s->epoch != epoch) {
		s->tat = t;
		s->units = code;
		s->epoch = epoch;
	}
	/* A change of the rule's rate or burst keeps how full the share is,
	 * as the rule's bucket does (bucket.h, xl_units_claim_in). */
	xl_src_units_claim(&s->units, &s->tat, code, stol, t);
	__u64 retry_u;
	return xl_gcra_take(&s->tat, stol, t, need, need, &retry_u) != 0;
}

/* Rewrites the SYN in ctx, which the rule of key (generation * 64 + slot)
 * answers (xl_cookie_take said so), into its SYN-ACK with a cookie.
 * Counts it sent, or unanswerable when the frame cannot be rewritten (no
 * tailroom). now is the packet's time, which xl_cookie_take read for the
 * budget (0: read here). Returns XDP_TX, or XDP_DROP. A global function:
 * verified once, not once per slot. */
__noinline int xl_reply_cookie(struct xdp_md *ctx, const struct xl_pkt *pkt, __u32 key, __u64 now)
{
	__u32 gen = key / XL_MAX_RULES;
	__u32 slot = key % XL_MAX_RULES;
	__u32 zero = 0;
	if (!ctx || !pkt || gen >= XL_GENERATIONS)
		return XDP_DROP;
	struct xl_cookie_counters *cnt = xl_cookie_counters(slot);
	struct xl_cookie_cfg *cfg = bpf_map_lookup_elem(&xl_cookie_cfg, &gen);
	struct xl_cookie_link *lk = bpf_map_lookup_elem(&xl_cookie_link, &zero);
	if (!cnt || !cfg || !lk)
		return XDP_DROP;
	__u32 l3 = pkt->l3_off;
	if (l3 > XL_ANSWER_L3_MAX)
		return XDP_DROP;
	if (!now)
		now = XL_NOW();
	__u32 off = lk->offset + 4 * slot;
	/* The MSS: a test's override, else the interface's (its MTU). */
	__u16 mss4 = cfg->mss4 ? cfg->mss4 : lk->mss4;
	__u16 mss6 = cfg->mss6 ? cfg->mss6 : lk->mss6;
	int err;
	if (pkt->family == 4)
		err = xl_cookie_answer(ctx, l3, 4, mss4 ? mss4 : 1460, off, now);
	else
		err = xl_cookie_answer(ctx, l3, 6, mss6 ? mss6 : 1440, off, now);
	if (err) {
		cnt->unanswerable++;
		return XDP_DROP;
	}
	cnt->sent++;
	struct xl_cookie_state *cs = bpf_map_lookup_elem(&xl_cookie_state, &slot);
	if (cs)
		cs->last_ns = now;
	return XDP_TX;
}

#endif /* XLIMIT_SYNCOOKIE_H */
