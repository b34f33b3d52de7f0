/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Types shared by the XDP program and the Go daemon. bpf2go generates the Go
 * side of every struct and enum here (-type), so the layout has one source.
 * Every struct is padded by hand to a multiple of 8 bytes with no implicit
 * holes, so the C and Go layouts cannot drift. */
#ifndef XLIMIT_TYPES_H
#define XLIMIT_TYPES_H

#include <linux/types.h>

/* Rules live in 64 slots: a packet's matching rules are one 64-bit mask. */
#define XL_MAX_RULES 64
/* Counter slot for the final, packet-level verdict (not tied to one rule). */
#define XL_GLOBAL_SLOT	 XL_MAX_RULES
#define XL_COUNTER_SLOTS (XL_MAX_RULES + 1)
/* Config maps are double-buffered: generation 0 and 1, one of them active. */
#define XL_GENERATIONS 2
/* xl_gen's flag: a change of rules waits for its confirmation (xl_confirm);
 * past its deadline the programs use the generation it returns to. */
#define XL_GEN_CONFIRM (1u << 31)
/* Ports of TCP and UDP have a rule mask each, in one array per generation. */
#define XL_PORT_PROTOS 2
#define XL_PORTS       65536
/* Bucket time unit: 2^-6 ns. 2^64 units last 9.1 years of uptime, and the
 * bucket compares times by wrapping difference, so even that is no limit. */
#define XL_TIME_SHIFT 6
/* Bucket cost multiplier fraction bits: inc = (cost * mult) >> 16. */
#define XL_MULT_SHIFT 16
/* Longest IPv6 extension-header chain the parser walks. */
#define XL_IPV6_EXT_MAX 6
/* Datagrams whose fragments are followed at once (xl_frags). */
#define XL_FRAG_ENTRIES 8192
/* Slots of xl_frag_seen (a power of two), and how long a slot marks the
 * datagrams that hash to it as seen (frag.h). */
#define XL_FRAG_SEEN_SLOTS 16384
#define XL_FRAG_SEEN_NS	   (2ULL * 1000000000ULL)
/* Entries of xl_host_addrs: IPs of every interface of the namespace, the
 * MAC of the interface the program is attached to and, when not all fit,
 * the XL_HOST_INCOMPLETE mark. A Kubernetes node or a load balancer with
 * many VIPs has tens of thousands; a hash without preallocation, so the
 * memory follows the entries in use (docs/dataplane.md). */
#define XL_HOST_ADDRS_MAX 65536
/* How far ahead of its clock the daemon's lease on xl_host_addrs ends
 * (XL_HOST_LEASE), in seconds: a daemon killed without its exit hook
 * (SIGKILL, a crash) stops vouching for the map this long after its last
 * renewal. userspace/dataplane.HostLease. */
#define XL_HOST_LEASE_S 5
/* Rule name length, NUL included. */
#define XL_NAME_LEN 32
/* A CPU's token cache borrows at most this much time's worth of a rule's
 * rate from the shared bucket at once (and at most a quarter of the burst):
 * the bound on how far admission can run ahead, per CPU. */
#define XL_BATCH_NS 50000
/* A CPU that read the clock and found a rule's bucket empty drops at most
 * this many of the rule's next packets without reading it again, within
 * the same tick (bucket.h, xl_cache_empty): the bound on how late it sees
 * the bucket refill, in packets; the tick bounds it in time. */
#define XL_SKIP_DROPS 1024
/* ... and only for a bucket whose tolerance exceeds a packet's cost by at
 * least this much: more than a tick (10 ms at HZ=100) and its lateness,
 * so that a late take still finds the TAT ahead of now and loses nothing. */
#define XL_SKIP_MIN_TOL_NS 20000000ULL
/* The fake clock's tick (tests): 2^22 ns, about 4.2 ms, like HZ=250. */
#define XL_FAKE_TICK_SHIFT 22
/* The source prefilter (xl_prefilter): 65536 bits per generation and
 * family, in 64-bit words. IPv4 bit: the source's /16. IPv6 bit: the top
 * 32 bits of the source times XL_PREFILTER_HASH, the product's top 16 bits
 * (Fibonacci hashing: /32 allocations spread over the bits). */
#define XL_PREFILTER_WORDS 1024
#define XL_PREFILTER_HASH  0x9e3779b1u

/* Protocol classes a rule can match. TCP and UDP have ports. */
enum xl_proto {
	XL_PROTO_TCP = 0,
	XL_PROTO_UDP = 1,
	XL_PROTO_ICMP = 2, /* ICMP and ICMPv6 (neighbour discovery excepted) */
	XL_PROTO_OTHER = 3,
	XL_PROTO_MAX = 4,
};

enum xl_verdict {
	XL_VERDICT_PASS = 0,
	XL_VERDICT_DROP = 1,
	XL_VERDICT_WOULD_DROP = 2, /* shadow mode: counted as a drop, passed */
	XL_VERDICT_MAX = 3,
};

/* Why a packet got its verdict. Rule slots count the rule's own decision;
 * the global slot counts the packet's final verdict. */
enum xl_reason {
	XL_REASON_NO_RULE = 0,		/* pass: no rule matched */
	XL_REASON_ALLOW = 1,		/* pass: source allowlisted */
	XL_REASON_ADMIT = 2,		/* pass: every matching rule admitted it */
	XL_REASON_NOT_IP = 3,		/* pass: neither IPv4 nor IPv6 */
	XL_REASON_DENY = 4,		/* drop: source denylisted */
	XL_REASON_RULE = 5,		/* drop: the rule's bucket is empty */
	XL_REASON_SOURCE = 6,		/* drop: the per-source bucket is empty */
	XL_REASON_CONCURRENCY = 7,	/* drop: concurrency gate */
	XL_REASON_BREAKER = 8,		/* drop: circuit breaker open */
	XL_REASON_FRAGMENT = 9,		/* drop: `fragments: drop`, or rest of a dropped datagram */
	XL_REASON_MALFORMED_L2 = 10,	/* truncated Ethernet or VLAN header */
	XL_REASON_MALFORMED_L3 = 11,	/* truncated or invalid IPv4/IPv6 header */
	XL_REASON_MALFORMED_L4 = 12,	/* truncated or invalid TCP/UDP/ICMP header */
	XL_REASON_EXT_LIMIT = 13,	/* IPv6 extension chain over the bound */
	XL_REASON_FRAGMENT_ORPHAN = 14, /* drop: later fragment, its first one not seen */
	XL_REASON_ND_INVALID = 15,	/* neighbour discovery failing RFC 4861's checks */
	XL_REASON_VLAN_DEPTH = 16,	/* more than XL_VLAN_MAX VLAN tags */
	XL_REASON_COOKIE = 17,		/* drop: answered with a SYN cookie (syncookie.h) */
	XL_REASON_MAX = 18,
};

/* What became of a refused SYN's reset (xl_counters.resets, rule slots). */
enum xl_reset_outcome {
	XL_RESET_SENT = 0,
	XL_RESET_UNSUPPORTED = 1,   /* shape or flags (answer.h) */
	XL_RESET_NOT_UNICAST = 2,   /* a source never answered (answer.h) */
	XL_RESET_RULE_BUDGET = 3,   /* the rule's own reset bucket is empty */
	XL_RESET_NOT_LOCAL = 4,	    /* not to the host's MAC and address (answer.h) */
	XL_RESET_GLOBAL_BUDGET = 5, /* the reset bucket of all rules is empty */
	XL_RESET_MAX = 6,
};

/* Kinds of host address (xl_host_key.kind). */
enum xl_host_kind {
	XL_HOST_MAC = 1, /* the attached interface's MAC, in addr[0..5] */
	XL_HOST_IPV4 = 4,
	XL_HOST_IPV6 = 6,
	/* The mark (addr all zero) that the map does not list every address
	 * of the host: more than XL_HOST_ADDRS_MAX, or the daemon could not
	 * read them. No frame's lookup has this kind. */
	XL_HOST_INCOMPLETE = 0x10,
	/* The daemon's lease on the map (addr all zero): its value's ifindex
	 * holds the time, in whole seconds of the program's clock
	 * (bpf_ktime_get_ns), until which the map is known to be kept up to
	 * date. The daemon renews it every second (XL_HOST_LEASE_S ahead)
	 * after a full write, and removes it when it exits; a crashed daemon's
	 * lease runs out. Without a lease that has not ended the map is not
	 * trusted: no destination is known to be the host's (answer.h). No
	 * frame's lookup has this kind. */
	XL_HOST_LEASE = 0x11,
};

/* xl_rule.flags */
enum xl_rule_flag {
	XL_RULE_ACTIVE = 1 << 0,
	XL_RULE_SHADOW = 1 << 1,
	XL_RULE_BYTES = 1 << 2,		/* cost is the frame length, not 1 */
	XL_RULE_FRAG_DROP = 1 << 3,	/* drop non-first fragments outright */
	XL_RULE_PER_SOURCE = 1 << 4,	/* a bucket per source prefix too */
	XL_RULE_BAN = 1 << 5,		/* ban sources that stay over their limit */
	XL_RULE_CONCURRENCY = 1 << 6,	/* gate new connections on xl_conns */
	XL_RULE_COOKIE_AUTO = 1 << 7,	/* SYN cookies once the rule's rate is spent */
	XL_RULE_COOKIE_ALWAYS = 1 << 8, /* SYN cookies for every SYN of the rule */
	XL_RULE_REFUSE_RESET = 1 << 9,	/* answer SYNs over the rate with a reset (refuse.h) */
};

/* xl_globals.flags */
enum xl_global_flag {
	XL_G_MALFORMED_PASS = 1 << 0, /* malformed frames pass (default: drop) */
	XL_G_PREFIXES_V4 = 1 << 1,    /* the IPv4 prefix trie has entries */
	XL_G_PREFIXES_V6 = 1 << 2,    /* the IPv6 prefix trie has entries */
	/* The generation's prefilter (xl_prefilter) is written: a clear bit
	 * there means that no prefix of the trie contains the source. Without
	 * it (a generation written by a daemon from before the prefilter) every
	 * source is looked up. */
	XL_G_PREFILTER = 1 << 3,
};

/* xl_prefix.flags */
enum xl_prefix_flag {
	XL_PREFIX_ALLOW = 1 << 0,
	XL_PREFIX_DENY = 1 << 1,
};

/* A bucket's settings in fixed point. A packet of cost c (1, or its length
 * for byte rules) advances the bucket by inc = (c * mult + 2^15) >> 16 time
 * units; it conforms while the theoretical arrival time stays within tol
 * time units of now. mult is the emission interval in 2^-22 ns. */
struct xl_bucket {
	__u64 mult;
	__u64 tol;
};

/* One rule of one generation (config, written by the daemon only). */
struct xl_rule {
	char name[XL_NAME_LEN];
	__u32 flags; /* enum xl_rule_flag */
	/* Identity of the rule's state: bucket state written under another
	 * epoch belongs to an earlier rule in this slot and is reset. */
	__u32 epoch;
	/* The static rate from the rules file: in force whenever the control
	 * loop's limit is missing, stale or for another epoch (fail-static). */
	struct xl_bucket fallback;
	/* Each source prefix's bucket (XL_RULE_PER_SOURCE); always packets. */
	struct xl_bucket source;
	/* XL_RULE_BAN: a source over its limit for ban_after_ns is dropped
	 * for ban_ns, and again while it is still over when that ends. */
	__u64 ban_after_ns;
	__u64 ban_ns;
	__u8 prefix4; /* source aggregation: IPv4 prefix length */
	__u8 prefix6; /* source aggregation: IPv6 prefix length */
	__u16 _pad;
	/* XL_RULE_CONCURRENCY: with conc_max connections in flight (xl_conns)
	 * every new one is dropped; above conc_soft, with a probability rising
	 * linearly to 1 at conc_max. */
	__u32 conc_soft;
	__u32 conc_max;
	/* source.tol in 32 bits (bucket.h, xl_units_decode; xl_src_way.units),
	 * written by the daemon beside it: not computed per packet. */
	__u32 source_units;
};

/* The control loop's rate for a slot (config, written by the daemon only,
 * every control period). */
struct xl_limit {
	struct xl_bucket bucket;
	/* bpf_ktime_get_ns() time after which the fallback applies again. */
	__u64 deadline_ns;
	__u32 epoch; /* must equal xl_rule.epoch to apply */
	/* The circuit breaker's gate on new connections (TCP SYN without
	 * ACK): dropped with probability gate_drop / 2^32, all of them at
	 * XL_GATE_ALL, except that the first gate_probes SYNs of each
	 * gate_round pass an XL_GATE_ALL gate (half-open probes). */
	__u32 gate_drop;
	__u32 gate_probes;
	__u32 gate_round;
	/* The control loop's cap on the rule's connections in flight
	 * (xl_conns): a SYN is refused while the count is at or above it; 0:
	 * no cap. Written while the service is saturated, so that a fall of
	 * its service rate cannot grow the queue between two ticks
	 * (docs/control.md, "The setpoint and the in-flight cap"). */
	__u32 conc_cap;
	/* The control loop's cap on the rule's requests in flight
	 * (xl_requests, rules with signal response_time whose requests the
	 * daemon counts): a new request, on a new or a kept-alive
	 * connection, is refused while the count is at or above it, by a
	 * reset both ways (request.h, request_tc.h); 0: no cap. */
	__u32 req_cap;
};

#define XL_GATE_ALL 0xffffffffu

/* A change of rules waiting for its confirmation (config, written by the
 * daemon only; read while xl_gen has XL_GEN_CONFIRM, gen.h). */
struct xl_confirm_wait {
	/* bpf_ktime_get_ns() time from which the previous rules are back. */
	__u64 deadline_ns;
	__u32 gen; /* the generation they are in, untouched meanwhile */
	__u32 _pad;
};

/* Packet-independent settings of one generation (config). */
struct xl_globals {
	__u64 portless[XL_PROTO_MAX];	/* rules matching every packet of a class */
	__u64 frag_match[XL_PROTO_MAX]; /* rules that follow fragments: ported, TCP/UDP portless */
	__u64 syn_only;			/* rules matching only TCP SYN without ACK */
	__u64 src_filtered;		/* rules with a `sources` filter */
	__u64 concurrent;		/* rules with XL_RULE_CONCURRENCY */
	__u64 served;			/* rules whose handshakes are counted (xl_served) */
	__u64 resp_time;		/* rules with signal response_time (resptime.h) */
	/* The network namespace whose sockets xl_count_conns counts (the
	 * interface's): a cgroup's sockets may live in any namespace. */
	__u64 netns_cookie;
	/* The bucket of every reset sent, across rules (in packets): on top of
	 * each rule's own, it bounds what a spoofed SYN flood can reflect. */
	struct xl_bucket reset;
	__u32 flags; /* enum xl_global_flag */
	/* The per-source table's hash key (source.h, xl_src_hash): random,
	 * kept across reloads and restarts. */
	__u32 src_seed;
};

/* The trie value for a source prefix: allow/deny plus the rules whose
 * `sources` contain it (the daemon folds enclosing prefixes in, so one
 * longest-prefix lookup answers every list). */
struct xl_prefix {
	__u64 rules;
	__u32 flags; /* enum xl_prefix_flag */
	__u32 _pad;
};

/* Trie keys. The generation is part of the key, so both generations share
 * one trie: prefixlen counts the 32 generation bits plus the prefix. */
struct xl_lpm4_key {
	__u32 prefixlen;
	__u32 gen;
	__u8 addr[4];
};

struct xl_lpm6_key {
	__u32 prefixlen;
	__u32 gen;
	__u8 addr[16];
};

/* A CPU's cache of tokens already charged to a rule's shared bucket
 * (state, per-CPU). While it holds credit, packets pass without touching
 * shared memory; while the shared bucket is known to be empty (until
 * retry_ns), packets drop without touching it either, and up to skip of
 * them without reading the clock while the tick is the one of its last
 * read (bucket.h, xl_cache_empty). */
struct xl_cache {
	__u64 credit;	/* time units charged but not yet spent */
	__u64 retry_ns; /* no room in the shared bucket before this time */
	__u64 mult;	/* the bucket settings the cache was filled under */
	__u64 tol;
	__u64 fresh_ns; /* this CPU's last clock read for the slot */
	__u64 tick;	/* the tick (jiffies) of that read; 0: none yet */
	__u32 epoch;
	__u32 skip; /* drops left without a clock read (at most XL_SKIP_DROPS) */
};

/* A count of the flood memo's drops for one slot. */
struct xl_flood_count {
	__u64 packets;
	__u64 bytes;
};

/* This CPU's memo of the last packet a rule dropped in a run of drops
 * without clock reads (flood.h), and the count of what it dropped. A
 * packet of the same generation that matches the same rules, in the same
 * tick, is the same rule's drop while the run the memo took over from the
 * rule's cache has drops left. */
struct xl_flood {
	__u64 mask; /* the rules the packet matched; 0: no memo */
	__u64 tick; /* the tick of the run's clock read */
	__u32 gen;  /* xl_gen's value as it applies (gen.h): every reload changes it */
	__u32 left; /* drops left in the run (at most XL_SKIP_DROPS) */
	__u8 slot;  /* the rule that dropped it: mask's lowest bit */
	__u8 syn;   /* the packet was a TCP SYN without ACK */
	__u8 _pad[6];
	/* The memo's drops by slot, for the rate (XL_REASON_RULE). Never
	 * reset: readers add them to the slot's and the global slot's
	 * counters (maps.Tables.Counters), so each stays monotonic. */
	struct xl_flood_count counts[XL_MAX_RULES];
};

/* Key of a source's bucket: the rule's slot and the source address masked
 * to the rule's prefix length. */
struct xl_source_key {
	__u32 slot;
	__u8 family; /* 4 or 6 */
	__u8 prefixlen;
	__u16 _pad;
	__u8 addr[16];
};

/* A CPU's credit for the source it last admitted for a rule (state,
 * per-CPU, per slot): time units charged to that source's bucket and not
 * yet spent, as xl_cache is to a rule's bucket (source.h). */
struct xl_src_credit {
	struct xl_source_key key; /* the source; credit 0: none held */
	__u64 credit;
	__u64 mult; /* the source bucket settings it was charged under */
	__u64 tol;
	__u32 epoch; /* the rule's */
	__u32 _pad;
};

/* The per-source table (state, source.h): sets of XL_SRC_WAYS ways, a
 * set picked by a keyed hash of the source's key, every way one source's
 * bucket. 32-byte ways, so a set is two cache lines of one page: a
 * lookup touches them and nothing else (the LRU hash it replaces chased
 * a bucket list into elements 112 bytes apart: issue 28). */
#define XL_SRC_WAYS 4
/* Sets by default (dataplane.DefaultSourceTableSize / XL_SRC_WAYS); the
 * loader sets xl_cfg_src_sets to the table's, a power of two. */
#define XL_SRC_SETS 16384
/* xl_src_way.meta: the source is banned (XL_RULE_BAN): a way to keep
 * when its set needs room. */
#define XL_SRC_BANNED 0x80000000u

struct xl_src_way {
	/* The first 8 bytes of the key's masked address: all of IPv4's, and
	 * of IPv6 to /64 (longer prefixes keep the rest in xl_src_exts). */
	__u64 addr;
	/* slot << 16 | family << 8 | prefix length, | XL_SRC_BANNED; 0: empty */
	__u32 meta;
	/* As xl_bucket_state.units (xl_rule.source's tol), in 32 bits
	 * (bucket.h, xl_units_decode). */
	__u32 units;
	__u64 tat;   /* as xl_bucket_state.tat */
	__u32 epoch; /* the rule's */
	__u32 drops; /* packets dropped for this source, saturating */
};

struct xl_src_set {
	struct xl_src_way way[XL_SRC_WAYS];
};

/* A way's rarely used part, in a table of its own (xl_src_exts), so that
 * the flood path never touches it: the rest of an IPv6 address beyond
 * /64, and a ban rule's state. The address part is valid for way w when
 * meta is w's (without XL_SRC_BANNED) and addr is the key's rest (for a
 * prefix to /64: w's addr again); the ban fields when epoch is w's too. */
struct xl_src_ext {
	__u64 addr;
	__u64 over_since_ns;   /* start of the current over-limit run, or 0 */
	__u64 banned_until_ns; /* banned while now is before this */
	__u32 meta;
	__u32 epoch;
};

struct xl_src_ext_set {
	struct xl_src_ext ext[XL_SRC_WAYS];
};

/* The per-source filter (state, source.h, xl_srcf_*): in front of
 * xl_src_table, each CPU's own lines of XL_SRCF_WAYS entries, a line
 * picked by the source's set hash. An entry remembers a source refused at
 * the table till when its bucket refuses it anyway:
 *   fingerprint (32 bits, never 0) << 32 | till (24 bits) << 8 | count,
 * till in units of 2^XL_SRCF_SHIFT ns, count the packets it refused since
 * (folded into the way's drops when the source next reaches the table).
 * 0: empty. The line's stamp is the time of its last write, when every
 * entry that refused no more was marked so (till: then), so that a till
 * is never read more than XL_SRCF_MAX_WAIT from its writing and its 24
 * bits are never ambiguous. */
#define XL_SRCF_WAYS 7
/* Lines per CPU by default (the loader sets xl_cfg_srcf_lines). */
#define XL_SRCF_LINES 8192
#define XL_SRCF_SHIFT 20
/* The longest wait an entry holds, in its units (73 minutes; longer waits
 * are cut to it: the source reaches the table sooner, no harm done). A
 * till wraps every 2^24 units (4.9 hours): the line's stamp keeps it from
 * being read that late. */
#define XL_SRCF_MAX_WAIT    (1u << 22)
#define XL_SRCF_MAX_WAIT_NS ((__u64)XL_SRCF_MAX_WAIT << XL_SRCF_SHIFT)
/* An entry's count stops here: its next packet goes to the table. */
#define XL_SRCF_COUNT_MAX 0xffu

struct xl_srcf_line {
	__u64 stamp_ns; /* its last write; a line older than XL_SRCF_MAX_WAIT_NS holds no live entry
			 */
	__u64 e[XL_SRCF_WAYS];
};

/* Where a source's way is, or goes (source.h, xl_src_locate): its sets,
 * the lookups' keys, and the way; and the best way to take so far. */
struct xl_src_place {
	__u32 set[2]; /* its first and second set; set[0] the one it is in */
	__u32 way;
	__u32 owed;   /* ways owing in the set of the best way so far */
	__u32 chosen; /* that set */
	__u32 _pad;
	__s64 best; /* what the best way's source owes */
};

/* xl_source_admit's scratch (per CPU): the packet's source key and the
 * lookups' keys, off the stack that 6.1 allows a chain of calls (512
 * bytes). */
struct xl_src_scratch {
	struct xl_source_key key;
	struct xl_src_place pl;	 /* the key's place */
	struct xl_src_place cpl; /* that of the source a credit returns to */
	__u32 gen;		 /* the generation whose seed is read */
	__u32 refilled;		 /* the source's bucket was full before the packet */
	__u32 same;		 /* the CPU's credit is the source's */
	__u32 seed;		 /* the table's hash key */
	__u32 hash;		 /* the key's hash under it (xl_src_hash) */
	__u32 fline;		 /* the source's line of xl_src_filter, or ~0: none */
	__u32 fp;		 /* its fingerprint there */
	__s32 fway;		 /* its entry in that line, or -1 */
	__u32 fcarry;		 /* that entry's count, for the way's drops */
	__u64 fnext_ns;		 /* a ban rule's next change of state (0: none) */
	__u64 held;		 /* a refused source's credit on this CPU */
};

/* Bucket state (state, written by the XDP program only). */
struct xl_bucket_state {
	__u64 tat; /* theoretical arrival time, 2^-6 ns, wrapping */
	/* The tolerance (xl_bucket.tol) tat and reset_tat were written under:
	 * settings with another one rescale them first, keeping how full the
	 * bucket is (bucket.h, xl_units_claim). 0: unknown (state of an
	 * xlimit from before the field), taken as the settings in force. */
	__u64 units;
	__u32 epoch;
	__u32 _pad;
	/* Half-open probes: gate_round << 32 | SYNs of that round let through. */
	__u64 probes;
	/* The bucket of the resets answering refused SYNs: the rule's rate,
	 * charged separately (as tat). */
	__u64 reset_tat;
	/* 48 bytes: tat and units share a cache line in every slot. */
	__u64 _pad2;
};

/* Connections in flight to a rule (state, written by the sock_ops program
 * only): passively established and not yet closed by the service. */
struct xl_conns {
	__s64 count;
	__u32 epoch; /* the rule the count belongs to */
	__u32 _pad;
};

/* What a counted socket remembers (socket storage): the rule it counts
 * toward, so that its close is subtracted once and from the same rule. */
struct xl_sk_conn {
	__u32 slot;
	__u32 epoch;
};

/* Key of a datagram's fragments (xl_frags): what Linux reassembles a
 * datagram by. IPv4: (source, destination, protocol, IP ID), as RFC 791
 * and ip_fragment.c. IPv6: (source, destination, fragment ID) alone, as
 * RFC 8200 and reassembly.c: a later fragment's own Next Header is never
 * read by the receiver (it takes the first fragment's), so it keys and
 * decides nothing here either (proto 0). IPv4 addresses in the first 4
 * bytes. */
struct xl_frag_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__u32 id; /* IPv4 identification, or the IPv6 fragment header's */
	__u8 family;
	__u8 proto; /* the IP protocol (IPv4), 0 (IPv6) */
	__u16 _pad;
};

/* What the first fragment of a datagram decided for the rest (state). */
struct xl_frag {
	__u64 rules;   /* port rules that take fragments, matched it, charge each fragment */
	__u64 whole;   /* port rules that charged the whole datagram at its first and admitted it */
	__u32 dropped; /* slot + 1 of the rule that dropped a fragment, or 0 */
	__s32 bytes;   /* whole: frame bytes its later fragments may still bring */
	__s32 frags;   /* whole: later fragments it may still have */
	__u8 l4;       /* the IP protocol of its first fragment (IPv6 later ones take it) */
	__u8 _pad[3];
};

/* Key of a host address (xl_host_addrs). IPv4 in the first 4 bytes. */
struct xl_host_key {
	__u32 kind; /* enum xl_host_kind */
	__u8 addr[16];
	__u32 _pad;
};

/* A host address (config, written by the daemon as addresses change). */
struct xl_host_addr {
	__u32 ifindex; /* the interface that holds it (XL_HOST_LEASE: the lease's end, s) */
	__u32 _pad;
};

/* Per-CPU counters of one slot (state). */
struct xl_counters {
	__u64 packets[XL_VERDICT_MAX];
	__u64 bytes[XL_VERDICT_MAX];
	__u64 reasons[XL_REASON_MAX];
	__u64 resets[XL_RESET_MAX]; /* refused SYNs by enum xl_reset_outcome */
};

#endif /* XLIMIT_TYPES_H */
