/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Gates on new connections (TCP SYN without ACK): the concurrency limit,
 * on connections in flight counted by the sock_ops program, and the
 * circuit breaker's gate, written by the control loop. Established traffic
 * is never gated. docs/design.md sections 5.7 and 5.8. */
#ifndef XLIMIT_CONNS_H
#define XLIMIT_CONNS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "gen.h"
#include "maps.h"
#include "match.h"
#include "parse.h"
#include "resptime.h"
#include "types.h"

/* include/net/tcp_states.h */
#define XL_TCP_ESTABLISHED 1
#define XL_TCP_CLOSE_WAIT  8

/* xl_conns.epoch while one CPU starts the count of a new rule (no rule's
 * epoch). */
#define XL_CONNS_MOVING 0xffffffffu

#define XL_AF_INET  2
#define XL_AF_INET6 10

/* Whether rule r's concurrency limit lets one more connection in: always
 * below conc_soft, never at conc_max, in between with a probability that
 * falls linearly from 1 to 0. */
static __always_inline int xl_conc_admit(const struct xl_rule *r, __u32 slot)
{
	struct xl_conns *c = bpf_map_lookup_elem(&xl_conns, &slot);
	if (!c || c->epoch != r->epoch)
		return 1;
	__s64 n = c->count;
	if (n < (__s64)r->conc_soft)
		return 1;
	if (n >= (__s64)r->conc_max)
		return 0;
	/* A uniform draw in [0, span): admitted with (span - over) / span. */
	__u64 span = r->conc_max - r->conc_soft;
	__u64 over = n - r->conc_soft;
	return ((__u64)bpf_get_prandom_u32() * span >> 32) >= over;
}

/* Whether the control loop's in-flight cap (lim: its limit, NULL when none
 * is in force) refuses a packet of rule r: a SYN while the rule's count is
 * at the cap. The count of another rule's epoch is none of its own. */
static __always_inline int xl_cap_refusal(const struct xl_rule *r, __u32 slot,
					  const struct xl_pkt *pkt, const struct xl_limit *lim)
{
	if (!pkt->syn || !lim || !lim->conc_cap)
		return 0;
	struct xl_conns *c = bpf_map_lookup_elem(&xl_conns, &slot);
	if (!c || c->epoch != r->epoch)
		return 0;
	return c->count >= (__s64)lim->conc_cap;
}

/* Whether the breaker's gate lets a new connection in. At XL_GATE_ALL the
 * first gate_probes SYNs of each gate_round pass: one compare-and-swap of
 * (round, count), and a lost race drops, so a round never lets more than
 * gate_probes through. */
static __always_inline int xl_gate_admit(const struct xl_limit *lim, struct xl_bucket_state *st)
{
	if (!lim->gate_drop)
		return 1;
	if (lim->gate_drop != XL_GATE_ALL)
		return bpf_get_prandom_u32() >= lim->gate_drop;
	if (!lim->gate_probes)
		return 0;
	__u64 old = st->probes;
	__u64 next = (old >> 32) == lim->gate_round ? old + 1 : ((__u64)lim->gate_round << 32) | 1;
	if ((__u32)next > lim->gate_probes)
		return 0;
	return __sync_val_compare_and_swap(&st->probes, old, next) == old;
}

/* The gates a packet of rule r meets when it opens a connection (a TCP SYN
 * without ACK): the breaker's first (lim: the control loop's limit, NULL
 * when none is in force), then the rule's concurrency limit. Returns the
 * reason of the gate that refuses it, XL_REASON_BREAKER or
 * XL_REASON_CONCURRENCY, or 0 when it is let in or opens no connection. */
static __always_inline __u32 xl_gate_refusal(const struct xl_rule *r, __u32 slot,
					     const struct xl_pkt *pkt, const struct xl_limit *lim,
					     struct xl_bucket_state *st)
{
	if (!pkt->syn)
		return 0;
	if (lim && !xl_gate_admit(lim, st))
		return XL_REASON_BREAKER;
	if ((r->flags & XL_RULE_CONCURRENCY) && !xl_conc_admit(r, slot))
		return XL_REASON_CONCURRENCY;
	return 0;
}

/* The index of the lowest set bit of a non-zero mask, without a loop (a
 * loop over the bits is refused as an infinite loop by the verifier of a
 * loader without CAP_PERFMON). */
static __always_inline __u32 xl_lowest_bit(__u64 mask)
{
	__u32 n = 0;
	if (!(mask & 0xffffffffULL)) {
		n += 32;
		mask >>= 32;
	}
	if (!(mask & 0xffff)) {
		n += 16;
		mask >>= 16;
	}
	if (!(mask & 0xff)) {
		n += 8;
		mask >>= 8;
	}
	if (!(mask & 0xf)) {
		n += 4;
		mask >>= 4;
	}
	if (!(mask & 0x3)) {
		n += 2;
		mask >>= 2;
	}
	if (!(mask & 0x1))
		n += 1;
	return n;
}

/* The peer of a passively opened socket as the XDP program saw its SYN:
 * an IPv4-mapped IPv6 peer is IPv4. Returns 0 for other families. */
static __always_inline int xl_sock_peer(const struct bpf_sock_ops *skops, struct xl_pkt *pkt)
{
	pkt->proto = XL_PROTO_TCP;
	pkt->has_port = 1;
	pkt->syn = 1;
	pkt->dport = (__u16)skops->local_port;
	if (skops->family == XL_AF_INET) {
		__u32 a = skops->remote_ip4;
		pkt->family = 4;
		__builtin_memcpy(pkt->saddr, &a, 4);
		return 1;
	}
	if (skops->family != XL_AF_INET6)
		return 0;
	__u32 a[4] = {skops->remote_ip6[0], skops->remote_ip6[1], skops->remote_ip6[2],
		      skops->remote_ip6[3]};
	if (a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff)) {
		pkt->family = 4;
		__builtin_memcpy(pkt->saddr, &a[3], 4);
		return 1;
	}
	pkt->family = 6;
	__builtin_memcpy(pkt->saddr, a, 16);
	return 1;
}

/* Served rules one connection counts toward at most: the lowest slots of
 * its mask (a loop over the 64 bits is refused as an infinite one by the
 * verifier of a loader without CAP_PERFMON; this one is unrolled). */
#define XL_SERVED_MAX 4

/* Counts one completed handshake toward the served rules of mask (the
 * lowest XL_SERVED_MAX of them). */
static __always_inline void xl_served_count(__u64 mask)
{
#pragma unroll
	for (int i = 0; i < XL_SERVED_MAX; i++) {
		if (!mask)
			return;
		__u32 slot = xl_lowest_bit(mask);
		mask &= mask - 1;
		__u64 *n = bpf_map_lookup_elem(&xl_served, &slot);
		if (n)
			*n += 1;
	}
}

/* A connection was passively established: count the handshake toward
 * every served rule its SYN matched (xl_served, resptime.h), and the
 * connection toward the first (lowest slot) concurrency rule, remember
 * which in the socket's storage, and ask for its state changes.
 * Allowlisted peers are not limited and not counted. */
static __always_inline void xl_conn_open(struct bpf_sock_ops *skops)
{
	__u32 zero = 0;
	__u64 word = xl_gen_word(&zero);
	if (word == XL_GEN_NONE)
		return;
	__u32 gen = word & 1;
	struct xl_globals *g = bpf_map_lookup_elem(&xl_config, &gen);
	if (!g || !(g->concurrent | g->served))
		return;
	if (g->netns_cookie && bpf_get_netns_cookie(skops) != g->netns_cookie)
		return;
	struct xl_pkt pkt = {};
	if (!xl_sock_peer(skops, &pkt))
		return;
	struct xl_prefix *src = xl_lookup_source(&pkt, gen, g);
	if (src && (src->flags & XL_PREFIX_ALLOW))
		return;
	__u64 mask = xl_match(&pkt, gen, g, src);
	if (mask & g->served)
		xl_served_count(mask & g->served);
	mask &= g->concurrent;
	if (!mask)
		return;
	__u32 slot = xl_lowest_bit(mask);
	__u32 key = gen * XL_MAX_RULES + slot;
	struct xl_rule *r = bpf_map_lookup_elem(&xl_rules, &key);
	struct xl_conns *c = bpf_map_lookup_elem(&xl_conns, &slot);
	struct bpf_sock *sk = skops->sk;
	if (!r || !c || !sk)
		return;
	/* The first connection of a new rule in this slot starts the count:
	 * one CPU wins the epoch's compare-and-swap to XL_CONNS_MOVING,
	 * zeroes the count by an exchange, then publishes the rule's epoch.
	 * Before, two CPUs could each store 0 and lose the other's increment,
	 * and the count went negative (issue 41). A connection that opens
	 * while another CPU moves the epoch is not counted. */
	__u32 ep = *(volatile __u32 *)&c->epoch;
	if (ep != r->epoch) {
		if (ep == XL_CONNS_MOVING ||
		    __sync_val_compare_and_swap(&c->epoch, ep, XL_CONNS_MOVING) != ep)
			return;
		__sync_lock_test_and_set(&c->count, 0);
		__sync_lock_test_and_set(&c->epoch, r->epoch);
	}
	struct xl_sk_conn *sc =
	    bpf_sk_storage_get(&xl_sk_conns, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!sc)
		return;
	sc->slot = slot;
	sc->epoch = r->epoch;
	__sync_fetch_and_add(&c->count, 1);
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
}

/* A counted connection changed state: once the service has closed it (any
 * state but ESTABLISHED and CLOSE_WAIT), it is no longer in flight. */
static __always_inline void xl_conn_state(struct bpf_sock_ops *skops)
{
	__u32 state = skops->args[1];
	if (state == XL_TCP_ESTABLISHED || state == XL_TCP_CLOSE_WAIT)
		return;
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	struct xl_sk_conn *sc = bpf_sk_storage_get(&xl_sk_conns, sk, 0, 0);
	if (!sc)
		return;
	__u32 slot = sc->slot;
	struct xl_conns *c = bpf_map_lookup_elem(&xl_conns, &slot);
	if (c && c->epoch == sc->epoch)
		__sync_fetch_and_add(&c->count, -1);
	bpf_sk_storage_delete(&xl_sk_conns, sk);
	bpf_sock_ops_cb_flags_set(skops,
				  skops->bpf_sock_ops_cb_flags & ~BPF_SOCK_OPS_STATE_CB_FLAG);
}

#endif /* XLIMIT_CONNS_H */
