/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Requests in flight per response_time rule (issue 42): the response
 * time's flows (resptime.h, xl_resp_flows) already mark a flow's
 * unanswered request with its stamp, set by the XDP program at the
 * request's first byte (resptime_xdp.h) and cleared by the TC egress
 * program at the response's first byte (resptime_tc.c). A request is in
 * flight while its stamp is set: this header keeps the count per rule, one
 * up when a stamp is set, one down when it is cleared or its flow is
 * forgotten (FIN, RST). An idle keep-alive connection has no stamp and is
 * not in flight. The stamp changes by compare-and-swap, so two CPUs (the
 * request's XDP and the response's TC) never both count one transition.
 *
 * What the count misses: a stamped flow that the LRU evicts (a flood of
 * new flows past XL_RESP_FLOWS) is never counted down. The daemon
 * reconciles every few seconds (maps.(*Tables).ReconcileRequests): it
 * counts the stamped flows per rule in xl_resp_flows and adds the
 * difference to in_flight by an atomic add on the mmapped map, so the
 * drift lasts until the next sweep and never accumulates. */
#ifndef XLIMIT_REQUEST_H
#define XLIMIT_REQUEST_H

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "resptime.h"
#include "types.h"

/* xl_flow.flags: a new request over the rule's cap on requests in flight
 * (xl_limit.req_cap) marks its flow REFUSE at XDP, which passes it; the TC
 * ingress program (request_tc.h) then resets the connection both ways and
 * marks it REFUSED; a refused flow is never stamped again (the stack
 * answers its stray segments with resets, and their RST forgets it). */
enum xl_flow_flag {
	XL_FLOW_REFUSE = 1,
	XL_FLOW_REFUSED = 2,
};

/* A rule's requests (state). */
struct xl_requests {
	__s64 in_flight; /* requests stamped and not yet answered nor forgotten */
	__u64 refused;	 /* new requests refused over the in-flight cap */
};

/* State. Key: slot. Value: the rule's requests in flight. A shared array,
 * not per-CPU: the cap compares one number, and it changes once per
 * request and once per response, by atomic adds. Mmappable: the daemon's
 * reconciliation corrects in_flight by an atomic add too. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_requests);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_requests SEC(".maps");

/* Adds d to slot's requests in flight. */
static __always_inline void xl_req_add(__u32 slot, __s64 d)
{
	struct xl_requests *r = bpf_map_lookup_elem(&xl_requests, &slot);
	if (r)
		__sync_fetch_and_add(&r->in_flight, d);
}

/* Stamps f's request at now if none is waiting; counts it in flight when
 * this call set the stamp. Returns whether it did. */
static __always_inline int xl_req_start(struct xl_flow *f, __u32 slot, __u64 now)
{
	if (__sync_val_compare_and_swap(&f->stamp_ns, 0, now) != 0)
		return 0;
	f->slot = slot;
	xl_req_add(slot, 1);
	return 1;
}

/* Clears f's stamp, if still stamp (the response's first byte), counting
 * the request out. Returns whether this call cleared it. */
static __always_inline int xl_req_done(struct xl_flow *f, __u64 stamp, __u32 slot)
{
	if (!stamp || __sync_val_compare_and_swap(&f->stamp_ns, stamp, 0) != stamp)
		return 0;
	xl_req_add(slot, -1);
	return 1;
}

/* Whether a new request of slot's rule (gen: the generation in force)
 * is over the control loop's cap on its requests in flight: the loop's
 * limit is the rule's (its epoch) and fresh (its deadline), and as many
 * requests as the cap are in flight. Then the request is counted refused
 * and its flow marked REFUSE. The read and the add that follows it are
 * not one atomic step: CPUs starting requests at once can pass the cap by
 * at most one each. */
static __always_inline int xl_req_refuse(struct xl_flow *f, __u32 gen, __u32 slot, __u64 now)
{
	__u32 key = gen * XL_MAX_RULES + slot;
	struct xl_rule *r = bpf_map_lookup_elem(&xl_rules, &key);
	struct xl_limit *lim = bpf_map_lookup_elem(&xl_limits, &slot);
	if (!r || !lim || !lim->req_cap || lim->epoch != r->epoch || now >= lim->deadline_ns)
		return 0;
	struct xl_requests *q = bpf_map_lookup_elem(&xl_requests, &slot);
	if (!q || q->in_flight < (__s64)lim->req_cap)
		return 0;
	f->flags = XL_FLOW_REFUSE;
	__sync_fetch_and_add(&q->refused, 1);
	return 1;
}

/* Forgets the flow k (FIN or RST of either side): its request, if one is
 * in flight, is counted out. */
static __always_inline void xl_req_forget(struct xl_flow_key *k)
{
	struct xl_flow *f = bpf_map_lookup_elem(&xl_resp_flows, k);
	if (!f)
		return;
	__u32 slot = f->slot;
	if (__sync_lock_test_and_set(&f->stamp_ns, 0) != 0)
		xl_req_add(slot, -1);
	bpf_map_delete_elem(&xl_resp_flows, k);
}

#endif /* XLIMIT_REQUEST_H */
