/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The program's time: bpf_ktime_get_ns(), or the test clock (xl_clock)
 * when the loader sets xl_cfg_fake_clock. A packet reads it at most once,
 * on first need: the common cases (credit left in the CPU's cache, or a
 * bucket this CPU found empty within the tick) never read it. */
#ifndef XLIMIT_CLOCK_H
#define XLIMIT_CLOCK_H

#include <linux/types.h>
#include <bpf/bpf_helpers.h>

#include "maps.h"
#include "types.h"

/* Load-time switch for tests: read the time from xl_clock instead of the
 * clock. Zero in production, where the verifier prunes the map read. */
volatile const __u32 xl_cfg_fake_clock = 0;

static __always_inline __u64 xl_clock_ns(void)
{
	if (xl_cfg_fake_clock) {
		__u32 zero = 0;
		__u64 *t = bpf_map_lookup_elem(&xl_clock, &zero);
		return t ? *t : 0;
	}
	return bpf_ktime_get_ns();
}

/* The one place the program reads time. */
#define XL_NOW() xl_clock_ns()

/* The packet's time, read on first use: *now is 0 until then. */
static __always_inline __u64 xl_time(__u64 *now)
{
	if (!*now)
		*now = XL_NOW();
	return *now;
}

/* The tick: bpf_jiffies64(), which the verifier inlines into one load
 * (BenchmarkClock: free, where bpf_ktime_get_ns costs ~31 ns and
 * bpf_ktime_get_coarse_ns ~15 ns on a VM). Under the fake clock, its time
 * in units of 2^XL_FAKE_TICK_SHIFT ns, plus 1 so that it is never 0. */
static __always_inline __u64 xl_tick(void)
{
	if (xl_cfg_fake_clock)
		return (xl_clock_ns() >> XL_FAKE_TICK_SHIFT) + 1;
	return bpf_jiffies64();
}

#endif /* XLIMIT_CLOCK_H */
