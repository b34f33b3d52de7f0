// Package dataplane is the Go side of the XDP program's contract, free of
// any kernel dependency: the constants of bpf/types.h, the fixed-point
// bucket arithmetic, the compiled Plan that the maps package writes into the
// kernel, and a Go model of the whole program (parser, matcher, buckets)
// that tests run side by side with the kernel.
package dataplane

// Constants of bpf/types.h. maps/ checks them against the BTF of the
// compiled program, so a change on one side fails a test on the other.
const (
	MaxRules     = 64
	GlobalSlot   = MaxRules
	CounterSlots = MaxRules + 1
	Generations  = 2
	PortProtos   = 2
	Ports        = 65536
	TimeShift    = 6
	MultShift    = 16
	IPv6ExtMax   = 6
	NameLen      = 32
	VLANMax      = 2
	// FragEntries is how many fragmented datagrams the kernel follows at
	// once (xl_frags, an LRU).
	FragEntries = 8192
	// FragSeenSlots and FragSeenNS are types.h's XL_FRAG_SEEN_SLOTS and
	// XL_FRAG_SEEN_NS: the slots of xl_frag_seen, which marks datagrams
	// whose first fragment met no port rule, and how long a mark lasts.
	FragSeenSlots = 16384
	FragSeenNS    = 2_000_000_000
	// HostAddrsMax is how many entries xl_host_addrs holds (addresses, the
	// attached interface's MAC, the daemon's lease and, when not all fit,
	// the HostIncomplete mark): bpf/types.h XL_HOST_ADDRS_MAX.
	HostAddrsMax = 65536
	// BatchNS is how much time's worth of its rate a CPU's token cache
	// borrows from a rule's shared bucket at once (bucket.h).
	BatchNS = 50000
	// SkipDrops is how many drops a CPU's cache makes without reading the
	// clock after a read found its bucket empty, within one tick
	// (bucket.h, XL_SKIP_DROPS).
	SkipDrops = 1024
	// SkipMinTolNS: only a bucket whose tolerance exceeds a packet's cost
	// by this much grants SkipDrops (bucket.h, XL_SKIP_MIN_TOL_NS).
	SkipMinTolNS = 20000000
	// FakeTickShift: under the fake clock the tick is the time in units of
	// 2^FakeTickShift ns, plus 1 (clock.h, XL_FAKE_TICK_SHIFT).
	FakeTickShift = 22
)

// FakeTick is the tick of the fake clock at nowNS (clock.h, xl_tick): the
// model runs on the fake clock's time.
func FakeTick(nowNS uint64) uint64 { return nowNS>>FakeTickShift + 1 }

// Proto is a protocol class a rule matches (enum xl_proto).
type Proto uint8

const (
	ProtoTCP Proto = iota
	ProtoUDP
	ProtoICMP
	ProtoOther
	ProtoMax
)

var protoNames = [...]string{"tcp", "udp", "icmp", "other"}

func (p Proto) String() string {
	if int(p) < len(protoNames) {
		return protoNames[p]
	}
	return "invalid"
}

// Verdict is what happened to a packet (enum xl_verdict).
type Verdict uint8

const (
	VerdictPass Verdict = iota
	VerdictDrop
	VerdictWouldDrop
	VerdictMax
)

var verdictNames = [...]string{"pass", "drop", "would_drop"}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "invalid"
}

// Reason says why a packet got its verdict (enum xl_reason).
type Reason uint8

const (
	ReasonNoRule Reason = iota
	ReasonAllow
	ReasonAdmit
	ReasonNotIP
	ReasonDeny
	ReasonRule
	ReasonSource
	ReasonConcurrency
	ReasonBreaker
	ReasonFragment
	ReasonMalformedL2
	ReasonMalformedL3
	ReasonMalformedL4
	ReasonExtLimit
	ReasonFragOrphan
	ReasonNDInvalid
	ReasonVLANDepth
	ReasonCookie // answered with a SYN cookie (syncookie.h)
	ReasonMax
)

var reasonNames = [...]string{
	"no_rule", "allow", "admit", "not_ip", "deny", "rule", "source",
	"concurrency", "breaker", "fragment", "malformed_l2", "malformed_l3",
	"malformed_l4", "ext_limit", "fragment_orphan", "nd_invalid", "vlan_depth",
	"cookie",
}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "invalid"
}

// IsDrop reports whether the reason is one for which packets are dropped
// (or would be, in shadow mode), as opposed to passed.
func (r Reason) IsDrop() bool {
	switch r {
	case ReasonNoRule, ReasonAllow, ReasonAdmit, ReasonNotIP:
		return false
	}
	return true
}

// ResetOutcome is what became of a refused SYN's reset (enum
// xl_reset_outcome): sent, or why not. reset.h checks in this order and
// counts the first that fails.
type ResetOutcome uint8

const (
	ResetSent ResetOutcome = iota
	ResetUnsupported
	ResetNotUnicast
	ResetRuleBudget
	ResetNotLocal
	ResetGlobalBudget
	ResetMax
)

var resetNames = [...]string{"sent", "unsupported", "not_unicast", "rule_budget", "not_local", "global_budget"}

func (o ResetOutcome) String() string {
	if int(o) < len(resetNames) {
		return resetNames[o]
	}
	return "invalid"
}

// Host address kinds (enum xl_host_kind).
const (
	HostMAC  uint32 = 1
	HostIPv4 uint32 = 4
	HostIPv6 uint32 = 6
	// HostIncomplete is the kind of the mark (its address all zero) that
	// says xl_host_addrs does not list every address of the host: more
	// than it holds, or the addresses could not be read (reset.go).
	HostIncomplete uint32 = 0x10
	// HostLease is the kind of the daemon's lease on the map (its address
	// all zero, its value the lease's end in whole seconds of the
	// program's clock): the map is trusted only until then (reset.go,
	// HostAddrs.Maintained).
	HostLease uint32 = 0x11
)

// HostLeaseSeconds is how far ahead of the clock a daemon's lease on
// xl_host_addrs ends (bpf/types.h XL_HOST_LEASE_S): a daemon renews it
// every second, so a daemon killed without its exit hook stops vouching
// for the map at most this long after it died.
const HostLeaseSeconds = 5

// RuleDropReasons are the reasons for which a rule drops a packet (the
// other drop reasons are decided before any rule: deny, malformed).
var RuleDropReasons = []Reason{ReasonRule, ReasonSource, ReasonConcurrency, ReasonBreaker, ReasonFragment}

// Rule flags (enum xl_rule_flag).
const (
	RuleActive       uint32 = 1 << 0
	RuleShadow       uint32 = 1 << 1
	RuleBytes        uint32 = 1 << 2
	RuleFragDrop     uint32 = 1 << 3
	RulePerSource    uint32 = 1 << 4
	RuleBan          uint32 = 1 << 5
	RuleConcurrency  uint32 = 1 << 6
	RuleCookieAuto   uint32 = 1 << 7 // SYN cookies once the rule's rate is spent
	RuleCookieAlways uint32 = 1 << 8 // SYN cookies for every SYN of the rule
	RuleRefuseReset  uint32 = 1 << 9 // answer SYNs refused over the rate with a reset (refuse.h)
)

// Global flags (enum xl_global_flag).
const (
	GlobalMalformedPass uint32 = 1 << 0
	GlobalPrefixesV4    uint32 = 1 << 1
	GlobalPrefixesV6    uint32 = 1 << 2
	// GlobalPrefilter says that the generation's prefilter (Prefilter,
	// xl_prefilter) is written. The maps package sets it when it writes
	// one; a Plan never carries it.
	GlobalPrefilter uint32 = 1 << 3
)

// Prefix flags (enum xl_prefix_flag).
const (
	PrefixAllow uint32 = 1 << 0
	PrefixDeny  uint32 = 1 << 1
)

// FullFrame is one full-size Ethernet frame: 1500 bytes of IP plus the
// 14-byte Ethernet header.
const FullFrame = 1514
