package dataplane

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"time"
)

// Plan is the complete content of one generation of the config maps,
// compiled from a rules file. The maps package writes it to the inactive
// generation and then flips the active one.
type Plan struct {
	Rules   [MaxRules]Rule
	Globals Globals
	// Ports maps PortKey(proto, port) to the mask of rules with that port,
	// for TCP and UDP; ports without rules are absent.
	Ports   map[uint32]uint64
	Prefix4 []PrefixEntry
	Prefix6 []PrefixEntry
	// Cookies is the generation's SYN cookie settings (cookie.go).
	Cookies Cookies
}

// Rule is one slot of a generation (struct xl_rule).
type Rule struct {
	Name     string
	Flags    uint32
	Epoch    uint32
	Fallback Bucket
	// Per-source limit (RulePerSource): each source prefix's bucket, in
	// packets, and the prefix lengths sources are aggregated to.
	Source           Bucket
	Prefix4, Prefix6 uint8
	// Ban (RuleBan): a source over its limit for BanAfterNS is dropped for
	// BanNS, renewed while it is still over when the ban ends.
	BanAfterNS, BanNS uint64
	// Concurrency limit (RuleConcurrency): new connections are refused
	// with ConcMax in flight, and above ConcSoft with a probability rising
	// linearly to 1 at ConcMax.
	ConcSoft, ConcMax uint32
}

// Active reports whether the slot holds a rule.
func (r *Rule) Active() bool { return r.Flags&RuleActive != 0 }

// Globals mirrors struct xl_globals.
type Globals struct {
	Portless    [ProtoMax]uint64
	FragMatch   [ProtoMax]uint64
	SynOnly     uint64
	SrcFiltered uint64
	Concurrent  uint64 // rules whose connections in flight sock_ops counts (RuleConcurrency or InFlight)
	Served      uint64 // rules whose handshakes the sock_ops program counts (resptime.go)
	RespTime    uint64 // rules whose response time is measured (resptime.go)
	// Reset is the bucket of the resets of all rules, in packets.
	Reset Bucket
	Flags uint32
}

// PrefixEntry is one source prefix of the trie with everything folded into
// it: allow/deny from any enclosing list entry, and the rules whose sources
// contain it.
type PrefixEntry struct {
	Prefix netip.Prefix
	Rules  uint64
	Flags  uint32
}

// PortKey is the index of (proto, port) within one generation of xl_ports.
func PortKey(proto Proto, port uint16) uint32 {
	return uint32(proto)<<16 | uint32(port)
}

// Epoch is the identity of a rule's state: it depends on the name only, so
// rate changes and daemon restarts keep the bucket, and a slot that passes
// to another rule starts fresh.
func Epoch(name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return h.Sum32() | 1
}

// Slot returns the slot of the rule with the given name, or -1.
func (p *Plan) Slot(name string) int {
	for i := range p.Rules {
		if p.Rules[i].Active() && p.Rules[i].Name == name {
			return i
		}
	}
	return -1
}

// RuleSpec is what the compiler needs of one rule; userspace/config builds
// them from a rules file.
type RuleSpec struct {
	Name      string
	Protocol  string // tcp | udp | icmp | any
	Ports     []PortRange
	SynOnly   bool
	Sources   []netip.Prefix
	Bytes     bool
	Rate      float64
	Burst     float64
	Shadow    bool
	Fragments string // ignore | limit (the default, "") | drop
	PerSource *PerSourceSpec
	// Concurrency, when not nil, caps the connections in flight (tcp).
	Concurrency *ConcurrencySpec
	// SynCookies is off (or ""), auto or always (cookie.go).
	SynCookies string
	// Refuse is drop (or "") or reset: how SYNs refused over the rate
	// are answered (resptime.go).
	Refuse string
	// ServiceRate: the kernel counts the rule's completed handshakes;
	// ResponseTime: it measures the rule's response time (tcp).
	ServiceRate, ResponseTime bool
	// InFlight: the sock_ops program counts the rule's connections in
	// flight, as for a concurrency limit, for the loop's in-flight cap
	// (Limit.ConcCap) of an adaptive rule (tcp).
	InFlight bool
}

// ConcurrencySpec is a rule's concurrency limit: Soft <= Max.
type ConcurrencySpec struct{ Soft, Max int }

// PerSourceSpec is a rule's per-source limit.
type PerSourceSpec struct {
	Rate, Burst        float64 // packets per second, packets
	PrefixV4, PrefixV6 int
	// Ban: BanDuration 0 means no ban.
	BanAfter, BanDuration time.Duration
}

// PortRange is an inclusive range of ports; a single port has Lo == Hi.
// It is the one port-range type of xlimit: the rules file, the compiler,
// the kernel queues and the socket readers all use it.
type PortRange struct{ Lo, Hi uint16 }

// Port returns the range holding only p.
func Port(p uint16) PortRange { return PortRange{p, p} }

// Contains reports whether port lies in p.
func (p PortRange) Contains(port uint16) bool { return p.Lo <= port && port <= p.Hi }

func (p PortRange) String() string {
	if p.Lo == p.Hi {
		return strconv.Itoa(int(p.Lo))
	}
	return strconv.Itoa(int(p.Lo)) + "-" + strconv.Itoa(int(p.Hi))
}

// Spec is what the compiler needs of a rules file.
type Spec struct {
	Allow, Deny   []netip.Prefix
	MalformedPass bool
	Rules         []RuleSpec
	// ExemptTCP and ExemptUDP are ports that no rule limits (the
	// management section): port rules do not cover them, and rules
	// without ports cover every other port of the protocol.
	ExemptTCP, ExemptUDP []PortRange
	// ResetRate and ResetBurst are the budget of resets of all rules,
	// per second and at once; 0 means DefaultResetRate, DefaultResetBurst.
	ResetRate, ResetBurst float64
	// CookieRate is the budget of SYN cookie answers of all rules per
	// second; 0 means DefaultCookieRate.
	CookieRate float64
	// MSS4 and MSS6 are the MSS the SYN-ACKs announce (0: 1460, 1440).
	MSS4, MSS6 uint16
}

// Compile builds a Plan. prev, when not nil, is the plan in force: a rule
// keeps its slot across reloads (so its bucket and counters carry on) and
// new rules take free slots, lowest first.
func Compile(spec *Spec, prev *Plan) (*Plan, error) {
	if len(spec.Rules) > MaxRules {
		return nil, fmt.Errorf("compile rules: %d rules, at most %d", len(spec.Rules), MaxRules)
	}
	slots := make([]int, len(spec.Rules))
	used := make([]bool, MaxRules)
	for i, r := range spec.Rules {
		slots[i] = -1
		if prev != nil {
			if s := prev.Slot(r.Name); s >= 0 && !used[s] {
				slots[i], used[s] = s, true
			}
		}
	}
	for i := range spec.Rules {
		if slots[i] >= 0 {
			continue
		}
		for s := range used {
			// Prefer slots the previous plan did not use, so a new rule
			// does not inherit counters of a rule just removed.
			if !used[s] && (prev == nil || !prev.Rules[s].Active()) {
				slots[i], used[s] = s, true
				break
			}
		}
		if slots[i] < 0 {
			for s := range used {
				if !used[s] {
					slots[i], used[s] = s, true
					break
				}
			}
		}
	}

	p := &Plan{Ports: make(map[uint32]uint64)}
	rate, burst := cmp.Or(spec.ResetRate, DefaultResetRate), cmp.Or(spec.ResetBurst, DefaultResetBurst)
	rb, err := NewBucket(rate, burst, false)
	if err != nil {
		return nil, fmt.Errorf("compile reset budget: %w", err)
	}
	p.Globals.Reset = rb
	if p.Cookies, err = compileCookies(spec); err != nil {
		return nil, err
	}
	if spec.MalformedPass {
		p.Globals.Flags |= GlobalMalformedPass
	}
	// The cost of a compilation is its distinct prefixes times the
	// address length at most: never rules × prefixes (docs/robustness.md).
	// Each configured prefix gets one entry holding what is configured on
	// it exactly (own), then takes what its enclosing prefixes have.
	sources := map[netip.Prefix]*prefixOwn{}
	entry := func(pfx netip.Prefix) *prefixOwn {
		pfx = pfx.Masked()
		e, ok := sources[pfx]
		if !ok {
			e = &prefixOwn{PrefixEntry: PrefixEntry{Prefix: pfx}}
			sources[pfx] = e
		}
		return e
	}
	for _, pfx := range spec.Allow {
		entry(pfx).flags |= PrefixAllow
	}
	for _, pfx := range spec.Deny {
		entry(pfx).flags |= PrefixDeny
	}
	// Rules that share one list of sources (a YAML alias decodes to one
	// slice) are folded in together: each list is walked once.
	type list struct {
		first *netip.Prefix
		n     int
	}
	var lists [][]netip.Prefix
	listRules := map[list]uint64{}
	ports := map[Proto]*[1 << 16]uint64{}

	for i, r := range spec.Rules {
		slot := slots[i]
		bit := uint64(1) << slot
		b, err := NewBucket(r.Rate, r.Burst, r.Bytes)
		if err != nil {
			return nil, fmt.Errorf("compile rule %s: %w", r.Name, err)
		}
		if len(r.Name) >= NameLen {
			return nil, fmt.Errorf("compile rule %s: name longer than %d bytes", r.Name, NameLen-1)
		}
		pr := Rule{Name: r.Name, Flags: RuleActive, Epoch: Epoch(r.Name), Fallback: b}
		if r.Shadow {
			pr.Flags |= RuleShadow
		}
		if r.Bytes {
			pr.Flags |= RuleBytes
		}
		protos, err := protoClasses(r.Protocol, len(r.Ports) > 0)
		if err != nil {
			return nil, fmt.Errorf("compile rule %s: %w", r.Name, err)
		}
		if len(r.Ports) == 0 {
			for _, c := range protos {
				p.Globals.Portless[c] |= bit
				// A rule without ports of TCP or UDP follows their
				// fragments as a port rule does (frag.h): a datagram
				// decided whole at its first fragment, IPv6 later
				// fragments joined to it whatever their Next Header,
				// orphans dropped. `fragments: ignore` charges each
				// fragment as it comes instead (issue 41).
				if c < PortProtos && r.Fragments != "ignore" {
					p.Globals.FragMatch[c] |= bit
				}
			}
		} else {
			for _, c := range protos {
				if ports[c] == nil {
					ports[c] = new([1 << 16]uint64)
				}
				for _, pr := range r.Ports {
					for port := int(pr.Lo); port <= int(pr.Hi); port++ {
						ports[c][port] |= bit
					}
				}
				switch r.Fragments {
				case "ignore":
				case "", "limit":
					p.Globals.FragMatch[c] |= bit
				case "drop":
					p.Globals.FragMatch[c] |= bit
				default:
					return nil, fmt.Errorf("compile rule %s: fragments %q: unknown", r.Name, r.Fragments)
				}
			}
			if r.Fragments == "drop" {
				pr.Flags |= RuleFragDrop
			}
		}
		if r.SynOnly {
			p.Globals.SynOnly |= bit
		}
		if ps := r.PerSource; ps != nil {
			sb, err := NewBucket(ps.Rate, ps.Burst, false)
			if err != nil {
				return nil, fmt.Errorf("compile rule %s: per_source: %w", r.Name, err)
			}
			if ps.PrefixV4 < 1 || ps.PrefixV4 > 32 || ps.PrefixV6 < 1 || ps.PrefixV6 > 128 {
				return nil, fmt.Errorf("compile rule %s: per_source prefixes /%d and /%d out of range", r.Name, ps.PrefixV4, ps.PrefixV6)
			}
			pr.Flags |= RulePerSource
			pr.Source = sb
			pr.Prefix4, pr.Prefix6 = uint8(ps.PrefixV4), uint8(ps.PrefixV6)
			if ps.BanDuration > 0 {
				pr.Flags |= RuleBan
				pr.BanAfterNS, pr.BanNS = uint64(ps.BanAfter), uint64(ps.BanDuration)
			}
		}
		if c := r.Concurrency; c != nil {
			if r.Protocol != "tcp" || c.Max < 1 || c.Soft < 0 || c.Soft > c.Max || c.Max > math.MaxInt32 {
				return nil, fmt.Errorf("compile rule %s: concurrency soft %d max %d on protocol %s: needs tcp and 0 <= soft <= max", r.Name, c.Soft, c.Max, r.Protocol)
			}
			pr.Flags |= RuleConcurrency
			pr.ConcSoft, pr.ConcMax = uint32(c.Soft), uint32(c.Max)
			p.Globals.Concurrent |= bit
		}
		if err := compileRuleCookies(&r, &pr, &p.Cookies, bit); err != nil {
			return nil, err
		}
		if err := compileRuleResp(&r, &pr, &p.Globals, bit); err != nil {
			return nil, err
		}
		if len(r.Sources) > 0 {
			p.Globals.SrcFiltered |= bit
			l := list{&r.Sources[0], len(r.Sources)}
			if _, seen := listRules[l]; !seen {
				lists = append(lists, r.Sources)
			}
			listRules[l] |= bit
		}
		p.Rules[slot] = pr
	}

	for _, l := range lists {
		bits := listRules[list{&l[0], len(l)}]
		for _, pfx := range l {
			entry(pfx).rules |= bits
		}
	}
	exemptPorts(p, ports, ProtoTCP, spec.ExemptTCP)
	exemptPorts(p, ports, ProtoUDP, spec.ExemptUDP)
	for c, a := range ports {
		for port, mask := range a {
			if mask != 0 {
				p.Ports[PortKey(c, uint16(port))] = mask
			}
		}
	}

	// Fold: every entry takes the flags and rules of each configured
	// prefix that contains it, so the longest match alone decides. Only
	// the prefix lengths in use are looked up.
	var lengths [2][129]bool // [IPv4?][bits]
	for pfx := range sources {
		lengths[b2i(pfx.Addr().Is4())][pfx.Bits()] = true
	}
	for pfx, e := range sources {
		in := &lengths[b2i(pfx.Addr().Is4())]
		for bits := pfx.Bits(); bits >= 0; bits-- {
			if !in[bits] {
				continue
			}
			anc, _ := pfx.Addr().Prefix(bits)
			if a, ok := sources[anc]; ok {
				e.Flags |= a.flags & (PrefixAllow | PrefixDeny)
				e.Rules |= a.rules
			}
		}
	}
	for _, e := range sources {
		if e.Prefix.Addr().Is4() {
			p.Prefix4 = append(p.Prefix4, e.PrefixEntry)
		} else {
			p.Prefix6 = append(p.Prefix6, e.PrefixEntry)
		}
	}
	for _, list := range [][]PrefixEntry{p.Prefix4, p.Prefix6} {
		slices.SortFunc(list, func(a, b PrefixEntry) int {
			if c := a.Prefix.Addr().Compare(b.Prefix.Addr()); c != 0 {
				return c
			}
			return a.Prefix.Bits() - b.Prefix.Bits()
		})
	}
	if len(p.Prefix4) > 0 {
		p.Globals.Flags |= GlobalPrefixesV4
	}
	if len(p.Prefix6) > 0 {
		p.Globals.Flags |= GlobalPrefixesV6
	}
	return p, nil
}

// exemptPorts takes the exempt ports of class c out of every rule: a rule
// without ports becomes a rule of every other port (and keeps matching
// non-first fragments, which carry no port), and the exempt ports' masks
// are cleared.
func exemptPorts(p *Plan, ports map[Proto]*[1 << 16]uint64, c Proto, exempt []PortRange) {
	if len(exempt) == 0 {
		return
	}
	if ports[c] == nil {
		ports[c] = new([1 << 16]uint64)
	}
	a := ports[c]
	if portless := p.Globals.Portless[c]; portless != 0 {
		for port := range a {
			a[port] |= portless
		}
		p.Globals.FragMatch[c] |= portless
		p.Globals.Portless[c] = 0
	}
	for _, r := range exempt {
		for port := int(r.Lo); port <= int(r.Hi); port++ {
			a[port] = 0
		}
	}
}

// prefixOwn is a prefix's entry while it is compiled, with what is
// configured on the prefix itself.
type prefixOwn struct {
	PrefixEntry
	flags uint32
	rules uint64
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func protoClasses(protocol string, hasPorts bool) ([]Proto, error) {
	switch protocol {
	case "tcp":
		return []Proto{ProtoTCP}, nil
	case "udp":
		return []Proto{ProtoUDP}, nil
	case "icmp":
		if hasPorts {
			return nil, fmt.Errorf("protocol icmp: has no ports")
		}
		return []Proto{ProtoICMP}, nil
	case "any":
		if hasPorts {
			return []Proto{ProtoTCP, ProtoUDP}, nil
		}
		return []Proto{ProtoTCP, ProtoUDP, ProtoICMP, ProtoOther}, nil
	}
	return nil, fmt.Errorf("protocol %q: unknown", protocol)
}

// Lookup returns the trie entry for addr as the kernel's longest-prefix
// match would, or nil.
func (p *Plan) Lookup(addr netip.Addr) *PrefixEntry {
	list := p.Prefix6
	if addr.Is4() {
		list = p.Prefix4
	}
	var best *PrefixEntry
	for i := range list {
		e := &list[i]
		if e.Prefix.Contains(addr) && (best == nil || e.Prefix.Bits() > best.Prefix.Bits()) {
			best = e
		}
	}
	return best
}

// ActiveSlots returns the slots that hold rules, in order.
func (p *Plan) ActiveSlots() []int {
	var s []int
	for i := range p.Rules {
		if p.Rules[i].Active() {
			s = append(s, i)
		}
	}
	return slices.Clip(s)
}
