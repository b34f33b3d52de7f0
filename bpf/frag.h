/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Fragments of datagrams to port rules. A later (non-first) fragment
 * carries no L4 header, so no port: it takes the port rules its datagram's
 * first fragment matched, remembered in xl_frags under (source,
 * destination, protocol, IP ID).
 *
 * A UDP datagram is decided whole at its first fragment, which carries the
 * UDP length: each port rule that takes fragments charges the whole
 * datagram there in one take (xl_frag_whole, xl_frag_take: its frame
 * bytes, or its number of fragments for a packet rule), and its later
 * fragments pass that rule uncharged, up to the bytes and fragments the
 * first declared. A refused first fragment drops the rest. So under
 * overload the rule admits whole datagrams, as many as its rate carries,
 * instead of the first fragments of all of them. Rules that cannot decide
 * for the datagram (shadow and per-source rules) and datagrams whose size
 * the first fragment does not tell (TCP, a UDP length that does not
 * exceed the first fragment) charge each fragment as it comes (its own
 * length for byte rules).
 *
 * Once a rule drops a fragment, the rest of the datagram, useless to the
 * host, is dropped without a charge.
 *
 * Only datagrams whose first fragment met a port rule that takes
 * fragments are kept in xl_frags, so that first fragments to ports no
 * rule names (spoofed ones among them) never evict a datagram a rule
 * decided. The first fragment of any other datagram marks a slot of
 * xl_frag_seen, an array indexed by a hash of its key and stamped with
 * the time. A later fragment found in neither (its first fragment lost,
 * reordered, evicted, or never sent) is an orphan and is dropped: it
 * cannot be reassembled into anything the rules admitted. One whose slot
 * was marked in the last XL_FRAG_SEEN_NS passes as its datagram's first
 * fragment did, matched by the protocol it recorded. The trade-off: an
 * orphan that hashes to a marked slot passes too, so a flood of first
 * fragments to unnamed ports (which itself reaches the host's
 * reassembly, no rule limiting it) lets orphans through in proportion to
 * the slots it marks; it can never make a datagram that met no port rule
 * drop.
 *
 * The datagram of a fragment is what Linux reassembles by: for IPv6 its
 * (source, destination, identification), the protocol taken from its
 * first fragment, a later fragment's own Next Header read by nobody; for
 * IPv4 the protocol too (xl_frag_key). So IPv6 fragments are followed
 * once any protocol is (xl_frag_tracked), whatever their Next Header.
 *
 * Only protocols with a port rule that takes fragments (xl_globals.
 * frag_match) are followed; a packet that is no fragment never reaches
 * this file (one flag test). docs/dataplane.md, "Fragments". */
#ifndef XLIMIT_FRAG_H
#define XLIMIT_FRAG_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "bucket.h"
#include "clock.h"
#include "maps.h"
#include "parse.h"
#include "stats.h"
#include "types.h"

/* The frame a datagram's last fragment is counted as at least: the
 * shortest Ethernet frame a NIC pads to, with room for a VLAN tag. */
#define XL_FRAG_MIN_FRAME 64

/* Whether the fragments of the packet's protocol are followed. */
static __always_inline int xl_frag_followed(const struct xl_pkt *pkt, const struct xl_globals *g)
{
	return pkt->proto < XL_PORT_PROTOS && g->frag_match[pkt->proto & 1];
}

/* Whether the packet's datagram is looked up or recorded: an IPv4
 * fragment's when its protocol is followed; any IPv6 fragment's once a
 * protocol is (a later one's Next Header says nothing). */
static __always_inline int xl_frag_tracked(const struct xl_pkt *pkt, const struct xl_globals *g)
{
	if (pkt->family == 6)
		return (g->frag_match[0] | g->frag_match[1]) != 0;
	return xl_frag_followed(pkt, g);
}

static __always_inline void xl_frag_key(struct xl_frag_key *k, const struct xl_pkt *pkt)
{
	__builtin_memcpy(k->saddr, pkt->saddr, 16);
	__builtin_memcpy(k->daddr, pkt->daddr, 16);
	k->id = pkt->frag_id;
	k->family = pkt->family;
	k->proto = pkt->family == 6 ? 0 : pkt->l4;
}

/* The slot of xl_frag_seen of the datagram of key k: its ten words mixed
 * (multiply by the golden ratio, xor-fold). */
static __always_inline __u32 xl_frag_seen_slot(const struct xl_frag_key *k)
{
	const __u32 *w = (const __u32 *)k;
	__u32 h = 0;
	_Static_assert(sizeof(*k) == 40, "ten words");
#pragma unroll
	for (int i = 0; i < 10; i++)
		h = (h ^ w[i]) * 0x9e3779b1u;
	return (h ^ (h >> 16)) & (XL_FRAG_SEEN_SLOTS - 1);
}

/* The size of the datagram of a first UDP fragment of len bytes, from its
 * UDP length: *frags fragments, and *bytes, the frames they make when each
 * repeats the first's headers and carries as much as the first (as a
 * sender fragments), the last one counted at least XL_FRAG_MIN_FRAME.
 * Returns 0 when the UDP length does not go beyond the first fragment (a
 * size it does not tell, or a lie about it). */
static __always_inline int xl_frag_size(struct xdp_md *ctx, const struct xl_pkt *pkt, __u64 len,
					__u64 *bytes, __u64 *frags)
{
	if (!pkt->first_frag || pkt->l4 != IPPROTO_UDP)
		return 0;
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u32 off = pkt->l4_off;
	if (off > 512)
		return 0;
	struct xl_udphdr *udp = data + off;
	if ((void *)(udp + 1) > end)
		return 0;
	__u64 total = bpf_ntohs(udp->len);
	__u64 chunk = len - off; /* the UDP header and the data in this frame */
	if (len <= off || total <= chunk)
		return 0;
	__u64 n = (total + chunk - 1) / chunk;
	__u64 last = off + total - (n - 1) * chunk;
	*bytes = (n - 1) * len + (last < XL_FRAG_MIN_FRAME ? XL_FRAG_MIN_FRAME : last);
	*frags = n;
	return 1;
}

/* Whether the rule of flags (in xl_rules at key: its generation and slot)
 * decides for the whole datagram of the first fragment pkt: a port rule that takes the
 * fragments of the packet's protocol, no shadow rule (it decides nothing)
 * and no per-source rule (whose source buckets count packets one by one),
 * and a datagram whose size the first fragment tells. Then *cost is the
 * datagram's: its frame bytes for a byte rule, its fragments for a packet
 * rule (unless cost is NULL). A global function, as the next: verified once, each adds one
 * branch to its caller's paths. */
__noinline int xl_frag_whole(struct xdp_md *ctx, const struct xl_pkt *pkt, __u32 key, __u32 flags,
			     __u64 *cost)
{
	if (!ctx || !pkt || !pkt->first_frag || (flags & (XL_RULE_SHADOW | XL_RULE_PER_SOURCE)))
		return 0;
	__u32 gen = key / XL_MAX_RULES;
	__u32 slot = key % XL_MAX_RULES;
	__u64 len = (__u64)ctx->data_end - (__u64)ctx->data;
	struct xl_globals *g = bpf_map_lookup_elem(&xl_config, &gen);
	if (!g || !xl_frag_followed(pkt, g) || !((g->frag_match[pkt->proto & 1] >> slot) & 1))
		return 0;
	__u64 bytes = 0, frags = 0;
	if (!xl_frag_size(ctx, pkt, len, &bytes, &frags))
		return 0;
	if (cost)
		*cost = (flags & XL_RULE_BYTES) ? bytes : frags;
	return 1;
}

/* Takes a whole datagram's inc from a rule's shared bucket, all or
 * nothing, at now (ns). It conforms when the bucket has room for it or,
 * for a datagram larger than the bucket's tolerance, when the bucket is
 * full: it then takes inc whole, and the bucket owes at most that one
 * datagram beyond its tolerance (the TAT is at most max(tol, inc) ahead),
 * which the rate pays back before anything else conforms. So over any
 * interval the rule admits at most rate x time + burst + one datagram. A
 * datagram worth more than half XL_STALE_AHEAD never conforms, so that a
 * debt is never taken for a stale TAT.
 *
 * Not through the CPU's token cache: the cache's credit stays for the
 * packets it was borrowed for, and a refusal leaves its retry time alone
 * (it is the time the bucket has room for a packet, not for a datagram). */
__noinline int xl_frag_take(__u64 *tat, __u64 tol, __u64 inc, __u64 now)
{
	if (!tat || inc > XL_STALE_AHEAD / 2)
		return 0;
	__u64 now_u = now << XL_TIME_SHIFT;
	__u64 need = inc < tol ? inc : tol;
	__u64 old = *(volatile __u64 *)tat;

	for (int i = 0; i < XL_CAS_RETRIES; i++) {
		__s64 ahead = (__s64)(old - now_u);
		__u64 base = (ahead < 0 || (__u64)ahead > XL_STALE_AHEAD) ? now_u : old;
		__s64 room = (__s64)tol - (__s64)(base - now_u);

		if (room < (__s64)need)
			return 0;
		__u64 seen = __sync_val_compare_and_swap(tat, old, base + inc);
		if (seen == old)
			return 1;
		old = seen;
	}
	return 0;
}

/* xl_frag_take on a rule's bucket state, in the units of the settings b
 * first, as every take from it is (bucket.h, xl_state_units): a datagram
 * after a change of rate is charged against the bucket's fill, not its
 * raw TAT. A debt beyond the tolerance is rescaled as a fill would be. */
static __always_inline int xl_frag_take_units(struct xl_bucket_state *st, const struct xl_bucket *b,
					      __u64 inc, __u64 now)
{
	xl_state_units(st, b, now << XL_TIME_SHIFT);
	return xl_frag_take(&st->tat, b->tol, inc, now);
}

/* Counts a later fragment of len bytes that passed on its datagram's
 * decision in each rule of mask, as that rule's admission. A global
 * function: verified once, and its loop stays off xlimit_xdp's stack. */
__noinline int xl_frag_count(__u64 mask, __u64 len)
{
	for (__u32 i = 0; i < XL_MAX_RULES; i++) {
		if (!(mask >> i))
			break;
		if ((mask >> i) & 1)
			xl_count(i, XL_VERDICT_PASS, XL_REASON_ADMIT, len);
	}
	return 0;
}

/* A later fragment of a tracked datagram (xl_frag_tracked): in the rules
 * that decided for its whole datagram it passes uncharged (counted as
 * theirs). Returns in the low byte XL_REASON_NO_RULE, XL_REASON_ADMIT
 * when it passed such rules, or the reason it is dropped before any rule
 * (above XL_REASON_ADMIT, counted in the rule's slot where there is one):
 * XL_REASON_FRAGMENT_ORPHAN when neither xl_frags nor xl_frag_seen knows
 * its datagram, or XL_REASON_FRAGMENT when a fragment of the datagram
 * was dropped already or when it goes beyond the bytes or fragments its
 * first fragment declared and paid for. When it passes, the next byte is
 * its first fragment's IP protocol + 1 (0: not known), which an IPv6
 * fragment takes as its own.
 *
 * A global function returning a number, not the entry: xlimit_xdp's paths
 * after it (the cookie's reply among them) are then walked by the verifier
 * once whatever the entry said. */
__noinline __u32 xl_frag_later(struct xdp_md *ctx, const struct xl_pkt *pkt, __u64 *now)
{
	if (!ctx || !pkt || !now)
		return XL_REASON_FRAGMENT_ORPHAN;
	__u64 len = (__u64)ctx->data_end - (__u64)ctx->data;
	struct xl_frag_key k = {};
	xl_frag_key(&k, pkt);
	struct xl_frag *e = bpf_map_lookup_elem(&xl_frags, &k);
	if (!e) {
		/* A datagram that met no port rule, if its slot says so. */
		__u32 slot = xl_frag_seen_slot(&k);
		__u64 *seen = bpf_map_lookup_elem(&xl_frag_seen, &slot);
		__u64 v = seen ? *(volatile __u64 *)seen : 0;
		if (v && (__s64)(xl_time(now) - (v & ~0xffULL)) < (__s64)XL_FRAG_SEEN_NS)
			return XL_REASON_NO_RULE | (__u32)((v & 0xff) + 1) << 8;
		return XL_REASON_FRAGMENT_ORPHAN;
	}
	__u32 l4 = (__u32)(e->l4 + 1) << 8;
	if (e->dropped) {
		if (e->dropped <= XL_MAX_RULES)
			xl_count(e->dropped - 1, XL_VERDICT_DROP, XL_REASON_FRAGMENT, len);
		return XL_REASON_FRAGMENT;
	}
	if (!e->whole)
		return XL_REASON_NO_RULE | l4;
	__s32 frags = __sync_fetch_and_add(&e->frags, -1);
	__s32 bytes = __sync_fetch_and_add(&e->bytes, -(__s32)len);
	if (frags <= 0 || bytes < (__s32)len)
		return XL_REASON_FRAGMENT;
	xl_frag_count(e->whole, len);
	return XL_REASON_ADMIT | l4;
}

/* The rules of the first fragment of the later fragment pkt that charge
 * each fragment (xl_frag_later found its datagram). A function of its
 * own, returning a number: a pointer into xlimit_xdp's stack would keep
 * the mask there, and the verifier would walk the paths after it once per
 * value the callee may have written. */
__noinline __u64 xl_frag_rules(const struct xl_pkt *pkt)
{
	if (!pkt)
		return 0;
	struct xl_frag_key k = {};
	xl_frag_key(&k, pkt);
	struct xl_frag *e = bpf_map_lookup_elem(&xl_frags, &k);
	return e ? e->rules : 0;
}

/* Marks the datagram of the later fragment pkt dropped by the rule of
 * slot + 1 dropped: the rest is dropped uncharged (xl_frag_later). */
__noinline int xl_frag_mark(const struct xl_pkt *pkt, __u32 dropped)
{
	if (!pkt)
		return 0;
	struct xl_frag_key k = {};
	xl_frag_key(&k, pkt);
	struct xl_frag *e = bpf_map_lookup_elem(&xl_frags, &k);
	if (e)
		e->dropped = dropped;
	return 0;
}

/* The rules of followed (in generation gen) that decided for the whole
 * datagram of the first fragment pkt of len bytes, as xl_frag_whole
 * decides in xl_apply_rule: active, no shadow, no per-source rule. Once
 * every rule has admitted the packet they all admitted the datagram. The
 * mask is made without a branch on a rule's flags, so that the verifier
 * does not walk the loop once per combination of them. */
static __always_inline __u64 xl_frag_whole_rules(struct xdp_md *ctx, const struct xl_pkt *pkt,
						 __u32 gen, __u64 followed, __u64 len)
{
	__u64 bytes = 0, frags = 0;
	if (gen >= XL_GENERATIONS || !xl_frag_size(ctx, pkt, len, &bytes, &frags))
		return 0;
	__u64 whole = 0;
	for (__u32 i = 0; i < XL_MAX_RULES; i++) {
		if (!(followed >> i))
			break;
		__u32 key = gen * XL_MAX_RULES + i;
		struct xl_rule *r = bpf_map_lookup_elem(&xl_rules, &key);
		if (!r)
			continue;
		_Static_assert(XL_RULE_ACTIVE == 1 && XL_RULE_SHADOW == 1 << 1 &&
				   XL_RULE_PER_SOURCE == 1 << 4,
			       "the shifts below");
		__u64 f = r->flags;
		__u64 ok = f & ~(f >> 1) & ~(f >> 4) & 1; /* ACTIVE, not SHADOW, not PER_SOURCE */
		whole |= (ok & (followed >> i)) << i;
	}
	return whole;
}

/* Records what a first fragment of a followed protocol (in generation
 * gen) decided for its datagram: the rules of followed (those it matched
 * that take fragments) that charge each later fragment, those that
 * charged the whole datagram and admitted it, with the bytes and
 * fragments the rest may bring, and dropped, the slot + 1 of the rule
 * that dropped it (0: none; then nothing more matters). A global
 * function: the entry, its key and the loop stay off xlimit_xdp's stack. */
__noinline int xl_frag_record(struct xdp_md *ctx, const struct xl_pkt *pkt, __u64 followed,
			      __u32 gen, __u32 dropped)
{
	if (!ctx || !pkt)
		return 0;
	__u64 len = (__u64)ctx->data_end - (__u64)ctx->data;
	struct xl_frag_key k = {};
	xl_frag_key(&k, pkt);
	__u64 whole = dropped ? 0 : xl_frag_whole_rules(ctx, pkt, gen, followed, len);
	struct xl_frag v = {
	    .rules = followed & ~whole, .whole = whole, .dropped = dropped, .l4 = pkt->l4};
	__u64 bytes = 0, frags = 0;
	if (whole && xl_frag_size(ctx, pkt, len, &bytes, &frags)) {
		v.bytes = bytes > len ? bytes - len : 0;
		v.frags = frags - 1;
	}
	bpf_map_update_elem(&xl_frags, &k, &v, BPF_ANY);
	return 0;
}

/* Marks the datagram of the first fragment pkt, which met no port rule
 * that takes fragments and was not dropped, seen at *now (xl_frag_seen):
 * its later fragments pass. A global function: the key stays off
 * xlimit_xdp's stack. */
__noinline int xl_frag_see(const struct xl_pkt *pkt, __u64 *now)
{
	if (!pkt || !now)
		return 0;
	struct xl_frag_key k = {};
	xl_frag_key(&k, pkt);
	__u32 slot = xl_frag_seen_slot(&k);
	__u64 *seen = bpf_map_lookup_elem(&xl_frag_seen, &slot);
	if (seen)
		*seen = (xl_time(now) & ~0xffULL) | pkt->l4;
	return 0;
}

/* After the rules, dropped being the slot + 1 of the rule that dropped the
 * packet (0: none). A first fragment that met a port rule taking
 * fragments records its datagram (xl_frag_record); another one, not
 * dropped, marks its slot of xl_frag_seen (xl_frag_see); a later fragment
 * that a rule dropped marks its datagram dropped. */
static __always_inline void xl_frag_done(struct xdp_md *ctx, const struct xl_pkt *pkt, __u32 gen,
					 const struct xl_globals *g, __u64 mask, __u32 dropped,
					 __u64 *now)
{
	if (!xl_frag_tracked(pkt, g))
		return;
	if (pkt->fragment) {
		if (dropped)
			xl_frag_mark(pkt, dropped);
		return;
	}
	__u64 followed = xl_frag_followed(pkt, g) ? mask & g->frag_match[pkt->proto & 1] : 0;
	if (followed)
		xl_frag_record(ctx, pkt, followed, gen, dropped);
	else if (!dropped)
		xl_frag_see(pkt, now);
}

#endif /* XLIMIT_FRAG_H */
