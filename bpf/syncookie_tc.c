// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* xlimit_tc_cookie: the ACK side of the SYN cookies that XDP sends
 * (syncookie.h), at TC ingress. An ACK to a listening socket of a cookie
 * rule's port is checked with the kernel's own cookie check; a valid one is
 * charged to the rule like the SYN it stands for, and then handed to the
 * listener with bpf_sk_assign_tcp_reqsk (Linux 6.9), which creates the
 * connection without the listener ever having seen its SYN.
 *
 * A separate object from the XDP program: the kfunc exists only since 6.9,
 * and the loader loads this program only where it does, with the XDP
 * object's maps (docs/kernels.md). */

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

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
#include "types.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* TCX verdicts: NEXT hands the packet on to the next program and to the
 * classic tc filters behind them (xlimit's kernel queues redirect from
 * there); PASS ends the chain. Only an ACK handed to its listener passes;
 * everything else goes on as if this program were not there. */
#define XL_TCX_NEXT   -1
#define TC_ACT_OK     0
#define TC_ACT_SHOT   2
#define XL_TC_TCP_RST 0x04

/* The kernel's struct sock, opaque here: a definition (not a forward
 * declaration) so that the kfunc's BTF matches the kernel's kind. */
struct sock {
	int _opaque;
};
extern int bpf_sk_assign_tcp_reqsk(struct __sk_buff *skb, struct sock *sk,
				   struct bpf_tcp_req_attrs *attrs, int attrs__sz) __ksym;

/* Charges a connection opened by a valid cookie to the rule in slot: the
 * breaker's and the concurrency gates, the per-source bucket and the
 * rule's bucket, as xl_apply_rule charges a SYN. Returns the reason of a
 * refusal, or 0 when admitted. Counts the decision in the rule's counters.
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
	if (!reason && !xl_source_pass(r, slot, pkt, now))
		reason = XL_REASON_SOURCE;
	if (!reason && !xl_rule_admit(c, st, b, inc, xl_runs(r), now))
		reason = XL_REASON_RULE;
	xl_count(slot, reason ? XL_VERDICT_DROP : XL_VERDICT_PASS,
		 reason ? reason : XL_REASON_ADMIT, len);
	return reason;
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

SEC("tc")
int xlimit_tc_cookie(struct __sk_buff *skb)
{
	__u32 zero = 0;
	__u64 word = xl_gen_word(&zero);
	if (word == XL_GEN_NONE)
		return XL_TCX_NEXT;
	__u32 gen = word & 1;
	struct xl_cookie_cfg *cfg = bpf_map_lookup_elem(&xl_cookie_cfg, &gen);
	struct xl_globals *g = bpf_map_lookup_elem(&xl_config, &gen);
	if (!cfg || !g || !cfg->rules)
		return XL_TCX_NEXT;

	struct xl_cursor cur = {
	    .pos = (void *)(long)skb->data,
	    .end = (void *)(long)skb->data_end,
	};
	struct xl_pkt pkt = {};
	int l3 = xl_parse_eth(&cur);
	void *ip = cur.pos;
	int l4;
	if (l3 == ETH_P_IP)
		l4 = xl_parse_ipv4(&cur, &pkt);
	else if (l3 == ETH_P_IPV6)
		l4 = xl_parse_ipv6(&cur, &pkt);
	else
		return XL_TCX_NEXT;
	if (l4 != IPPROTO_TCP || pkt.fragment)
		return XL_TCX_NEXT;
	struct xl_tcphdr *tcp = cur.pos;
	if (xl_parse_l4(&cur, &pkt, l4) < 0 || (void *)(tcp + 1) > cur.end)
		return XL_TCX_NEXT;
	if ((tcp->flags & (XL_TCP_SYN | XL_TCP_ACK | XL_TC_TCP_RST)) != XL_TCP_ACK)
		return XL_TCX_NEXT;
	/* Cookies are answered only to plain IP headers (syncookie.h). */
	if (pkt.family == 4 && (void *)tcp != ip + sizeof(struct xl_iphdr))
		return XL_TCX_NEXT;
	if (pkt.family == 6 && (void *)tcp != ip + sizeof(struct xl_ipv6hdr))
		return XL_TCX_NEXT;

	/* The ACK stands for the SYN it answers: match it as one. */
	pkt.proto = XL_PROTO_TCP;
	pkt.syn = 1;
	struct xl_prefix *src = xl_lookup_source(&pkt, gen, g);
	if (src && (src->flags & (XL_PREFIX_ALLOW | XL_PREFIX_DENY)))
		return XL_TCX_NEXT;
	__u64 mask = xl_match(&pkt, gen, g, src) & g->syn_only;
	__u64 cookie_rules = mask & cfg->rules;
	if (!cookie_rules)
		return XL_TCX_NEXT;
	__u32 first = xl_lowest_bit(cookie_rules);
	__u64 now = 0;
	if (first >= XL_MAX_RULES || !xl_cookie_window(gen, first, &now))
		return XL_TCX_NEXT;

	struct bpf_sock *skc = xl_cookie_socket(skb, ip, tcp, cur.end, pkt.family);
	if (!skc)
		return XL_TCX_NEXT;
	int ret = XL_TCX_NEXT;
	if (skc->state != XL_TCP_LISTEN)
		goto release;

	struct xl_cookie_counters *cnt = xl_cookie_counters(first);
	if (!cnt)
		goto release;
	long bad;
	if (pkt.family == 4) {
		struct xl_iphdr *ip4 = ip;
		if ((void *)(ip4 + 1) > cur.end)
			goto release;
		bad = bpf_tcp_raw_check_syncookie_ipv4((void *)ip4, (void *)tcp);
	} else {
		struct xl_ipv6hdr *ip6 = ip;
		if ((void *)(ip6 + 1) > cur.end)
			goto release;
		bad = bpf_tcp_raw_check_syncookie_ipv6((void *)ip6, (void *)tcp);
	}
	if (bad) {
		/* Not ours: the listener answers it (a reset) as it would. */
		cnt->failed++;
		goto release;
	}

	__u64 len = skb->len;
	for (__u32 i = 0; i < XL_MAX_RULES; i++) {
		if (!(mask >> i))
			break;
		if (!((mask >> i) & 1))
			continue;
		if (xl_cookie_charge(gen * XL_MAX_RULES + i, &pkt, &now, len)) {
			cnt->refused++;
			ret = TC_ACT_SHOT;
			goto release;
		}
	}

	struct xl_syn_opts o = {};
	struct xl_tcp_copy th = {};
	__u32 n = (tcp->doff_res >> 4) * 4;
	asm volatile("%0 &= 0x3c" : "+r"(n));
	if (n >= sizeof(struct xl_tcphdr) &&
	    !bpf_skb_load_bytes(skb, (void *)tcp - (void *)(long)skb->data, th.b, n))
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
