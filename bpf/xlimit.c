// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* xlimit_xdp: admits or drops each incoming packet against the rules'
 * token buckets. Order: parse -> allow/deny prefix -> rule match -> buckets
 * -> one exit that counts the verdict and its reason. */

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "answer.h"
#include "bucket.h"
#include "clock.h"
#include "conns.h"
#include "flood.h"
#include "frag.h"
#include "gen.h"
#include "refuse.h"
#include "reset.h"
#include "resptime.h"
#include "resptime_xdp.h"
#include "maps.h"
#include "match.h"
#include "parse.h"
#include "source.h"
#include "stats.h"
#include "syncookie.h"
#include "types.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Never read: they put the shared enums into BTF, where bpf2go finds them. */
const enum xl_verdict *xl_btf_verdict __attribute__((unused));
const enum xl_reason *xl_btf_reason __attribute__((unused));
const enum xl_proto *xl_btf_proto __attribute__((unused));
const enum xl_rule_flag *xl_btf_rule_flag __attribute__((unused));
const enum xl_global_flag *xl_btf_global_flag __attribute__((unused));
const enum xl_prefix_flag *xl_btf_prefix_flag __attribute__((unused));
const enum xl_reset_outcome *xl_btf_reset_outcome __attribute__((unused));
const enum xl_host_kind *xl_btf_host_kind __attribute__((unused));
const enum xl_answer *xl_btf_answer __attribute__((unused));
const struct xl_frag_key *xl_btf_frag_key __attribute__((unused));
const struct xl_frag *xl_btf_frag __attribute__((unused));
const struct xl_host_key *xl_btf_host_key __attribute__((unused));
const struct xl_host_addr *xl_btf_host_addr __attribute__((unused));

/* xl_apply_rule's flag: answer the dropped packet with a TCP reset. */
#define XL_APPLY_RESET (1 << 16)
/* xl_apply_rule's flag: answer the SYN with a SYN cookie (syncookie.h). */
#define XL_APPLY_COOKIE (1 << 17)
/* The cookie path's class for a shadow rule's SYN: not asked, not
 * answered (a shadow rule answers nothing), counted as a cookie. */
#define XL_ANSWER_SHADOW (XL_ANSWER_MAX + 1)
/* The cookie path's class for a SYN on an interface without XDP_TX
 * (xl_cfg_no_tx): passed to the kernel, whose own SYN cookies answer it. */
#define XL_ANSWER_KERNEL (XL_ANSWER_MAX + 2)

/* Set by the loader (maps.Options.NoXDPTx) on an interface whose driver
 * would take a path known to crash sending XDP_TX frames (loader/preflight,
 * docs/kernels.md): the program answers nothing from XDP. A SYN the cookie
 * path would answer passes to the kernel (its own SYN cookies); a SYN to
 * be refused with a reset is dropped unanswered. The verifier prunes every
 * XDP_TX return when it is set. */
volatile const __u32 xl_cfg_no_tx = 0;

/* The cookie path's class for a SYN of rule r (key: gen * 64 + slot): a
 * shadow rule's is only counted, and without XDP_TX the kernel answers. */
static __always_inline __u32 xl_cookie_ask(struct xdp_md *ctx, const struct xl_pkt *pkt, __u32 key,
					   __u64 *now, const struct xl_rule *r)
{
	if (r->flags & XL_RULE_SHADOW)
		return XL_ANSWER_SHADOW;
	if (xl_cfg_no_tx)
		return XL_ANSWER_KERNEL;
	return xl_cookie_take(ctx, pkt, key, now);
}

/* Applies the rule in one slot of a generation (key: gen * XL_MAX_RULES +
 * slot, its key in xl_rules) and counts its decision. The packet matched
 * the rules of mask.
 * Returns the rule's verdict in the low byte, its reason in the next, and
 * XL_APPLY_RESET when the drop is to be answered with a reset, or
 * XL_APPLY_COOKIE with a SYN cookie.
 * *now is the packet's time, read on first need (0: not read yet).
 *
 * A global (not inlined) function: the verifier checks it once, not once
 * per slot of the caller's loop over the matched rules. */
__noinline int xl_apply_rule(struct xdp_md *ctx, __u32 key, const struct xl_pkt *pkt, __u64 *now,
			     __u64 mask)
{
	__u32 gen = key / XL_MAX_RULES;
	__u32 slot = key % XL_MAX_RULES;
	if (!ctx || !pkt || !now || gen >= XL_GENERATIONS)
		return XL_VERDICT_PASS | XL_REASON_ADMIT << 8;
	struct xl_rule *r = bpf_map_lookup_elem(&xl_rules, &key);
	struct xl_bucket_state *st = bpf_map_lookup_elem(&xl_buckets, &slot);
	struct xl_cache *c = bpf_map_lookup_elem(&xl_caches, &slot);
	if (!r || !st || !c || !(r->flags & XL_RULE_ACTIVE))
		return XL_VERDICT_PASS | XL_REASON_ADMIT << 8;
	/* The frame's length, from the context: an argument more than the
	 * five a BPF call takes, or a field of xl_pkt, which would take
	 * xlimit_xdp's stack past what 6.1's verifier allows for its
	 * deepest chain of calls (docs/kernels.md). */
	__u64 len = (__u64)ctx->data_end - (__u64)ctx->data;

	__u32 verdict = XL_VERDICT_DROP;
	__u32 reason = XL_REASON_RULE;
	__u32 reset = 0;
	__u32 cookie = 0;
	__u32 capped = 0; /* refused by the control loop's in-flight cap */
	__u32 run = 0;	  /* dropped in a run without clock reads */
	const struct xl_bucket *b = &r->fallback;
	__u64 inc = 0;
	if ((pkt->fragment | pkt->first_frag) && (r->flags & XL_RULE_FRAG_DROP)) {
		reason = XL_REASON_FRAGMENT;
		goto out;
	}
	xl_state_claim(st, r, now);
	const struct xl_limit *lim = xl_limit_for(r, slot, c, now);
	if (lim)
		b = &lim->bucket;
	xl_cache_claim(c, r, b, slot);
	__u64 cost = (r->flags & XL_RULE_BYTES) ? len : 1;
	/* A first fragment: the rule may decide for its whole datagram and
	 * charge all of it in one take below (frag.h). Asked again there
	 * rather than kept in a flag, which would double the verifier's
	 * paths in between. */
	if (pkt->first_frag)
		xl_frag_whole(ctx, pkt, key, r->flags, &cost);
	inc = xl_bucket_inc(b, cost);
	/* A SYN for the cookie path: answered, dropped unanswered (the
	 * answering policy refuses it), or, when XDP cannot answer it (a
	 * spent budget, say), on to the gates and the bucket as without
	 * cookies (syncookie.h). A shadow rule's is only counted. */
	__u32 answer = XL_ANSWER_MAX;
	if (xl_cookie_first(r, slot, pkt, b, inc, now)) {
		answer = xl_cookie_ask(ctx, pkt, key, now, r);
		if (!xl_cookie_fallback(answer)) {
			reason = xl_cookie_reason(answer);
			cookie = answer == XL_ANSWER_OK ? XL_APPLY_COOKIE : 0;
			if (answer == XL_ANSWER_KERNEL)
				verdict = XL_VERDICT_PASS;
			goto out;
		}
		/* Not answerable here: through the rule's share for such
		 * SYNs first (one for those to a socket the host has, one for
		 * the others), so that they never empty the bucket validated
		 * cookies are charged to (syncookie.h). Not while no daemon
		 * maintains xl_host_addrs: XDP then answers nothing, no
		 * validated cookie is to be protected, and the whole bucket
		 * is the kernel's (answer.h, xl_answer_maintained). */
		if (xl_answer_maintained() &&
		    !xl_cookie_share_take(xl_cookie_share_key(slot, answer), r->epoch, b->tol, inc,
					  now))
			goto out;
	}

	/* New connections meet the breaker's and the concurrency gates. A
	 * refused one is answered with a reset, so that its client fails at
	 * once, within the resets' budgets (reset.h); a shadow rule's refusal
	 * is not answered. */
	__u32 refused = xl_gate_refusal(r, slot, pkt, lim, st);
	if (refused) {
		reason = refused;
		if (!(r->flags & XL_RULE_SHADOW) && !xl_cfg_no_tx &&
		    xl_reset_decide(ctx, gen, slot, pkt, st, b, inc, now) == XL_RESET_SENT)
			reset = XL_APPLY_RESET;
		goto out;
	}
	/* The control loop's in-flight cap refuses as the rate does: answered
	 * only under `refuse: reset` (below). */
	if (xl_cap_refusal(r, slot, pkt, lim)) {
		reason = XL_REASON_CONCURRENCY;
		capped = 1;
		goto out;
	}

	/* The rule-wide bucket known empty: drop before the per-source table
	 * is touched, so a spoofed flood takes no way in it once it is over
	 * the rule's rate. */
	if (xl_cache_empty(c, inc, xl_runs(r), now)) {
		run = 1;
		goto out;
	}
	if (!xl_source_check(r, slot, gen, pkt, now)) {
		reason = XL_REASON_SOURCE;
		goto out;
	}
	if (pkt->first_frag && xl_frag_whole(ctx, pkt, key, r->flags, NULL)
		? xl_frag_take_units(st, b, inc, xl_time(now))
		: xl_rule_admit(c, st, b, inc, xl_runs(r), now)) {
		verdict = XL_VERDICT_PASS;
		reason = XL_REASON_ADMIT;
	}
out:
	/* `auto`: a SYN the bucket refused goes to the cookie path too, unless
	 * it has been there already. */
	if (reason == XL_REASON_RULE && answer == XL_ANSWER_MAX &&
	    xl_cookie_overflow(r, slot, pkt, now)) {
		answer = xl_cookie_ask(ctx, pkt, key, now, r);
		if (!xl_cookie_fallback(answer)) {
			reason = xl_cookie_reason(answer);
			cookie = answer == XL_ANSWER_OK ? XL_APPLY_COOKIE : 0;
			if (answer == XL_ANSWER_KERNEL)
				verdict = XL_VERDICT_PASS;
		}
	}
	if ((reason == XL_REASON_RULE || reason == XL_REASON_SOURCE || capped) && !xl_cfg_no_tx &&
	    xl_refuse_reset(ctx, gen, slot, r, pkt, st, b, inc, now))
		reset = XL_APPLY_RESET;
	if (verdict == XL_VERDICT_DROP && (r->flags & XL_RULE_SHADOW))
		verdict = XL_VERDICT_WOULD_DROP;
	if (run && reason == XL_REASON_RULE && !reset &&
	    xl_flood_repeatable(r, slot, pkt, mask, lim))
		xl_flood_note(mask, slot, pkt->syn, c);
	xl_count(slot, verdict, reason, len);
	return verdict | reason << 8 | (verdict == XL_VERDICT_DROP ? reset | cookie : 0);
}

SEC("xdp")
int xlimit_xdp(struct xdp_md *ctx)
{
	struct xl_cursor cur = {
	    .pos = (void *)(long)ctx->data,
	    .end = (void *)(long)ctx->data_end,
	};
	__u64 len = cur.end - cur.pos;
	struct xl_pkt pkt = {};
	__u32 verdict = XL_VERDICT_PASS;
	__u32 reason = XL_REASON_NO_RULE;
	__u32 reset = 0;
	/* gen * XL_MAX_RULES + slot + 1 of the rule that answers with a SYN
	 * cookie, or 0. */
	__u32 cookie = 0;
	__u32 zero = 0;
	/* The packet's time, read on first need (clock.h); the cookie's
	 * answer reuses the time its budget read. */
	__u64 now = 0;

	__u64 word = xl_gen_word(&zero);
	if (word == XL_GEN_NONE)
		goto out;
	__u32 gen = word & 1;
	struct xl_globals *g = bpf_map_lookup_elem(&xl_config, &gen);
	if (!g)
		goto out;

	int l3 = xl_parse_eth(&cur);
	pkt.l3_off = cur.pos - (void *)(long)ctx->data;
	int l4;
	if (l3 == ETH_P_IP) {
		l4 = xl_parse_ipv4(&cur, &pkt);
	} else if (l3 == ETH_P_IPV6) {
		l4 = xl_parse_ipv6(&cur, &pkt);
	} else {
		reason = l3 == XL_PARSE_MALFORMED    ? XL_REASON_MALFORMED_L2
			 : l3 == XL_PARSE_VLAN_DEPTH ? XL_REASON_VLAN_DEPTH
						     : XL_REASON_NOT_IP;
		goto malformed;
	}
	if (!pkt.family) {
		reason = XL_REASON_MALFORMED_L3;
		goto malformed;
	}

	struct xl_prefix *src = xl_lookup_source(&pkt, gen, g);
	if (src && (src->flags & XL_PREFIX_ALLOW)) {
		reason = XL_REASON_ALLOW;
		goto out;
	}
	if (src && (src->flags & XL_PREFIX_DENY)) {
		verdict = XL_VERDICT_DROP;
		reason = XL_REASON_DENY;
		goto out;
	}

	if (l4 < 0) {
		reason = l4 == XL_PARSE_EXT_LIMIT ? XL_REASON_EXT_LIMIT : XL_REASON_MALFORMED_L3;
		goto malformed;
	}
	pkt.proto = xl_proto_class(l4);
	pkt.l4 = l4;
	pkt.l4_off = cur.pos - (void *)(long)ctx->data;
	if (!pkt.fragment) {
		int l4r = xl_parse_l4(&cur, &pkt, l4);
		if (l4r < 0) {
			reason = l4r == XL_PARSE_ND_INVALID ? XL_REASON_ND_INVALID
							    : XL_REASON_MALFORMED_L4;
			goto malformed;
		}
	}

	/* Later fragments are orphans, or pass on their first fragment's
	 * decision, and take its protocol for IPv6 (frag.h). */
	__u32 later = 0;
	if (pkt.fragment && xl_frag_tracked(&pkt, g)) {
		later = xl_frag_later(ctx, &pkt, &now);
		reason = later & 0xff;
		if (reason > XL_REASON_ADMIT) {
			verdict = XL_VERDICT_DROP;
			goto out;
		}
		if (pkt.family == 6 && (later >> 8)) {
			pkt.l4 = (later >> 8) - 1;
			pkt.proto = xl_proto_class(pkt.l4);
		}
	}
	__u64 mask = xl_match(&pkt, gen, g, src);
	/* A flood's packet that this CPU's memo answers (flood.h). */
	if (mask && !(pkt.fragment | pkt.first_frag) && xl_flood_drop(&zero, mask, pkt.syn, len))
		return XDP_DROP;
	/* Later fragments take their datagram's rules: those that follow
	 * fragments (port rules, and rules without ports of TCP and UDP)
	 * from its first fragment's entry alone, never again by themselves
	 * (a rule without ports decided the whole datagram there). */
	if (later) {
		if (xl_frag_followed(&pkt, g))
			mask &= ~g->frag_match[pkt.proto & 1];
		mask |= xl_frag_rules(&pkt);
	}

	__u32 dropped = 0; /* slot + 1 of the rule that dropped the packet */
	if (mask)
		reason = XL_REASON_ADMIT;
	for (__u32 i = 0; i < XL_MAX_RULES; i++) {
		if (!(mask >> i))
			break;
		if (!((mask >> i) & 1))
			continue;
		int res = xl_apply_rule(ctx, gen * XL_MAX_RULES + i, &pkt, &now, mask);
		if ((res & 0xff) == XL_VERDICT_DROP) {
			verdict = XL_VERDICT_DROP;
			reason = (res >> 8) & 0xff;
			reset = res & XL_APPLY_RESET;
			if (res & XL_APPLY_COOKIE)
				cookie = gen * XL_MAX_RULES + i + 1;
			dropped = i + 1;
			break;
		}
	}
	/* Requests to response_time rules are stamped (resptime_xdp.h). */
	if (g->resp_time && verdict == XL_VERDICT_PASS)
		xl_resp_ingress(ctx, gen,
				g->resp_time & (~g->src_filtered | (src ? src->rules : 0)),
				XL_RESP_ARGS(&pkt));
	if (pkt.first_frag | pkt.fragment)
		xl_frag_done(ctx, &pkt, gen, g, mask, dropped, &now);
	goto out;

malformed:
	/* NOT_IP always passes: the program does not drop what it does not
	 * understand. Malformed IP passes only when the rules file says so. */
	if (reason != XL_REASON_NOT_IP && !(g->flags & XL_G_MALFORMED_PASS))
		verdict = XL_VERDICT_DROP;
out:
	xl_count(XL_GLOBAL_SLOT, verdict, reason, len);
	/* Nothing is sent back without XDP_TX (xl_cfg_no_tx): the rules
	 * above asked for no answer then; this keeps it so for any other. */
	if (!xl_cfg_no_tx && reset && xl_reply_reset(ctx, &pkt) == 0)
		return XDP_TX;
	if (!xl_cfg_no_tx && cookie)
		return xl_reply_cookie(ctx, &pkt, cookie - 1, now);
	return verdict == XL_VERDICT_DROP ? XDP_DROP : XDP_PASS;
}

/* Counts the connections in flight to rules with a concurrency limit
 * (xl_conns), attached to the root cgroup: see conns.h. */
SEC("sockops")
int xlimit_sockops(struct bpf_sock_ops *skops)
{
	switch (skops->op) {
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		xl_conn_open(skops);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		xl_conn_state(skops);
		break;
	}
	return 1;
}
