// Package tcqueue gives paced rules with `queue: kernel` a real queue
// (docs/design.md §5.3): the rule's traffic is redirected at TC ingress to an IFB
// device whose TBF qdisc sends it on at the rule's rate, holds what arrives
// early for at most max_queueing_time, and drops what would wait longer.
// XDP still caps the rule first (burst rate × max_queueing_time + 1), so a
// flood never reaches TC.
//
// Per interface and queued rule:
//
//	iface: clsact (or an existing ingress qdisc)
//	       u32 filters, prefs FirstPref…: allowlisted sources → pass;
//	       the rule's protocol / destination ports / sources → mirred redirect to the IFB
//	IFB "xlq<8 hex>" (alias "xlimit:<iface>:<rule>"), up, same netns:
//	       root tbf 1: rate, burst 1 packet, mpu (packet rules)
//	       └─ pfifo 10: limit ⌊rate × max_queueing_time⌋ packets (packet rules)
//	          (bfifo of rate × max_queueing_time bytes for byte rules)
//
// This file is the pure part: names, TBF arithmetic, the filters a rules
// file needs and the plan that turns what exists into what should. The
// netlink part is in netlink_linux.go.
package tcqueue

import (
	"fmt"
	"hash/fnv"
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

const (
	// IFBPrefix starts the name of every IFB device tcqueue creates.
	IFBPrefix = "xlq"
	// AliasPrefix starts the alias (IFLA_IFALIAS) of every IFB device
	// tcqueue creates: "xlimit:<iface>:<rule>". Only devices with this
	// alias are ever changed or removed.
	AliasPrefix = "xlimit:"
	// FirstPref and MaxFilters are the TC filter priorities tcqueue owns on
	// an interface's ingress: [FirstPref, FirstPref+MaxFilters).
	FirstPref  = 0xc000
	MaxFilters = 1024
	// PacketMPU is the minimum packet unit of packet-rate TBFs: every
	// packet up to this size costs exactly PacketMPU bytes of the byte rate
	// rate × PacketMPU (the kernel's psched_l2t_ns), so the TBF paces
	// packets, whatever their size. It is the largest tc_ratespec.mpu.
	PacketMPU = 65535
	// PacketBurst is the TBF bucket of packet rules, in packets. One packet
	// would be Sentinel's pacing to the letter, but the TBF's watchdog timer
	// fires late by some microseconds each time and a one-packet bucket
	// cannot make up for it: measured, 1000/s became 980/s and waits grew
	// past max_queueing_time (823 ms for 800 ms). Two packets let the TBF
	// catch up; the price is that two packets of a burst leave at once.
	PacketBurst = 2
	// ChildHandle is the handle of the pfifo under a packet-rate TBF.
	ChildHandle = 0x000a0000
	// RootHandle is the handle of the TBF on the IFB.
	RootHandle = 0x00010000
)

// Protocol is what a queue takes: TCP, UDP, or Any (TCP and UDP, with
// ports).
type Protocol string

const (
	TCP Protocol = "tcp"
	UDP Protocol = "udp"
	Any Protocol = "any"
)

// Queue is one rule to queue on an interface.
type Queue struct {
	Rule     string
	Protocol Protocol
	Ports    []dataplane.PortRange
	Sources  []netip.Prefix
	SynOnly  bool
	Bytes    bool
	Rate     float64 // packets or bytes per second
	MaxQueue time.Duration
}

// Spec is what an interface should have.
type Spec struct {
	Allow  []netip.Prefix // allowlisted sources bypass every queue
	Queues []Queue
}

// IFBName is the IFB device of a rule on an interface: "xlq" and 8 hex
// digits of a hash of both, 11 characters (IFNAMSIZ is 16).
func IFBName(iface, rule string) string {
	h := fnv.New32a()
	h.Write([]byte(iface))
	h.Write([]byte{0})
	h.Write([]byte(rule))
	return fmt.Sprintf("%s%08x", IFBPrefix, h.Sum32())
}

// Alias is the alias of a rule's IFB device.
func Alias(iface, rule string) string { return AliasPrefix + iface + ":" + rule }

// Shape is a TBF configuration.
type Shape struct {
	RateBytes uint64 // TBF rate, bytes per second
	MPU       uint16 // minimum packet unit (PacketMPU for packet rules, 0 for bytes)
	Burst     uint32 // bucket depth, bytes: PacketBurst packets or one frame
	// Limit is the queue bound: packets of the pfifo child for packet
	// rules, bytes of the TBF's own bfifo for byte rules.
	Limit   uint32
	Packets bool
}

// ShapeFor is the TBF of a rule of rate per second (packets, or bytes with
// bytes) and a maximum queueing time; frame is the largest frame the IFB
// will see (interface MTU plus link-layer headers).
//
// Packets: rate × PacketMPU bytes per second with mpu PacketMPU, so each
// packet of at most PacketMPU bytes costs exactly 1/rate; a bucket of
// PacketBurst packets (the first two of a burst leave at once, the next
// 1/rate apart); a pfifo of ⌊rate × max_queueing_time⌋ packets, so the last one queued
// waits at most max_queueing_time. At least one packet must fit (validated
// in config: rate × max_queueing_time ≥ 1).
//
// Bytes: the rate itself; a bucket of one frame; a bfifo of
// rate × max_queueing_time bytes (at least one frame).
func ShapeFor(rate float64, bytes bool, maxQueue time.Duration, frame uint32) (Shape, error) {
	if rate <= 0 || math.IsNaN(rate) || maxQueue <= 0 {
		return Shape{}, fmt.Errorf("shape queue: rate %g and max queueing time %v must be positive", rate, maxQueue)
	}
	held := rate * maxQueue.Seconds()
	if bytes {
		frame = max(frame, dataplane.FullFrame)
		rb := math.Round(rate)
		if rb < 1 || rb > math.MaxUint64/2 {
			return Shape{}, fmt.Errorf("shape queue: byte rate %g out of range", rate)
		}
		limit := max(math.Floor(held), float64(frame))
		if limit > math.MaxUint32 {
			return Shape{}, fmt.Errorf("shape queue: %g bytes do not fit a queue (at most %d)", held, uint32(math.MaxUint32))
		}
		return Shape{RateBytes: uint64(rb), Burst: frame, Limit: uint32(limit)}, nil
	}
	// A hair of tolerance so that 1000/s × 800ms is 800 packets, not 799.
	limit := math.Floor(held + 1e-9)
	if limit < 1 {
		return Shape{}, fmt.Errorf("shape queue: rate × max_queueing_time = %g: not one packet fits the queue", held)
	}
	if limit > math.MaxUint32 {
		return Shape{}, fmt.Errorf("shape queue: %g packets do not fit a queue", held)
	}
	rb := math.Round(rate * PacketMPU)
	if rb < 1 || rb > math.MaxUint64/2 {
		return Shape{}, fmt.Errorf("shape queue: packet rate %g out of range", rate)
	}
	return Shape{RateBytes: uint64(rb), MPU: PacketMPU, Burst: PacketBurst * PacketMPU, Limit: uint32(limit), Packets: true}, nil
}

// Rate is the rate the shape enforces, in the rule's unit per second.
func (s Shape) Rate() float64 {
	if s.Packets {
		return float64(s.RateBytes) / PacketMPU
	}
	return float64(s.RateBytes)
}

// Match is what one u32 filter matches. Zero fields match anything.
type Match struct {
	EthType uint16       // 0x0800 or 0x86dd
	IPProto uint8        // 6, 17, or 0 (any: allowlist filters)
	Src     netip.Prefix // invalid: any source
	// Port and PortMask select destination ports: port & PortMask ==
	// Port. A port range becomes the few aligned blocks that cover it
	// (PortBlocks). PortMask 0 matches every port.
	Port, PortMask uint16
	// SynOnly matches TCP SYNs without ACK (new connections) only.
	SynOnly bool
}

// Filter is one of the filters tcqueue keeps on an interface's ingress.
type Filter struct {
	Pref uint16
	Match
	// Target is the IFB to redirect to; empty means pass at once (the
	// allowlist).
	Target string
}

const (
	ethIPv4 = 0x0800
	ethIPv6 = 0x86dd
	ipTCP   = 6
	ipUDP   = 17
)

// PortBlock is a set of ports: port & Mask == Value.
type PortBlock struct{ Value, Mask uint16 }

// PortBlocks covers an inclusive port range with the fewest aligned
// power-of-two blocks (at most 30 for any range).
func PortBlocks(lo, hi uint16) []PortBlock {
	var out []PortBlock
	for l, h := uint32(lo), uint32(hi); l <= h; {
		size := uint32(1)
		// Grow while l stays aligned and the block stays inside.
		for size < 1<<16 && l%(size*2) == 0 && l+size*2-1 <= h {
			size *= 2
		}
		out = append(out, PortBlock{Value: uint16(l), Mask: uint16(0xffff &^ (size - 1))})
		l += size
	}
	return out
}

// Filters returns the filters of a spec on iface, allowlist first, then the
// queues in the order of the rules file (a packet that two queued rules
// match waits in the first one's queue only).
func Filters(iface string, s Spec) ([]Filter, error) {
	var out []Filter
	if len(s.Queues) == 0 {
		return nil, nil
	}
	for _, p := range s.Allow {
		out = append(out, Filter{Match: Match{EthType: family(p), Src: p}})
	}
	for _, q := range s.Queues {
		var protos []uint8
		switch q.Protocol {
		case TCP:
			protos = []uint8{ipTCP}
		case UDP:
			protos = []uint8{ipUDP}
		case Any:
			if len(q.Ports) == 0 {
				return nil, fmt.Errorf("rule %s: queue: kernel with protocol any needs ports", q.Rule)
			}
			protos = []uint8{ipTCP, ipUDP}
		default:
			return nil, fmt.Errorf("rule %s: queue: kernel cannot queue protocol %s", q.Rule, q.Protocol)
		}
		type source struct {
			eth uint16
			src netip.Prefix
		}
		sources := []source{{ethIPv4, netip.Prefix{}}, {ethIPv6, netip.Prefix{}}}
		if len(q.Sources) > 0 {
			sources = sources[:0]
			for _, p := range q.Sources {
				if p.Bits() == 0 {
					sources = append(sources, source{family(p), netip.Prefix{}}) // 0.0.0.0/0, ::/0: no key
				} else {
					sources = append(sources, source{family(p), p})
				}
			}
		}
		blocks := []PortBlock{{}}
		if len(q.Ports) > 0 {
			blocks = nil
			for _, pr := range q.Ports {
				blocks = append(blocks, PortBlocks(pr.Lo, pr.Hi)...)
			}
		}
		target := IFBName(iface, q.Rule)
		for _, s := range sources {
			for _, proto := range protos {
				for _, b := range blocks {
					out = append(out, Filter{Match: Match{EthType: s.eth, IPProto: proto, Src: s.src, Port: b.Value, PortMask: b.Mask,
						SynOnly: q.SynOnly && proto == ipTCP}, Target: target})
				}
			}
		}
		if len(out) > MaxFilters {
			break
		}
	}
	if len(out) > MaxFilters {
		return nil, fmt.Errorf("queue: kernel needs more than %d TC filters on %s: fewer ports (ranges cost up to 30 filters each), sources or allow prefixes", MaxFilters, iface)
	}
	for i := range out {
		out[i].Pref = uint16(FirstPref + i)
	}
	return out, nil
}

// Key is one 32-bit u32 match: the word at Off (bytes from the network
// header) masked with Mask equals Val (host order, as the word reads
// big-endian).
type Key struct {
	Off       int32
	Val, Mask uint32
}

// Keys are the u32 keys of a match. IPv4: IHL 5 (packets with IP options
// are not queued: u32 cannot follow a variable header length without hash
// tables) and fragment offset 0 (a later fragment has no ports); IPv6: the
// transport header right after the fixed header (packets with extension
// headers are not queued). Every key is at a fixed offset, so a packet the
// keys do not describe is never misread.
func (m Match) Keys() []Key {
	var ks []Key
	if m.EthType == ethIPv4 {
		if m.IPProto != 0 {
			ks = append(ks,
				Key{Off: 0, Val: 0x05000000, Mask: 0x0f000000},
				Key{Off: 4, Val: 0, Mask: 0x00001fff},
				Key{Off: 8, Val: uint32(m.IPProto) << 16, Mask: 0x00ff0000})
		}
		if m.Src.IsValid() && m.Src.Bits() > 0 {
			a := m.Src.Addr().As4()
			mask := ^uint32(0) << (32 - m.Src.Bits())
			ks = append(ks, Key{Off: 12, Val: be32(a[:]) & mask, Mask: mask})
		}
		if m.IPProto != 0 && m.PortMask != 0 {
			ks = append(ks, Key{Off: 20, Val: uint32(m.Port & m.PortMask), Mask: uint32(m.PortMask)})
		}
		if m.SynOnly {
			ks = append(ks, synKey(20))
		}
		if len(ks) == 0 {
			ks = append(ks, Key{}) // every packet of the family
		}
		return ks
	}
	if m.IPProto != 0 {
		ks = append(ks, Key{Off: 4, Val: uint32(m.IPProto) << 8, Mask: 0x0000ff00})
	}
	if m.Src.IsValid() && m.Src.Bits() > 0 {
		a := m.Src.Addr().As16()
		for w := range 4 {
			bits := min(max(m.Src.Bits()-32*w, 0), 32)
			if bits == 0 {
				break
			}
			mask := ^uint32(0) << (32 - bits)
			ks = append(ks, Key{Off: int32(8 + 4*w), Val: be32(a[4*w:]) & mask, Mask: mask})
		}
	}
	if m.IPProto != 0 && m.PortMask != 0 {
		ks = append(ks, Key{Off: 40, Val: uint32(m.Port & m.PortMask), Mask: uint32(m.PortMask)})
	}
	if m.SynOnly {
		ks = append(ks, synKey(40))
	}
	if len(ks) == 0 {
		ks = append(ks, Key{}) // every packet of the family
	}
	return ks
}

// synKey matches SYN set and ACK clear in the flags byte of a TCP header
// at l4 (byte 13: the second byte of the word at 12).
func synKey(l4 int32) Key { return Key{Off: l4 + 12, Val: 0x00020000, Mask: 0x00120000} }

func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// Sig is a filter as the kernel holds it: the tc protocol, the u32 keys
// and the target. Two filters with the same Sig classify alike.
func Sig(ethType uint16, keys []Key, target string) string {
	return fmt.Sprintf("%#04x %v -> %q", ethType, keys, target)
}

// Sig is f's signature (see Sig).
func (f Filter) Sig() string { return Sig(f.EthType, f.Keys(), f.Target) }

func family(p netip.Prefix) uint16 {
	if p.Addr().Is4() {
		return ethIPv4
	}
	return ethIPv6
}

// FilterPlan is what to change on an interface's ingress.
type FilterPlan struct {
	Put    []Filter // add or replace (same pref, handle 1)
	Delete []uint16 // prefs
}

// Empty reports whether the plan changes nothing.
func (p FilterPlan) Empty() bool { return len(p.Put) == 0 && len(p.Delete) == 0 }

// PlanFilters compares the signatures of the filters found in tcqueue's
// prefs (a filter tcqueue would not have made gets a signature that equals
// nothing wanted) with the wanted filters.
func PlanFilters(have map[uint16]string, want []Filter) FilterPlan {
	var p FilterPlan
	wanted := map[uint16]bool{}
	for _, f := range want {
		wanted[f.Pref] = true
		if h, ok := have[f.Pref]; !ok || h != f.Sig() {
			p.Put = append(p.Put, f)
		}
	}
	for pref := range have {
		if !wanted[pref] {
			p.Delete = append(p.Delete, pref)
		}
	}
	slices.Sort(p.Delete)
	return p
}

// QdiscState is what a rule's IFB holds, as far as netlink reports it.
type QdiscState struct {
	RootTBF   bool
	RateBytes uint64
	Limit     uint32
	ChildKind string // "pfifo" (handle ChildHandle), "bfifo" (TBF default), or ""
}

// NeedsShape reports whether the IFB's qdiscs must be (re)written to
// enforce s. (tc_ratespec's mpu and the burst are not reported by the
// netlink library; a TBF that tcqueue made with this rate and limit has
// them.)
func NeedsShape(have QdiscState, s Shape) bool {
	if !have.RootTBF || have.RateBytes != s.RateBytes || have.Limit != s.Limit {
		return true
	}
	if s.Packets {
		return have.ChildKind != "pfifo"
	}
	return have.ChildKind != "bfifo"
}

// RateChanged reports whether a control-loop rate differs enough from the
// one in force to rewrite the TBF: by more than 0.5 % (a rewrite refills
// the TBF's one-packet bucket, so it is not free).
func RateChanged(inForce, next float64) bool {
	if inForce <= 0 {
		return next > 0
	}
	return math.Abs(next-inForce)/inForce > 0.005
}
