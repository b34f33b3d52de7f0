/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The generation in force, for every program (XDP, TC, sock_ops): xl_gen,
 * unless a change of rules waits for its confirmation (XL_GEN_CONFIRM) and
 * its deadline has passed, in which case the generation it returns to.
 * The daemon never writes that generation while the change waits, so the
 * previous rules come back on time whether a daemon runs or not, as the
 * static rates come back when the control loop's deadlines pass. Only a
 * pending confirmation costs anything: one more lookup and a clock read. */
#ifndef XLIMIT_GEN_H
#define XLIMIT_GEN_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "clock.h"
#include "maps.h"
#include "types.h"

/* No generation: xl_gen could not be read. */
#define XL_GEN_NONE (1ULL << 32)

/* xl_gen's value as it applies now: its lowest bit is the generation in
 * force; it differs from the stored value once a deadline has passed (the
 * flood memo, which holds it, is then void), or XL_GEN_NONE. zero points
 * to a key 0 of the caller's. */
static __always_inline __u64 xl_gen_word(const __u32 *zero)
{
	__u32 *active = bpf_map_lookup_elem(&xl_gen, zero);
	if (!active)
		return XL_GEN_NONE;
	__u32 v = *active;
	if (v & XL_GEN_CONFIRM) {
		struct xl_confirm_wait *c = bpf_map_lookup_elem(&xl_confirm, zero);
		if (c && XL_NOW() >= c->deadline_ns)
			v = (v & ~(XL_GEN_CONFIRM | 1u)) | (c->gen & 1u);
	}
	return v;
}

#endif /* XLIMIT_GEN_H */
