// Package config defines xlimit's rules file: its schema, strict YAML
// decoding, defaults and validation.
//
// Parse decodes a document through yaml.Node so that every value keeps its
// line, rejects unknown and duplicate keys and values of the wrong type,
// fills in defaults and checks every limit the data plane relies on. It
// reports all problems at once, each as an *Error whose text reads
// "FILE:LINE: field: problem". A *Config returned without error is complete:
// defaults are filled in, the section that the rule's behavior uses is
// non-nil, and sections that the behavior does not use are nil.
//
// docs/config.md is the reference for users; keep it in step with this
// package.
package config

import (
	"cmp"
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Limits and defaults of the rules file.
const (
	// MaxRules is the number of rule slots in the kernel's rule table.
	MaxRules = dataplane.MaxRules
	// MaxRuleNameLen is the longest rule name; names are metric labels and
	// are stored in a fixed-size field of the rule table.
	MaxRuleNameLen = 31

	DefaultSourceTableSize = dataplane.DefaultSourceTableSize
	MaxSourceTableSize     = dataplane.MaxSourceTableSize

	// Rates, per second. Outside these bounds the kernel's fixed-point
	// arithmetic could lose precision or overflow.
	MinPacketRate = 0.001
	MaxPacketRate = 1e8
	MinByteRate   = 16
	MaxByteRate   = 1.25e10

	// MaxBurstSeconds bounds EffectiveBurst/Rate: no bucket may hold more
	// than a day of traffic.
	MaxBurstSeconds = 86400
	// MinByteBurst: a byte bucket smaller than one full-size frame can
	// never admit such a frame.
	MinByteBurst = dataplane.FullFrame
	// DefaultByteBurst is the smallest default burst of a byte bucket.
	DefaultByteBurst = 65535

	DefaultColdFactor      = 3.0
	DefaultMaxQueueingTime = 500 * time.Millisecond
	DefaultKA              = 50.0
	DefaultKM              = 0.5
	DefaultGamma           = 0.5
	DefaultAlpha           = 0.2
	DefaultCPUHigh         = 0.8
	DefaultErrorThreshold  = 0.05
	DefaultProbeInterval   = time.Second
	DefaultProbeTimeout    = 500 * time.Millisecond
	DefaultProbePath       = "/"
	DefaultPrefixV4        = 32
	DefaultPrefixV6        = 64
	DefaultMinRequests     = 5
	DefaultBreakerWindow   = time.Second
	DefaultRetryTimeout    = 10 * time.Second
	DefaultHalfOpenProbes  = 1
	MaxConcurrency         = math.MaxInt32
	MaxInterfaceNameLen    = 15 // IFNAMSIZ - 1
)

// Verdict is what the data plane does with a class of packets.
type Verdict string

const (
	VerdictDrop Verdict = "drop"
	VerdictPass Verdict = "pass"
)

// Protocol is the L4 protocol a rule matches.
type Protocol string

const (
	ProtoTCP  Protocol = "tcp"
	ProtoUDP  Protocol = "udp"
	ProtoICMP Protocol = "icmp" // ICMP and ICMPv6
	ProtoAny  Protocol = "any"
)

// Unit is what a rule's bucket counts.
type Unit string

const (
	UnitPackets Unit = "packets"
	UnitBytes   Unit = "bytes"
)

// Behavior is a rule's control behaviour (docs/design.md §5).
type Behavior string

const (
	BehaviorReject      Behavior = "reject"
	BehaviorWarmUp      Behavior = "warm_up"
	BehaviorPaced       Behavior = "paced"
	BehaviorWarmUpPaced Behavior = "warm_up_paced"
	BehaviorAdaptive    Behavior = "adaptive"
)

// WarmsUp reports whether b uses the warm_up section.
func (b Behavior) WarmsUp() bool { return b == BehaviorWarmUp || b == BehaviorWarmUpPaced }

// IsPaced reports whether b uses the paced section.
func (b Behavior) IsPaced() bool { return b == BehaviorPaced || b == BehaviorWarmUpPaced }

// Queue is where a paced rule's traffic waits.
type Queue string

const (
	QueueNone   Queue = "none"   // XDP bucket only: burst = rate × max_queueing_time
	QueueKernel Queue = "kernel" // TC ingress redirect to an IFB device with a TBF qdisc
)

// Signal is where an adaptive rule's latency comes from.
type Signal string

const (
	SignalAcceptQueue Signal = "accept_queue"
	SignalProbe       Signal = "probe"
	SignalFeedback    Signal = "feedback"
	// SignalSocketQueue: the receive queues and drops of a UDP service's
	// sockets (sock_diag), for protocol udp.
	SignalSocketQueue Signal = "socket_queue"
	// SignalResponseTime: the service's response time measured on the
	// wire (XDP stamps a request, TC egress times the response's first
	// byte), for protocol tcp; needs TCX (Linux 6.6).
	SignalResponseTime Signal = "response_time"
)

// Refuse is how a rule answers the new connections (TCP SYNs) it refuses
// over its rate.
type Refuse string

const (
	// RefuseDrop, the default (also ""): drop them unanswered, safe
	// against spoofed sources.
	RefuseDrop Refuse = "drop"
	// RefuseReset: answer them with a TCP reset within the rule's and the
	// host's reset budgets, so that clients fail at once.
	RefuseReset Refuse = "reset"
)

// Law is the control law of an adaptive rule.
type Law string

const (
	// LawTrack tracks the service rate the signal measures and holds the
	// queueing delay at the target (docs/control.md); the default.
	LawTrack Law = "track"
	// LawAIMD is docs/design.md §5.4's AIMD on the smoothed latency.
	LawAIMD Law = "aimd"
)

// ProbeKind is the kind of an active probe.
type ProbeKind string

const (
	ProbeTCP  ProbeKind = "tcp"  // TCP connect latency
	ProbeHTTP ProbeKind = "http" // HTTP GET latency
)

// FragmentPolicy is what a rule with ports does with non-first IP
// fragments, which carry no L4 header and so no port. A TCP or UDP rule
// without ports takes limit (the default: it follows its fragments as a
// port rule does) or ignore (it charges each fragment as it comes, as any
// packet).
type FragmentPolicy string

const (
	// The rule does not match later fragments: they pass it unlimited (a
	// bypass, for a service that must never lose a datagram to an orphan).
	FragmentsIgnore FragmentPolicy = "ignore"
	// The default: later fragments take the rule of their datagram's
	// first fragment and count against its buckets.
	FragmentsLimit FragmentPolicy = "limit"
	// Fragmented datagrams to the rule's ports are dropped, every fragment.
	FragmentsDrop FragmentPolicy = "drop"
)

// Config is a decoded and validated rules file.
type Config struct {
	// Interfaces to attach to; --iface on the command line overrides it.
	Interfaces []string
	// Allow and Deny hold canonical (masked) prefixes, in file order. A
	// bare address is a /32 or /128.
	Allow, Deny []netip.Prefix
	// Malformed is the verdict for malformed or truncated frames.
	Malformed Verdict
	// SourceTableSize is the number of per-source buckets (bpf/source.h's
	// table, rounded up to a power of two).
	SourceTableSize int
	Rules           []Rule
	// System is the host-wide protection, nil when absent.
	System *System
	// SynCookies are the host-wide settings of SYN cookies (syncookies.go);
	// nil when absent (the defaults).
	SynCookies *SynCookies
	// Resets is the host's budget of TCP resets (resets.go); nil when
	// absent (the defaults).
	Resets *Resets
	// Management is what no rule may throttle (management.go); nil when
	// absent.
	Management *Management
	// Warnings are problems that do not make the file invalid, such as a
	// section that the rule's behavior does not use. They have the same
	// form as errors; `xlimit check` prints them.
	Warnings []*Error
}

// Rule is one entry of the rules list.
type Rule struct {
	Name     string
	Protocol Protocol
	// Ports as written in the file (each item one range); empty means every
	// port. MergedPorts gives the sorted, merged set.
	Ports   []dataplane.PortRange
	SynOnly bool
	// Sources is the optional source filter (canonical prefixes); empty
	// means every source.
	Sources []netip.Prefix
	Unit    Unit
	// Rate per second: packets, bytes, or new connections with SynOnly.
	Rate float64
	// Burst as written, 0 when not given; see EffectiveBurst.
	Burst          float64
	Behavior       Behavior
	WarmUp         *WarmUp         // non-nil iff Behavior.WarmsUp()
	Paced          *Paced          // non-nil iff Behavior.IsPaced()
	Adaptive       *Adaptive       // non-nil iff Behavior == BehaviorAdaptive
	PerSource      *PerSource      // nil when absent
	Concurrency    *Concurrency    // nil when absent
	CircuitBreaker *CircuitBreaker // nil when absent
	Fleet          *Fleet          // nil when absent (docs/fleet.md)
	Shadow         bool
	// SynCookies: off (""), auto or always (docs/dataplane.md, "SYN
	// cookies"); syn_only rules only.
	SynCookies SynCookieMode
	Fragments  FragmentPolicy
	// Refuse is how refused SYNs are answered: "" (drop) or RefuseReset.
	Refuse Refuse
	// Line is the line of the rule's mapping in the file.
	Line int
}

// WarmUp configures the warm_up and warm_up_paced behaviors (Sentinel's
// WarmUpController).
type WarmUp struct {
	Period     time.Duration
	ColdFactor float64
}

// Paced configures the paced and warm_up_paced behaviors (Sentinel's
// ThrottlingController).
type Paced struct {
	MaxQueueingTime time.Duration
	Queue           Queue
}

// Adaptive configures the adaptive behavior: a law steering the rate
// from the queueing latency.
type Adaptive struct {
	// Law is track (the default) or aimd.
	Law Law
	AdaptiveParams
	Signal Signal
	Probe  *Probe // non-nil iff Signal == SignalProbe
}

// AdaptiveParams are an adaptive rule's target, bounds and gains, as the
// control laws take them (control.AIMDParams is this type): track reads
// TargetLatency, MinRate, MaxRate and ErrorThreshold; KA, KM, Gamma,
// Alpha and CPUHigh are aimd's gains.
type AdaptiveParams struct {
	TargetLatency    time.Duration
	MinRate, MaxRate float64
	KA               float64 // additive increase gain
	KM               float64 // multiplicative decrease gain, (0,1]
	Gamma            float64 // decrease factor on errors, (0,1)
	Alpha            float64 // latency smoothing, (0,1]
	CPUHigh          float64 // no increase at or above this CPU usage, (0,1]
	ErrorThreshold   float64 // error rate that triggers the Gamma cut, [0,1]
}

// Probe is an active latency probe.
type Probe struct {
	Kind     ProbeKind
	Address  string // host:port; host is an IP literal or localhost
	Path     string // http only; "/" by default, empty for tcp
	Interval time.Duration
	Timeout  time.Duration
}

// PerSource gives each source address (aggregated to a prefix) its own
// bucket. It always counts packets (new connections with syn_only),
// whatever the rule's unit.
type PerSource struct {
	Rate     float64
	Burst    float64 // filled in: max(Rate, 1) when not given
	PrefixV4 int
	PrefixV6 int
	Ban      *Ban // nil when absent
}

// Ban drops all of a source's traffic to the rule for Duration once it has
// kept exceeding its per-source limit for After.
type Ban struct {
	After    time.Duration
	Duration time.Duration
}

// Concurrency caps the TCP connections in flight to the rule's ports.
// Between Soft and Max new connections are refused with a probability
// rising linearly from 0 to 1.
type Concurrency struct {
	Soft int // filled in: Max when not given
	Max  int
}

// CircuitBreaker configures the per-rule breaker (docs/design.md §5.8). A check
// whose ratio is 0 is off: the slow-call check runs iff SlowRatio > 0 (and
// then SlowLatency > 0), the error check iff ErrorRatio > 0.
type CircuitBreaker struct {
	SlowLatency    time.Duration
	SlowRatio      float64
	ErrorRatio     float64
	MinRequests    int
	Window         time.Duration
	RetryTimeout   time.Duration
	HalfOpenProbes int
}

// System is the host-wide protection (docs/design.md §5.6).
type System struct {
	CPUHigh float64
	// PressureHigh, when not 0, also counts the host as overloaded while
	// the CPU pressure (PSI "some" avg10, a fraction of time) is at or
	// above it, where the kernel reports pressure.
	PressureHigh float64
}

// EffectiveBurst is the burst the data plane puts in force, in the rule's
// unit:
//   - paced and warm_up_paced: Rate × MaxQueueingTime + 1 for packets (the
//     packet at wait 0 plus those whose wait is at most the queueing time;
//     rate 10/s and 500ms give 6), and max(Rate × MaxQueueingTime, 1514)
//     for bytes;
//   - otherwise Burst when given, else one second's worth: max(Rate, 1)
//     packets or max(Rate, 65535) bytes.
func (r *Rule) EffectiveBurst() float64 {
	if r.Behavior.IsPaced() {
		mqt := DefaultMaxQueueingTime
		if r.Paced != nil {
			mqt = r.Paced.MaxQueueingTime
		}
		b := r.Rate * mqt.Seconds()
		if r.Unit == UnitBytes {
			return math.Max(b, MinByteBurst)
		}
		return b + 1
	}
	if r.Burst > 0 {
		return r.Burst
	}
	if r.Unit == UnitBytes {
		return math.Max(r.Rate, DefaultByteBurst)
	}
	return math.Max(r.Rate, 1)
}

// MergedPorts returns the rule's ports sorted, with overlapping and
// adjacent ranges merged. It returns nil when the rule has no ports.
func (r *Rule) MergedPorts() []dataplane.PortRange { return MergePorts(r.Ports) }

// MergePorts returns a sorted copy of ports with overlapping and adjacent
// ranges merged.
func MergePorts(ports []dataplane.PortRange) []dataplane.PortRange {
	if len(ports) == 0 {
		return nil
	}
	sorted := slices.Clone(ports)
	slices.SortFunc(sorted, func(a, b dataplane.PortRange) int {
		return cmp.Or(cmp.Compare(a.Lo, b.Lo), cmp.Compare(a.Hi, b.Hi))
	})
	out := sorted[:1]
	for _, p := range sorted[1:] {
		last := &out[len(out)-1]
		if int(p.Lo) <= int(last.Hi)+1 {
			last.Hi = max(last.Hi, p.Hi)
			continue
		}
		out = append(out, p)
	}
	return out
}

// SynCookieMode is a rule's syn_cookies.
type SynCookieMode string

// SYN cookie modes. The default is off: answering SYNs makes the host send
// packets it did not before, and the ACK side needs Linux 6.9.
const (
	SynCookiesOff    SynCookieMode = "off"
	SynCookiesAuto   SynCookieMode = "auto"
	SynCookiesAlways SynCookieMode = "always"
)
