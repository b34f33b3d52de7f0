// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Issue 28's experiment, not the data plane: what one lookup of a per-source
 * GCRA bucket costs in a set-associative table in an array map (4 ways a
 * set, sets aligned, no locks, no lists), against the same random sources
 * as BenchmarkRandomSources. proto16: 16-byte ways (IPv4 address, tag,
 * TAT), a set per cache line. proto32: 32-byte ways (8 bytes of address:
 * IPv4, or IPv6 to /64; a tag, the TAT, units, epoch and a drop count), a
 * set on two lines. proto64: 64-byte ways (the product's whole
 * 24-byte key and 40-byte xl_source), a set on four lines of one page.
 * Both refuse a source over its limit without a write (proto64 counts the
 * drop in the way, as xl_source.drops does); a source the set does not
 * hold replaces the way with the least TAT (an expired one first). */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define NWAYS 4
#define INC ((__u64)1000000000 << 6) /* 1 packet/s in 2^-6 ns */
#define TOL (2 * INC)		     /* burst 2 */

struct way16 {
	__u32 addr;
	__u32 tag;
	__u64 tat;
};
struct set16 {
	struct way16 w[NWAYS];
};
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 131072 / NWAYS);
	__type(key, __u32);
	__type(value, struct set16);
} sets16 SEC(".maps");

struct way64 {
	__u32 slot;
	__u8 family, plen;
	__u16 pad;
	__u32 addr[4];
	__u64 tat, over, banned, drops;
	__u32 epoch, units;
};
struct set64 {
	struct way64 w[NWAYS];
};
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 131072 / NWAYS);
	__type(key, __u32);
	__type(value, struct set64);
} sets64 SEC(".maps");

struct way32 {
	__u64 addr;
	__u32 meta;
	__u32 units;
	__u64 tat;
	__u32 epoch;
	__u32 drops;
};
struct set32 {
	struct way32 w[NWAYS];
};
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 131072 / NWAYS);
	__type(key, __u32);
	__type(value, struct set32);
} sets32 SEC(".maps");

static __always_inline int saddr_of(struct xdp_md *ctx, __u32 *a)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (data + 34 > end)
		return -1;
	*a = *(__u32 *)(data + 26);
	return 0;
}

static __always_inline __u32 hash(__u32 a, __u32 slot)
{
	__u32 h = (slot * 0x9e3779b1u) ^ a;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h;
}

SEC("xdp")
int proto16(struct xdp_md *ctx)
{
	__u32 a;
	if (saddr_of(ctx, &a))
		return XDP_ABORTED;
	__u32 tag = 1u << 31 | 7 << 8 | 32;
	__u32 idx = hash(a, 7) & (131072 / NWAYS - 1);
	struct set16 *s = bpf_map_lookup_elem(&sets16, &idx);
	if (!s)
		return XDP_ABORTED;
	__u64 now = bpf_ktime_get_ns() << 6;
	int hit = -1;
#pragma unroll
	for (int i = 0; i < NWAYS; i++)
		if (s->w[i].addr == a && s->w[i].tag == tag)
			hit = i;
	if (hit >= 0 && hit < NWAYS) {
		struct way16 *w = &s->w[hit];
		__u64 tat = w->tat;
		__u64 t = (__s64)(tat - now) > 0 ? tat : now;
		if (t + INC - now > TOL)
			return XDP_DROP;
		if (__sync_val_compare_and_swap(&w->tat, tat, t + INC) != tat)
			return XDP_DROP;
		return XDP_PASS;
	}
	int v = 0;
	__u64 least = s->w[0].tat;
#pragma unroll
	for (int i = 1; i < NWAYS; i++)
		if ((__s64)(s->w[i].tat - least) < 0) {
			least = s->w[i].tat;
			v = i;
		}
	if (v >= 0 && v < NWAYS) {
		struct way16 *w = &s->w[v];
		w->addr = a;
		w->tag = tag;
		w->tat = now + INC;
	}
	return XDP_PASS;
}

SEC("xdp")
int proto64(struct xdp_md *ctx)
{
	__u32 a;
	if (saddr_of(ctx, &a))
		return XDP_ABORTED;
	__u32 idx = hash(a, 7) & (131072 / NWAYS - 1);
	struct set64 *s = bpf_map_lookup_elem(&sets64, &idx);
	if (!s)
		return XDP_ABORTED;
	__u64 now = bpf_ktime_get_ns() << 6;
	int hit = -1;
#pragma unroll
	for (int i = 0; i < NWAYS; i++) {
		struct way64 *w = &s->w[i];
		if (w->addr[0] == a && w->slot == 7 && w->family == 4 && w->plen == 32 &&
		    !(w->addr[1] | w->addr[2] | w->addr[3]))
			hit = i;
	}
	if (hit >= 0 && hit < NWAYS) {
		struct way64 *w = &s->w[hit];
		__u64 tat = w->tat;
		__u64 t = (__s64)(tat - now) > 0 ? tat : now;
		if (t + INC - now > TOL) {
			__sync_fetch_and_add(&w->drops, 1);
			return XDP_DROP;
		}
		if (__sync_val_compare_and_swap(&w->tat, tat, t + INC) != tat)
			return XDP_DROP;
		return XDP_PASS;
	}
	int v = 0;
	__u64 least = s->w[0].tat;
#pragma unroll
	for (int i = 1; i < NWAYS; i++)
		if ((__s64)(s->w[i].tat - least) < 0) {
			least = s->w[i].tat;
			v = i;
		}
	if (v >= 0 && v < NWAYS) {
		struct way64 *w = &s->w[v];
		w->slot = 7;
		w->family = 4;
		w->plen = 32;
		w->addr[0] = a;
		w->addr[1] = w->addr[2] = w->addr[3] = 0;
		w->tat = now + INC;
		w->over = w->banned = w->drops = 0;
	}
	return XDP_PASS;
}

SEC("xdp")
int proto32(struct xdp_md *ctx)
{
	__u32 a;
	if (saddr_of(ctx, &a))
		return XDP_ABORTED;
	__u32 meta = 7 << 16 | 4 << 8 | 32;
	__u32 idx = hash(a, 7) & (131072 / NWAYS - 1);
	struct set32 *s = bpf_map_lookup_elem(&sets32, &idx);
	if (!s)
		return XDP_ABORTED;
	__u64 now = bpf_ktime_get_ns() << 6;
	int hit = -1;
#pragma unroll
	for (int i = 0; i < NWAYS; i++)
		if (s->w[i].addr == a && s->w[i].meta == meta)
			hit = i;
	if (hit >= 0 && hit < NWAYS) {
		struct way32 *w = &s->w[hit];
		if (w->epoch != 3 || w->units != 5)
			return XDP_ABORTED;
		__u64 tat = w->tat;
		__u64 t = (__s64)(tat - now) > 0 ? tat : now;
		if (t + INC - now > TOL) {
			__sync_fetch_and_add(&w->drops, 1);
			return XDP_DROP;
		}
		if (__sync_val_compare_and_swap(&w->tat, tat, t + INC) != tat)
			return XDP_DROP;
		return XDP_PASS;
	}
	int v = 0;
	__u64 least = s->w[0].tat;
#pragma unroll
	for (int i = 1; i < NWAYS; i++)
		if ((__s64)(s->w[i].tat - least) < 0) {
			least = s->w[i].tat;
			v = i;
		}
	if (v >= 0 && v < NWAYS) {
		struct way32 *w = &s->w[v];
		w->addr = a;
		w->meta = meta;
		w->units = 5;
		w->epoch = 3;
		w->drops = 0;
		w->tat = now + INC;
	}
	return XDP_PASS;
}
