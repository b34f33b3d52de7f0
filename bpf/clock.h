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

/* xl_clock_ns without the call, for a global function at the bottom of
 * the deepest chain (xl_source_admit): a frame more there would pass the
 * 512 bytes of stack that 6.1 allows (its check counts the dead call
 * too), and that function's own paths are verified once anyway. */
static __always_inline __u64 xl_clock_ns_inline(void)
{
	if (xl_cfg_fake_clock) {
		__u32 zero = 0;
		__u64 *t = bpf_map_lookup_elem(&xl_clock, &zero);
		return t ? *t : 0;
	}
	return bpf_ktime_get_ns();
}

#ifdef XL_CLOCK_INLINE
/* A program whose deepest chain has no frame to spare (the TC cookie
 * program: xl_cookie_charge) reads the test clock inline. */
#define xl_clock_ns() xl_clock_ns_inline()
#else
/* The test clock's time. A global function: the verifier checks it once
 * and sees a number at each call, not the lookup's two outcomes, which
 * multiplied the states of every path that reads the time: with the
 * fragments decided whole, the fake clock's program passed the verifier's
 * million instructions where the real one took 672 929 (683 369 and
 * 682 704 with it). Never called in production: the branch is dead. */
__noinline __u64 xl_fake_clock_ns(void)
{
	__u32 zero = 0;
	__u64 *t = bpf_map_lookup_elem(&xl_clock, &zero);

	return t ? *t : 0;
}

static __always_inline __u64 xl_clock_ns(void)
{
	if (xl_cfg_fake_clock)
		return xl_fake_clock_ns();
	return bpf_ktime_get_ns();
}
#endif

/* The one place the program reads time. */
#define XL_NOW() xl_clock_ns()

/* The packet's time, read on first use: *now is 0 until then. */
static __always_inline __u64 xl_time(__u64 *now)
{
	if (!*now)
		*now = XL_NOW();
	return *now;
}

/* xl_time through xl_clock_ns_inline. */
static __always_inline __u64 xl_time_inline(__u64 *now)
{
	if (!*now)
		*now = xl_clock_ns_inline();
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
