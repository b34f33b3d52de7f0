/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The kernel's view of how fast a protected service works, read with no
 * change to the service (docs/dataplane.md, "Service rate and response
 * time"):
 *   - xl_served: handshakes completed per rule (the sock_ops program, for
 *     the rules in xl_globals.served), from which the daemon takes the
 *     rate the service accepts connections: handshakes minus the growth
 *     of its accept queue;
 *   - the server response time of the rules in xl_globals.resp_time: the
 *     XDP program stamps a flow's first unanswered request byte
 *     (resptime_xdp.h), the TC egress program (resptime_tc.c) takes the
 *     time to the first byte of the response into a per-rule histogram.
 * This header holds what both objects share: the types, the maps and the
 * histogram's bucket function. */
#ifndef XLIMIT_RESPTIME_H
#define XLIMIT_RESPTIME_H

#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "types.h"

/* Flows whose unanswered request is followed at once (xl_resp_flows). */
#define XL_RESP_FLOWS 65536
/* Buckets of the response-time histogram: 4 per power of two of units
 * (each about 19 % wide), from 1 unit to 2^25 (34 s; the last bucket,
 * from 30 s, takes everything above). */
#define XL_RESP_BUCKETS 96
/* Unit of the histogram: 2^10 ns (1.024 us). */
#define XL_RESP_UNIT_SHIFT 10

/* A TCP flow as the client sent it: client (saddr, sport) to the service
 * (daddr, dport). IPv4 addresses in the first 4 bytes. */
struct xl_flow_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport;
	__u16 dport;
	__u8 family; /* 4 or 6 */
	__u8 _pad[3];
};

/* A flow's unanswered request (state). */
struct xl_flow {
	/* Time of the first request byte that no response byte followed
	 * yet, or 0 when the last request was answered. */
	__u64 stamp_ns;
	__u32 slot;  /* the rule charged: the lowest response_time rule */
	__u32 flags; /* enum xl_flow_flag (request.h) */
};

/* A rule's responses (state, per-CPU): counts since the program was
 * loaded, read as differences. */
struct xl_resp_hist {
	__u64 stamps;			/* requests stamped (XDP) */
	__u64 count;			/* responses timed (TC egress) */
	__u64 sum_ns;			/* their response times summed */
	__u64 buckets[XL_RESP_BUCKETS]; /* their response times (xl_resp_bucket) */
};

/* State. Key: slot. Value: TCP handshakes completed for the rule (counted
 * by the sock_ops program when a passively opened connection enters its
 * listener's accept queue). Per-CPU array: one increment per connection
 * that never contends. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_served SEC(".maps");

/* State. Key: a TCP flow, client to service. Value: its unanswered
 * request's stamp. LRU hash: a flood of new flows evicts the oldest
 * instead of failing inserts (an evicted flow loses one sample, nothing
 * else). Written by XDP (stamp) and TC egress (answer). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, XL_RESP_FLOWS);
	__type(key, struct xl_flow_key);
	__type(value, struct xl_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_resp_flows SEC(".maps");

/* State. Key: slot. Value: the rule's response-time histogram. Per-CPU
 * array: every response adds without contention; readers sum CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_resp_hist);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_resp_hists SEC(".maps");

/* The index of the highest set bit of a non-zero value, without a loop
 * (see xl_lowest_bit in conns.h). */
static __always_inline __u32 xl_highest_bit(__u64 v)
{
	__u32 n = 0;
	if (v >> 32) {
		n += 32;
		v >>= 32;
	}
	if (v >> 16) {
		n += 16;
		v >>= 16;
	}
	if (v >> 8) {
		n += 8;
		v >>= 8;
	}
	if (v >> 4) {
		n += 4;
		v >>= 4;
	}
	if (v >> 2) {
		n += 2;
		v >>= 2;
	}
	if (v >> 1)
		n += 1;
	return n;
}

/* The histogram bucket of a response time: u = ns >> 10; below 4, bucket
 * u; else, with e the highest bit of u, 4 (e - 1) plus the two bits below
 * it. The Go side (userspace/dataplane RespBucket) mirrors it. */
static __always_inline __u32 xl_resp_bucket(__u64 ns)
{
	__u64 u = ns >> XL_RESP_UNIT_SHIFT;
	if (u < 4)
		return u;
	__u32 e = xl_highest_bit(u);
	__u32 b = 4 * (e - 1) + ((u >> (e - 2)) & 3);
	return b < XL_RESP_BUCKETS ? b : XL_RESP_BUCKETS - 1;
}

#endif /* XLIMIT_RESPTIME_H */
