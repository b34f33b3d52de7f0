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

#define ETH_HLEN 14
#define ETH_P_IP 0x0800

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
