/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Fast refusal (`refuse: reset`): a SYN that a rule refuses because its
 * rate is spent (the rule's bucket or its source's) is answered with a TCP
 * reset, through the one reset path of reset.h, so that the rule's and
 * the host's reset budgets and the host-address checks apply to it as to
 * the gates' refusals. The default, `refuse: drop`, answers nothing: a
 * reset goes to the SYN's source, which a flood spoofs
 * (docs/dataplane.md, "Fast refusal"). */
#ifndef XLIMIT_REFUSE_H
#define XLIMIT_REFUSE_H

#include <linux/bpf.h>

#include "bucket.h"
#include "parse.h"
#include "reset.h"
#include "types.h"

/* Whether the SYN that rule r (slot of generation gen, bucket state st)
 * refused over its rate is to be answered with a reset; counts the
 * outcome (xl_reset_decide). b is the bucket in force for the packet and
 * inc its cost in it. Rules without XL_RULE_REFUSE_RESET pay one flag test
 * on their drops. */
static __always_inline int xl_refuse_reset(struct xdp_md *ctx, __u32 gen, __u32 slot,
					   const struct xl_rule *r, const struct xl_pkt *pkt,
					   struct xl_bucket_state *st, const struct xl_bucket *b,
					   __u64 inc, __u64 *now)
{
	if (!(r->flags & XL_RULE_REFUSE_RESET) || (r->flags & XL_RULE_SHADOW) || !pkt->syn)
		return 0;
	return xl_reset_decide(ctx, gen, slot, pkt, st, b, inc, now) == XL_RESET_SENT;
}

#endif /* XLIMIT_REFUSE_H */
