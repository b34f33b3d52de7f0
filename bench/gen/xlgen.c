// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* xlgen: the benchmark's traffic generator and its reference receivers.
 * Not part of the data plane.
 *
 * xlgen_tx runs through BPF_PROG_TEST_RUN in live-frames mode
 * (BPF_F_TEST_XDP_LIVE_FRAMES), as the kernel's samples/bpf xdp_trafficgen
 * does: the kernel builds each frame from the test input, runs the program
 * and redirects the frame out of gen_ifindex (a veth, whose peer receives it
 * through its NAPI poll). Optionally every frame gets a random IPv4 source
 * within gen_src_base/gen_src_mask; the IPv4 header checksum is then
 * recomputed and the frame must carry no UDP checksum (0).
 *
 * xlgen_spoof does the same to one buffer that BPF_PROG_TEST_RUN runs
 * again and again without live frames, and tail-calls a receiver: random
 * sources measured where the kernel refuses live frames.
 *
 * xlgen_resyn puts one frame back into the buffer at every repeat and
 * tail-calls a receiver that rewrites it (a SYN answered with a cookie):
 * the answer measured without a syscall per packet.
 *
 * xlgen_clone is the sender where the kernel refuses live frames: a TC
 * program that BPF_PROG_TEST_RUN runs on one skb, which it sends out of
 * gen_ifindex gen_clones times (bpf_clone_redirect), on the transmit queue
 * of the running CPU's number modulo gen_queues.
 *
 * xlgen_drop and xlgen_pass are the one-line receivers: XDP_DROP (the
 * fastest possible receiver) and XDP_PASS (no filter; an XDP program on a
 * veth enables the NAPI that ndo_xdp_xmit needs). */

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Set at load time. */
volatile const __u32 gen_ifindex = 0;
/* Set at any time (.bss, mmapped by the loader). */
volatile __u32 gen_src_base = 0; /* host byte order */
volatile __u32 gen_src_mask = 0; /* host bits that vary; 0: keep the source */
/* xlgen_clone's copies per run (at most XLGEN_CLONES_MAX) and the transmit
 * queues it spreads them over by CPU (0: the interface's own choice). */
volatile __u32 gen_clones = 1;
volatile __u32 gen_queues = 0;

#define ETH_HLEN 14
/* The longest frame xlgen_resyn restores. */
#define XLGEN_FRAME_MAX	 128
#define ETH_P_IP	 0x0800
#define XLGEN_CLONES_MAX 256
/* linux/pkt_cls.h's verdicts (not among bpf/include's headers). */
#define TC_ACT_UNSPEC (-1)
#define TC_ACT_SHOT   2

/* Gives the frame a random IPv4 source within gen_src_base/gen_src_mask and
 * recomputes its IPv4 header checksum; 0, or -1 for a frame that is not
 * plain IPv4 after an untagged Ethernet header. */
static __always_inline int xlgen_random_source(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	__u8 *eth = data;
	__u16 *ip = data + ETH_HLEN;

	if ((void *)(ip + 10) > end)
		return -1;
	if (eth[12] != (ETH_P_IP >> 8) || eth[13] != (ETH_P_IP & 0xff) || ((__u8 *)ip)[0] != 0x45)
		return -1;
	__u32 src = gen_src_base | (bpf_get_prandom_u32() & gen_src_mask);
	__u32 nsrc = bpf_htonl(src);
	ip[6] = (__u16)nsrc;
	ip[7] = (__u16)(nsrc >> 16);
	ip[5] = 0;
	__u32 sum = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += ip[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	ip[5] = (__u16)~sum;
	return 0;
}

SEC("xdp")
int xlgen_tx(struct xdp_md *ctx)
{
	if (gen_src_mask && xlgen_random_source(ctx))
		return XDP_ABORTED;
	return bpf_redirect(gen_ifindex, 0);
}

/* The receiver xlgen_spoof hands each frame to: slot 0, set by the loader
 * (any XDP program: xlimit's, or xlgen_drop as the reference). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} xlgen_next SEC(".maps");

/* xlgen_spoof: random sources without live frames. BPF_PROG_TEST_RUN
 * without BPF_F_TEST_XDP_LIVE_FRAMES runs a program on one buffer as many
 * times as asked, and what a run writes into it stays: so this gives the
 * frame a random source (as xlgen_tx does) and tail-calls the receiver in
 * xlgen_next, and a run of n repeats is n packets from random sources,
 * timed by the kernel. XDP_ABORTED when the frame is not plain IPv4 or the
 * slot is empty. */
SEC("xdp")
int xlgen_spoof(struct xdp_md *ctx)
{
	if (gen_src_mask && xlgen_random_source(ctx))
		return XDP_ABORTED;
	bpf_tail_call(ctx, &xlgen_next, 0);
	return XDP_ABORTED;
}

/* The frame xlgen_resyn restores at each repeat (slot 0, set by the
 * loader): len bytes of b. */
struct xlgen_frame {
	__u32 len;
	__u8 b[XLGEN_FRAME_MAX];
};

/* One entry: the frame xlgen_resyn restores. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xlgen_frame);
} xlgen_frames SEC(".maps");

/* xlgen_resyn: a receiver that rewrites the frame, measured without a
 * syscall per packet. A SYN answered with a cookie becomes its SYN-ACK in
 * the buffer, so a repeat would see no SYN: this brings the buffer back to
 * the frame in xlgen_frames (its length, then its bytes) and tail-calls
 * the receiver in xlgen_next. XDP_ABORTED when the frame cannot be put
 * back or the slot is empty. */
SEC("xdp")
int xlgen_resyn(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct xlgen_frame *f = bpf_map_lookup_elem(&xlgen_frames, &zero);
	if (!f)
		return XDP_ABORTED;
	__u32 len = f->len;
	if (len < ETH_HLEN || len > XLGEN_FRAME_MAX)
		return XDP_ABORTED;
	int have = ctx->data_end - ctx->data;
	if (have != (int)len && bpf_xdp_adjust_tail(ctx, (int)len - have))
		return XDP_ABORTED;
	if (bpf_xdp_store_bytes(ctx, 0, f->b, len))
		return XDP_ABORTED;
	bpf_tail_call(ctx, &xlgen_next, 0);
	return XDP_ABORTED;
}

/* xlgen_clone: the sender where the kernel refuses live frames. Run by
 * BPF_PROG_TEST_RUN as a TC program on a thread inside gen_ifindex's
 * namespace (the kernel resolves the index there), it transmits
 * gen_clones copies of the skb out of gen_ifindex (bpf_clone_redirect: a
 * clone each, through the interface's transmit path, no socket). With
 * gen_queues, every copy goes to transmit queue CPU % gen_queues (a
 * recorded receive queue, which the kernel's queue choice follows when no
 * socket and no XPS map decide); a veth hands it to its peer's receive
 * queue of the same number. With gen_src_mask, each copy gets a random
 * source (IPv4 after an untagged Ethernet header, no UDP checksum; the IPv4
 * header checksum is updated). The skb itself is dropped: TC_ACT_SHOT,
 * or TC_ACT_UNSPEC when a copy could not be made or handed to the
 * interface (a copy the interface drops, its peer's ring full, counts as
 * sent: the interface counts the drop). */
SEC("tc")
int xlgen_clone(struct __sk_buff *skb)
{
	__u32 n = gen_clones, queues = gen_queues;
	if (queues)
		skb->queue_mapping = bpf_get_smp_processor_id() % queues + 1;
	for (__u32 i = 0; i < XLGEN_CLONES_MAX && i < n; i++) {
		if (gen_src_mask) {
			__u32 old;
			if (bpf_skb_load_bytes(skb, ETH_HLEN + 12, &old, 4))
				return TC_ACT_UNSPEC;
			__u32 src =
			    bpf_htonl(gen_src_base | (bpf_get_prandom_u32() & gen_src_mask));
			if (bpf_l3_csum_replace(skb, ETH_HLEN + 10, old, src, 4) ||
			    bpf_skb_store_bytes(skb, ETH_HLEN + 12, &src, 4, 0))
				return TC_ACT_UNSPEC;
		}
		/* > 0: the interface dropped the copy (NET_XMIT_DROP: its peer's
		 * ring is full), which it counts; < 0: no copy was sent. */
		if (bpf_clone_redirect(skb, gen_ifindex, 0) < 0)
			return TC_ACT_UNSPEC;
	}
	return TC_ACT_SHOT;
}

SEC("xdp")
int xlgen_drop(struct xdp_md *ctx)
{
	return XDP_DROP;
}

SEC("xdp")
int xlgen_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}
