// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* xlimit_tc_cookie: the ACK side of the SYN cookies that XDP sends
 * (syncookie.h), at TC ingress. An ACK to a listening socket of a cookie
 * rule's port is checked with the kernel's own cookie check, less the
 * offset of each cookie rule that may have answered (K + 4 * slot); a
 * valid one is charged like the SYN it stands for to the rule that
 * answered and those after it (the rules before it charged the SYN at
 * XDP), and then handed to the listener with bpf_sk_assign_tcp_reqsk
 * (Linux 6.9), which creates the connection without the listener ever
 * having seen its SYN. An ACK whose cookie the kernel made (it passes the
 * check without an offset) is left to the kernel, uncharged: its SYN was
 * charged at XDP, and its options are the kernel's encoding.
 *
 * A separate object from the XDP program: the kfunc exists only since 6.9,
 * and the loader loads this program only where it does, with the XDP
 * object's maps (docs/kernels.md). */

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

/* bucket.h: the state is brought to the units of its settings before
 * xl_cookie_charge (xl_cookie_units), not inside it. */
#define XL_UNITS_EARLY
#define XL_CLOCK_INLINE
#include "bucket.h"
#include "clock.h"
#include "conns.h"
#include "gen.h"
#include "maps.h"
#include "match.h"
#include "parse.h"
#include "source.h"
#include "stats.h"
#include "syncookie.h"
#include "tc.h"
#include "types.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* The kernel's struct sock, opaque here: a definition (not a forward
 * declaration) so that the kfunc's BTF matches the kernel's kind. */
struct sock {
	int _opaque;
};
extern int bpf_sk_assign_tcp_reqsk(struct __sk_buff *skb, struct sock *sk,
				   struct bpf_tcp_req_attrs *attrs, int attrs__sz) __ksym;

/* Brings the bucket state of the rule in key (generation·64 + slot) to
 * the units of the settings in force (bucket.h, xl_units_claim), and the
 * packet's source's way to those of its per-source settings (source.h,
 * xl_src_rescale_in), before xl_cookie_charge charges them: a rate changed
 * since the state was written keeps how full the bucket is. Claims the
 * state for the rule first, as xl_cookie_charge does. A global function: a
 * call below xl_cookie_charge would pass the stack that 6.1 allows, and
 * inlined there the verifier's limit. */
__noinline int xl_cookie_units(__u32 key, const struct xl_pkt *pkt, __u64 *now)
{
	__u32 slot = key % XL_MAX_RULES;
	if (!now || !pkt || key >= XL_GENERATIONS * XL_MAX_RULES)
		return 0;
	struct xl_rule *r = bpf_map_lookup_elem(&xl_rules, &key);
	struct xl_bucket_state *st = bpf_map_lookup_elem(&xl_buckets, &slot);
	struct xl_cache *c = bpf_map_lookup_elem(&xl_caches, &slot);
	if (!r || !st || !c || !(r->flags & XL_RULE_ACTIVE))
		return 0;
	xl_state_claim(st, r, now);
	if (r->flags & XL_RULE_PER_SOURCE) {
		__u32 zero = 0;
		struct xl_src_scratch *sc = bpf_map_lookup_elem(&xl_src_scratch, &zero);
		if (sc)
			xl_src_rescale_in(r, slot, xl_src_seed(sc, key / XL_MAX_RULES), pkt, now,
					  sc);
	}
	const struct xl_limit *lim = xl_limit_for(r, slot, c, now);
	const struct xl_bucket *b = lim ? &lim->bucket : &r->fallback;
	if (st->units == b->tol)
		return 0;
	return xl_units_claim_in(&st->units, &st->tat, &st->reset_tat, b->tol,
				 xl_time(now) << XL_TIME_SHIFT);
}

/* xl_cookie_charge's flag on a refusal by a rule with refuse: reset. */
#define XL_COOKIE_REFUSE_RESET 0x100

/* Charges a connection opened by a valid cookie to the rule in slot: the
 * breaker's and the concurrency gates, the per-source bucket and the
 * rule's bucket, as xl_apply_rule charges a SYN. Returns the reason of a
 * refusal, with XL_COOKIE_REFUSE_RESET when the rule has refuse: reset, or
 * 0 when admitted, or when a shadow rule would have refused (it never
 * drops: counted would_drop). Counts the decision in the rule's counters.
 * A global function: verified once, not per slot. */
__noinline int xl_cookie_charge(__u32 key, const struct xl_pkt *pkt, __u64 *now, __u64 len)
{
	__u32 slot = key % XL_MAX_RULES;
	if (!pkt || !now || key >= XL_GENERATIONS * XL_MAX_RULES)
		return 0;
	struct xl_rule *r = bpf_map_lookup_elem(&xl_rules, &key);
	struct xl_bucket_state *st = bpf_map_lookup_elem(&xl_buckets, &slot);
	struct xl_cache *c = bpf_map_lookup_elem(&xl_caches, &slot);
	if (!r || !st || !c || !(r->flags & XL_RULE_ACTIVE))
		return 0;
	xl_state_claim(st, r, now);
	const struct xl_limit *lim = xl_limit_for(r, slot, c, now);
	const struct xl_bucket *b = lim ? &lim->bucket : &r->fallback;
	xl_cache_claim(c, r, b, slot);
	__u64 inc = xl_bucket_inc(b, 1);
	__u32 reason = xl_gate_refusal(r, slot, pkt, lim, st);
	if (!reason && xl_cache_empty(c, inc, xl_runs(r), now))
		reason = XL_REASON_RULE;
	if (!reason && !xl_source_pass(r, slot, key / XL_MAX_RULES, pkt, now))
		reason = XL_REASON_SOURCE;
	if (!reason && !xl_rule_admit(c, st, b, inc, xl_runs(r), now))
		reason = XL_REASON_RULE;
	__u32 verdict = !reason			      ? XL_VERDICT_PASS
			: (r->flags & XL_RULE_SHADOW) ? XL_VERDICT_WOULD_DROP
						      : XL_VERDICT_DROP;
	xl_count(slot, verdict, reason ? reason : XL_REASON_ADMIT, len);
	if (verdict != XL_VERDICT_DROP)
		return 0;
	return reason | ((r->flags & XL_RULE_REFUSE_RESET) ? XL_COOKIE_REFUSE_RESET : 0);
}

/* The kernel's cookie check of the ACK whose IP header is ip (in the
 * packet) and whose TCP header is th (a copy, its ack_seq adjusted). */
static __always_inline long xl_cookie_check(void *ip, void *end, struct xl_tcphdr *th, __u32 family)
{
	if (family == 4) {
		struct xl_iphdr *ip4 = ip;
		if ((void *)(ip4 + 1) > end)
			return -1;
		return bpf_tcp_raw_check_syncookie_ipv4((void *)ip4, (void *)th);
	}
	struct xl_ipv6hdr *ip6 = ip;
	if ((void *)(ip6 + 1) > end)
		return -1;
	return bpf_tcp_raw_check_syncookie_ipv6((void *)ip6, (void *)th);
}

/* Whether a cookie rule in slot may have sent the cookie an ACK returns:
 * `always`, or `auto` within XL_COOKIE_GRACE_NS of its last cookie. */
static __always_inline int xl_cookie_window(__u32 gen, __u32 slot, __u64 *now)
{
	__u32 key = gen * XL_MAX_RULES + slot;
	struct xl_rule *r = bpf_map_lookup_elem(&xl_rules, &key);
	if (!r)
		return 0;
	if (r->flags & XL_RULE_COOKIE_ALWAYS)
		return 1;
	struct xl_cookie_state *cs = bpf_map_lookup_elem(&xl_cookie_state, &slot);
	return cs && cs->epoch == r->epoch && cs->last_ns &&
	       xl_time(now) < cs->last_ns + XL_COOKIE_GRACE_NS;
}

/* The cookie rules of rules (a mask of generation gen's) that may have
 * sent a cookie now (xl_cookie_window), as a mask. A global function: the
 * caller's verification sees one value, not one path per rule. */
__noinline __u64 xl_cookie_open(__u32 gen, __u64 rules, __u64 *now)
{
	__u64 open = 0;
	if (!now || gen >= XL_GENERATIONS)
		return 0;
	for (__u32 i = 0; i < XL_MAX_RULES; i++) {
		if (!(rules >> i))
			break;
		if (((rules >> i) & 1) && xl_cookie_window(gen, i, now))
			open |= 1ULL << i;
	}
	return open;
}

/* Only an ACK handed to its listener passes (TC_ACT_OK) and only one its
 * rules refuse is dropped (TC_ACT_SHOT); everything else goes on as if
 * this program were not there (XL_TC_NEXT). */
SEC("tc")
int xlimit_tc_cookie(struct __sk_buff *skb)
{
	__u32 zero = 0, gen;
	struct xl_globals *g = xl_tc_config(&zero, &gen);
	if (!g)
		return XL_TC_NEXT;
	struct xl_cookie_cfg *cfg = bpf_map_lookup_elem(&xl_cookie_cfg, &gen);
	if (!cfg || !cfg->rules)
		return XL_TC_NEXT;

	struct xl_cursor cur;
	struct xl_pkt pkt = {};
	void *ip;
	struct xl_tcphdr *tcp = xl_tc_tcp(skb, &cur, &pkt, &ip);
	if (!tcp || xl_parse_l4(&cur, &pkt, IPPROTO_TCP) < 0)
		return XL_TC_NEXT;
	if ((tcp->flags & (XL_TCP_SYN | XL_TCP_ACK | XL_TCP_RST)) != XL_TCP_ACK)
		return XL_TC_NEXT;
	/* Cookies are answered only to plain IP headers (syncookie.h). */
	if (pkt.family == 4 && (void *)tcp != ip + sizeof(struct xl_iphdr))
		return XL_TC_NEXT;
	if (pkt.family == 6 && (void *)tcp != ip + sizeof(struct xl_ipv6hdr))
		return XL_TC_NEXT;

	/* The ACK stands for the SYN it answers: match it as one. */
	pkt.proto = XL_PROTO_TCP;
	pkt.syn = 1;
	struct xl_prefix *src = xl_lookup_source(&pkt, gen, g);
	if (src && (src->flags & (XL_PREFIX_ALLOW | XL_PREFIX_DENY)))
		return XL_TC_NEXT;
	__u64 mask = xl_match(&pkt, gen, g, src) & g->syn_only;
	__u64 cookie_rules = mask & cfg->rules;
	if (!cookie_rules)
		return XL_TC_NEXT;
	/* The cookie rules that may have sent the cookie the ACK returns:
	 * none, and the ACK is none of xlimit's business (no socket lookup). */
	__u64 now = 0;
	__u64 open = xl_cookie_open(gen, cookie_rules, &now);
	if (!open)
		return XL_TC_NEXT;
	__u32 first = xl_lowest_bit(open);
	struct xl_cookie_link *lk = bpf_map_lookup_elem(&xl_cookie_link, &zero);
	if (!lk)
		return XL_TC_NEXT;
	struct xl_cookie_counters *cnt = NULL;

	struct bpf_sock *skc = xl_cookie_socket(skb, ip, tcp, cur.end, pkt.family);
	if (!skc)
		return XL_TC_NEXT;
	int ret = XL_TC_NEXT;
	if (skc->state != XL_TCP_LISTEN)
		goto release;

	/* Which rule answered: the offset its cookie carries. The check
	 * helpers take a fixed-size header, so the stack copy (that the
	 * options are parsed from below) does, its ack_seq adjusted. */
	struct xl_tcp_copy th = {};
	__u32 n = (tcp->doff_res >> 4) * 4;
	asm volatile("%0 &= 0x3c" : "+r"(n));
	if (n < sizeof(struct xl_tcphdr) ||
	    bpf_skb_load_bytes(skb, (void *)tcp - (void *)(long)skb->data, th.b, n))
		goto release;
	struct xl_tcphdr *th20 = (struct xl_tcphdr *)th.b;
	__u32 ack = bpf_ntohl(th20->ack_seq);
	/* The rules the ACK charges: from the one that answered on (the SYN
	 * charged those before it at XDP, which admitted it, and never met
	 * those after). Kept as a mask, not the slot, so that the verifier
	 * sees one charging loop, not one per slot. */
	__u64 charge = 0;
	__u32 answered = 0;
	for (__u32 i = 0; i < XL_MAX_RULES; i++) {
		if (!(open >> i))
			break;
		if (!((open >> i) & 1))
			continue;
		th20->ack_seq = bpf_htonl(ack - lk->offset - 4 * i);
		if (!xl_cookie_check(ip, cur.end, th20, pkt.family)) {
			charge = mask >> i << i;
			cnt = xl_cookie_counters(i);
			answered = i;
			break;
		}
	}
	if (!charge || !cnt) {
		/* Not xlimit's. The kernel's own cookie (its SYN queue
		 * overflowed, or tcp_syncookies=2) is the kernel's to check
		 * and decode; anything else its listener answers (a reset) as
		 * it would. */
		th20->ack_seq = bpf_htonl(ack);
		struct xl_answer_counters *ac = bpf_map_lookup_elem(&xl_answer_stats, &first);
		cnt = xl_cookie_counters(first);
		if (ac && lk->offset && !xl_cookie_check(ip, cur.end, th20, pkt.family))
			ac->kernel_cookie++;
		else if (cnt)
			cnt->failed++;
		goto release;
	}

	__u64 len = skb->len;
	for (__u32 i = 0; i < XL_MAX_RULES; i++) {
		if (!(charge >> i))
			break;
		if (!((charge >> i) & 1))
			continue;
		xl_cookie_units(gen * XL_MAX_RULES + i, &pkt, &now);
		int why = xl_cookie_charge(gen * XL_MAX_RULES + i, &pkt, &now, len);
		if (!why)
			continue;
		cnt->refused++;
		/* Refused. Under refuse: reset, the ACK goes on to the
		 * listener, which holds no request for it (the cookie is
		 * xlimit's and fails the kernel's own check) and answers it
		 * with a reset, <SEQ=SEG.ACK><CTL=RST> (RFC 9293, 3.10.7.2): the
		 * client learns at once that it is refused, where a dropped
		 * ACK leaves it believing it is connected. The cookie proved
		 * the source's address (it returned the SYN-ACK), so the reset
		 * cannot be aimed at a third party: no reset budget bounds it,
		 * and it is one segment, no larger than the ACK, per ACK the
		 * client sends. Else dropped: the client's retransmissions are
		 * checked again and handed over once the rule admits one. */
		if (why & XL_COOKIE_REFUSE_RESET) {
			__u64 *n = bpf_map_lookup_elem(&xl_cookie_reset, &answered);
			if (n)
				(*n)++;
			goto release;
		}
		ret = TC_ACT_SHOT;
		goto release;
	}

	struct xl_syn_opts o = {};
	xl_cookie_parse_opts(&th, n, &o);
	struct bpf_tcp_req_attrs attrs = {};
	__u32 opt = o.ts ? o.tsecr & 0xff : 0;
	attrs.mss = xl_cookie_mss(pkt.family, o.ts ? opt >> XL_TSOPT_MSS_SHIFT : 0);
	if (o.ts) {
		attrs.tstamp_ok = 1;
		attrs.rcv_tsval = o.tsval;
		attrs.rcv_tsecr = o.tsecr;
		attrs.sack_ok = (opt & XL_TSOPT_SACK) != 0;
		attrs.ecn_ok = (opt & XL_TSOPT_ECN) != 0;
		if ((opt & XL_TSOPT_WSCALE_NONE) != XL_TSOPT_WSCALE_NONE) {
			attrs.wscale_ok = 1;
			attrs.snd_wscale = opt & XL_TSOPT_WSCALE_NONE;
			attrs.rcv_wscale = XL_COOKIE_RCV_WSCALE;
		}
	}
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(skc);
	if (!tp) {
		cnt->assign_failed++;
		goto release;
	}
	if (bpf_sk_assign_tcp_reqsk(skb, (struct sock *)tp, &attrs, sizeof(attrs))) {
		cnt->assign_failed++;
	} else {
		cnt->validated++;
		ret = TC_ACT_OK;
	}
release:
	bpf_sk_release(skc);
	return ret;
}
