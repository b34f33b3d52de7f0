// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* xdp_dispatcher: an XDP program that runs up to ten component programs in
 * turn, in libxdp's multi-program dispatcher protocol, version 2
 * (xdp-tools' lib/libxdp/protocol.org). xlimit attaches through it when it
 * shares an interface with other XDP programs (loader/share.go): xdp-loader,
 * xdp-filter and any libxdp user read this dispatcher, add their programs to
 * it and remove them, and xlimit does the same with theirs. Each component
 * is an freplace (BPF_PROG_TYPE_EXT) program that takes the place of one of
 * the stubs prog0..prog9; conf, filled in before the load, says how many
 * run and which of their return codes go on to the next one.
 *
 * The names are the protocol: the program is xdp_dispatcher, the stubs
 * prog0..prog9, its one map the .rodata holding conf, whose layout is
 * struct xdp_dispatcher_config below. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define XDP_DISPATCHER_VERSION 2
#define XDP_DISPATCHER_MAGIC   236
/* What a stub returns: always a chain action, so that a slot whose program
 * went away passes the frame on. */
#define XDP_DISPATCHER_RETVAL  31
#define MAX_DISPATCHER_ACTIONS 10

struct xdp_dispatcher_config {
	__u8 magic;		 /* XDP_DISPATCHER_MAGIC */
	__u8 dispatcher_version; /* XDP_DISPATCHER_VERSION */
	__u8 num_progs_enabled;	 /* slots in use, from prog0 */
	__u8 is_xdp_frags;	 /* loaded with BPF_F_XDP_HAS_FRAGS */
	/* per slot: the bit 1 << action is set for each return code that runs
	 * the next slot (XDP_DISPATCHER_RETVAL's bit always) */
	__u32 chain_call_actions[MAX_DISPATCHER_ACTIONS];
	/* per slot: the run priority, lowest first */
	__u32 run_prios[MAX_DISPATCHER_ACTIONS];
	/* per slot: BPF_F_XDP_HAS_FRAGS if the component was loaded with it */
	__u32 program_flags[MAX_DISPATCHER_ACTIONS];
};

/* conf: const, so that it lands in .rodata, frozen at load and read by the
 * verifier (the unused slots are dead code); volatile, so that the compiler
 * keeps the reads of values written just before the load. */
volatile const struct xdp_dispatcher_config conf = {};

/* The stubs: global (an freplace program replaces only global functions),
 * never inlined, returning XDP_DISPATCHER_RETVAL through a volatile so the
 * caller's check is not folded away. The no-op bpf_xdp_adjust_tail makes
 * the stub one that may change the packet's data, which the kernel requires
 * of the function that a program doing so (xlimit's answers) replaces. */
#define XL_STUB(n)                                                                                 \
	__attribute__((noinline)) int prog##n(struct xdp_md *ctx)                                  \
	{                                                                                          \
		volatile int ret = XDP_DISPATCHER_RETVAL;                                          \
                                                                                                   \
		if (!ctx)                                                                          \
			return XDP_ABORTED;                                                        \
		bpf_xdp_adjust_tail(ctx, 0);                                                       \
		return ret;                                                                        \
	}

XL_STUB(0)
XL_STUB(1)
XL_STUB(2)
XL_STUB(3)
XL_STUB(4)
XL_STUB(5)
XL_STUB(6)
XL_STUB(7)
XL_STUB(8)
XL_STUB(9)

/* Runs slot n if it is in use, and returns unless its verdict chains. */
#define XL_SLOT(n)                                                                                 \
	if (num < n + 1)                                                                           \
		goto out;                                                                          \
	ret = prog##n(ctx);                                                                        \
	if (!((1U << ret) & conf.chain_call_actions[n]))                                           \
		return ret;

SEC("xdp")
int xdp_dispatcher(struct xdp_md *ctx)
{
	__u8 num = conf.num_progs_enabled;
	int ret;

	XL_SLOT(0)
	XL_SLOT(1)
	XL_SLOT(2)
	XL_SLOT(3)
	XL_SLOT(4)
	XL_SLOT(5)
	XL_SLOT(6)
	XL_SLOT(7)
	XL_SLOT(8)
	XL_SLOT(9)
out:
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
