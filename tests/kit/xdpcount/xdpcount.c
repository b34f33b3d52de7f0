// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//go:build ignore

/* xdpcount: a test program that counts the frames it sees and passes them
 * all. The end-to-end tests load it with xdp-loader (libxdp's dispatcher)
 * beside xlimit: its counter shows that it runs on the same traffic. Not
 * part of xlimit's product. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* xdpcount_pkts: the frames this program saw, one counter per CPU; pinned
 * by name (xdp-loader -p DIR) so that the test reads it. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xdpcount_pkts SEC(".maps");

/* libxdp's run configuration (its XDP_RUN_CONFIG macro, written out): run
 * at libxdp's default priority 50, and go on to the next program when this
 * one passes the frame. */
struct {
	__uint(priority, 50);
	__uint(XDP_PASS, 1);
} _xdpcount SEC(".xdp_run_config");

SEC("xdp")
int xdpcount(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&xdpcount_pkts, &zero);

	if (n)
		(*n)++;
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
