/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Every map of the XDP program. Config maps are written by the daemon only,
 * state maps by the program only (docs/design.md section 2). All but the test
 * clock and the flood memo are pinned by name under <bpffs>/xlimit/<iface>/,
 * so a restarted daemon adopts them, buckets and counters included. */
#ifndef XLIMIT_MAPS_H
#define XLIMIT_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "types.h"

/* Config. Key 0: a count of reloads whose lowest bit is the active
 * generation (0 or 1), and XL_GEN_CONFIRM while a change waits for its
 * confirmation (xl_confirm). A one-entry array because it is read on every
 * packet (through gen.h only); the daemon flips it last, after writing the
 * other generation in full, which makes a reload atomic. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_gen SEC(".maps");

/* Config. Key 0: the change of rules waiting for its confirmation, read
 * only while xl_gen has XL_GEN_CONFIRM (gen.h): its deadline and the
 * generation to return to, so that the previous rules come back on time
 * with no daemon running. A one-entry array, as xl_gen. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xl_confirm_wait);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_confirm SEC(".maps");

/* Config. Key: generation. Value: masks and flags that do not depend on the
 * packet. Array: two fixed entries, O(1) lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_GENERATIONS);
	__type(key, __u32);
	__type(value, struct xl_globals);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_config SEC(".maps");

/* Config. Key: generation * 64 + slot. Value: the rule's flags, epoch and
 * static (fallback) bucket. Array: slots are dense and fixed. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_GENERATIONS *XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_rules SEC(".maps");

/* Config. Key: (generation << 17) | (proto << 16) | port for TCP and UDP.
 * Value: mask of the rules with that port. An array indexed by port costs
 * one bounds-checked load where a hash would cost a hash; 2 MiB in all. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_GENERATIONS *XL_PORT_PROTOS *XL_PORTS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_ports SEC(".maps");

/* Config. Key: generation + IPv4 source prefix. Value: allow/deny and the
 * rules whose sources contain it. LPM trie: longest-prefix match in one
 * lookup; the daemon folds enclosing prefixes into each entry. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 2 * 65536);
	__type(key, struct xl_lpm4_key);
	__type(value, struct xl_prefix);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_prefix4 SEC(".maps");

/* Config. As xl_prefix4, for IPv6 sources. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 2 * 65536);
	__type(key, struct xl_lpm6_key);
	__type(value, struct xl_prefix);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_prefix6 SEC(".maps");

/* Config. Key: (generation << 11) | (family << 10) | word, family 0 for
 * IPv4 and 1 for IPv6. Value: 64 bits of the generation's prefilter of
 * xl_prefix4 or xl_prefix6 (XL_PREFILTER_WORDS words a family): a bit is
 * set when some entry of the trie may contain a source with that bit (see
 * XL_PREFILTER_HASH; an IPv6 entry shorter than /32 sets every bit). A
 * clear bit: no prefix contains the source, and the trie is not looked
 * up. Array: one inlined load instead of a trie walk; 32 KiB. Read only
 * when the generation has XL_G_PREFILTER, which the daemon sets after
 * writing the bitmap. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_GENERATIONS * 2 * XL_PREFILTER_WORDS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_prefilter SEC(".maps");

/* Config. Key: slot. Value: the control loop's bucket with its deadline;
 * the rule's fallback applies once the deadline passes. Not generational:
 * the control loop owns it between reloads, and the epoch ties it to one
 * rule. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_limit);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_limits SEC(".maps");

/* State. Key: slot. Value: the rule's bucket (TAT) and the epoch it belongs
 * to. A shared array, not per-CPU: one bucket must admit at most its rate
 * whichever CPU the packet arrives on. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_bucket_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_buckets SEC(".maps");

/* State. Key: slot. Value: this CPU's token cache for the rule's bucket.
 * Per-CPU array: the common case (credit left, or the bucket known to be
 * empty) touches no shared cache line. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_cache);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_caches SEC(".maps");

/* State. Key 0: this CPU's memo of its last drop in a run, and the drops
 * the memo counted (flood.h). Per-CPU array, pinned: the counts are part
 * of every slot's counters and must outlive a program loaded anew (a memo
 * itself lives for one tick and names its generation). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xl_flood);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_flood SEC(".maps");

/* State. Key: slot. Value: this CPU's credit for the last source it
 * admitted for the slot's rule (source.h). Per-CPU array: a hot source
 * spends it without touching its shared bucket. Pinned as xl_caches is:
 * the credit is charged to the bucket already. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_src_credit);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_src_credits SEC(".maps");

/* Scratch. Key: 0. Value: xl_source_admit's key (per CPU: never shared,
 * never pinned), so that its frame stays within the stack 6.1 allows
 * xlimit_xdp's chain of calls. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xl_src_scratch);
} xl_src_scratch SEC(".maps");

/* State. Key: set (source.h, xl_src_sets). Value: that set's ways, each a
 * source prefix's bucket and drop count. Array: a lookup is two cache
 * lines, a source's two sets in one page; a source neither holds takes the
 * way that loses least (source.h, xl_src_locate), so a spoofed flood turns
 * ways over without an insert, a lock or a list, and the rule-wide bucket
 * holds regardless. BPF_F_MMAPABLE for its layout only (nothing maps it):
 * the kernel then starts the values on a page, so that 32 sets fill one
 * (an array's values otherwise start after its header, mid-page). The
 * daemon sets the size (source_table_size) before loading. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, XL_SRC_SETS);
	__type(key, __u32);
	__type(value, struct xl_src_set);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_src_table SEC(".maps");

/* State, a cache. Key: CPU * xl_cfg_srcf_lines + line (source.h,
 * xl_srcf_line). Value: that CPU's line of the per-source filter, entries
 * for sources its bucket refuses till a time (types.h, xl_srcf_line): a
 * spoofed flood's source seen again is dropped on one cache line of the
 * CPU's own, without a read of xl_src_table (a miss to memory) or an
 * atomic operation. Each CPU its own lines: plain stores, no line shared
 * between CPUs. Its entries match only under the seed, rule epoch and
 * units they were written under. The daemon sets the size (possible CPUs
 * * lines, dataplane.SrcFilterLines) before loading. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_SRCF_LINES);
	__type(key, __u32);
	__type(value, struct xl_srcf_line);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_src_filter SEC(".maps");

/* State. Key: set, as xl_src_table's. Value: its ways' rest of an IPv6
 * address beyond /64 and ban state, apart from the ways so that the
 * flood path does not read them. Sized and laid out as xl_src_table. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, XL_SRC_SETS);
	__type(key, __u32);
	__type(value, struct xl_src_ext_set);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_src_exts SEC(".maps");

/* State. Key: slot, or XL_GLOBAL_SLOT for packet-level verdicts. Value:
 * packets and bytes by verdict, packets by reason. Per-CPU: increments
 * never contend; readers sum over CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XL_COUNTER_SLOTS);
	__type(key, __u32);
	__type(value, struct xl_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_stats SEC(".maps");

/* State. Key: slot. Value: the connections in flight to the rule, counted
 * by the sock_ops program and read by the XDP program on each SYN of a rule
 * with a concurrency limit. A shared array: one count for all CPUs. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_MAX_RULES);
	__type(key, __u32);
	__type(value, struct xl_conns);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_conns SEC(".maps");

/* State. Socket storage: the rule a counted connection counts toward.
 * Freed with the socket; pinned so that a restarted daemon's program
 * still subtracts the connections counted before. */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct xl_sk_conn);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_sk_conns SEC(".maps");

/* State. Key: a fragmented datagram (source, destination, IP ID, and the
 * protocol for IPv4). Value: the port rules its first fragment matched,
 * its protocol, and whether a fragment of it was dropped. Only datagrams
 * whose first fragment met a port rule that takes fragments are here.
 * Later fragments carry no port: they are charged to these rules
 * (frag.h). LRU hash: a flood of such first fragments evicts the oldest
 * datagrams, whose later fragments then drop as orphans, instead of
 * failing inserts. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, XL_FRAG_ENTRIES);
	__type(key, struct xl_frag_key);
	__type(value, struct xl_frag);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_frags SEC(".maps");

/* State. Key: a hash of a fragmented datagram's xl_frag_key. Value: when
 * (ns, low byte cleared) a first fragment that met no port rule hashed
 * here, and its IP protocol in the low byte: the later fragments of such
 * datagrams pass (frag.h). An array, never evicted: a flood of first
 * fragments only marks more slots (and lets more orphans pass), it never
 * unmarks the slot of a datagram it does not name. Shared by the CPUs
 * (a datagram's fragments may reach several): plain stores, the last
 * wins. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, XL_FRAG_SEEN_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_frag_seen SEC(".maps");

/* Config, written by the daemon as the namespace's addresses change (it
 * watches them over netlink). Key: an address the host owns: every IPv4
 * and IPv6 address of every interface of the namespace, and the MAC of
 * the interface this program is attached to; with more than fit, those
 * the daemon picks (the attached interfaces' first) and the
 * XL_HOST_INCOMPLETE mark. Value: the interface that holds it. Hash: one
 * exact lookup answers "is this frame for us?"; not preallocated, so its
 * memory follows the addresses the host has. Read by the answering policy
 * (answer.h), which must answer only for the host's own addresses. Empty
 * until the daemon fills it: nothing is answered then. Trusted only while
 * the daemon's lease (XL_HOST_LEASE) has not ended: a map that no daemon
 * maintains leaves every SYN to the kernel (answer.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, XL_HOST_ADDRS_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct xl_host_key);
	__type(value, struct xl_host_addr);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_host_addrs SEC(".maps");

/* State. Key 0: the theoretical arrival time of the reset bucket of all
 * rules (xl_globals.reset), as xl_bucket_state.tat. A shared one-entry
 * array: one budget whichever CPU and rule a reset comes from. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} xl_reset_budget SEC(".maps");

/* Test only. Key 0: the time in ns that the program reads instead of the
 * clock when xl_cfg_fake_clock is set. Not pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} xl_clock SEC(".maps");

#endif /* XLIMIT_MAPS_H */
