//go:build linux

// Package pinstatus reads an interface's status from the pins xlimit keeps
// under <bpffs>/xlimit/<iface>/, with no daemon running: the rules, the
// rates in force, the counters, the top dropped sources and the maps'
// kernel memory. It is what GET /v1/status answers, and what `xlimit
// status` (without a daemon) and `xlimit top` show. It reaches the kernel
// only through loader and maps.
package pinstatus

import (
	"fmt"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/status"
)

func toCounterStatus(c *dataplane.Counters) status.Counters {
	s := status.Counters{Packets: map[string]uint64{}, Bytes: map[string]uint64{}, Reasons: map[string]uint64{}}
	for v := range dataplane.VerdictMax {
		s.Packets[v.String()] = c.Packets[v]
		s.Bytes[v.String()] = c.Bytes[v]
	}
	for r := range dataplane.ReasonMax {
		if c.Reasons[r] != 0 {
			s.Reasons[r.String()] = c.Reasons[r]
		}
	}
	return s
}

// topSources is how many of the most dropped sources status lists per rule.
const topSources = 10

// Read reads an interface's status from its pins (no daemon needed): the
// rules, the rates in force, the counters, the top dropped sources and the
// maps' kernel memory.
func Read(bpffs, iface string) (status.Iface, error) {
	st := status.Iface{Iface: iface, PinDir: loader.PinDir(bpffs, iface)}
	ls, err := loader.Inspect(bpffs, iface)
	if err != nil {
		return st, fmt.Errorf("inspect %s: %w", iface, err)
	}
	st.Attached, st.Ifindex, st.ProgramID, st.LinkID = ls.Attached, ls.Ifindex, ls.ProgramID, ls.LinkID
	st.Dispatcher = ls.Dispatcher
	for _, p := range ls.Shared {
		st.XDPPrograms = append(st.XDPPrograms, status.XDPProgram{Slot: p.Slot, ID: p.ID, Name: p.Name, Priority: p.Priority, ChainActions: p.Chain, Xlimit: p.Xlimit})
	}
	t, err := maps.OpenPinned(st.PinDir, true)
	if err != nil {
		return st, err
	}
	defer t.Close()
	if st.Generation, err = t.ActiveGeneration(); err != nil {
		return st, err
	}
	plan, err := t.ReadPlan()
	if err != nil {
		return st, err
	}
	counters, err := t.AllCounters()
	if err != nil {
		return st, err
	}
	now := maps.MonotonicNS()
	st.CountersReadNS = now
	for _, slot := range plan.ActiveSlots() {
		r := &plan.Rules[slot]
		rs := status.Rule{
			Slot: slot, Name: r.Name, Unit: "packets",
			Rate: r.Fallback.Rate(), Burst: r.Fallback.Burst(), RateSource: "static",
			Shadow:   r.Flags&dataplane.RuleShadow != 0,
			Counters: toCounterStatus(&counters[slot]),
		}
		if r.Flags&dataplane.RuleBytes != 0 {
			rs.Unit = "bytes"
		}
		if lim, err := t.Limit(slot); err == nil && lim.Epoch == r.Epoch && now < lim.DeadlineNS {
			rs.Rate, rs.Burst, rs.RateSource = lim.Bucket.Rate(), lim.Bucket.Burst(), "control"
			rs.Breaker = gateState(lim.Gate)
		}
		if r.Flags&dataplane.RuleConcurrency != 0 {
			cs := &status.Concurrency{Soft: int(r.ConcSoft), Max: int(r.ConcMax)}
			if c, err := t.Conns(slot); err != nil {
				return st, err
			} else if c.Epoch == r.Epoch {
				cs.InFlight = c.Count
			}
			rs.Concurrency = cs
		}
		if r.Flags&dataplane.RulePerSource != 0 {
			ps := &status.PerSource{
				Rate: r.Source.Rate(), Burst: r.Source.Burst(),
				PrefixV4: int(r.Prefix4), PrefixV6: int(r.Prefix6), Ban: r.Flags&dataplane.RuleBan != 0,
				TopSources: []status.Source{},
			}
			top, err := t.Sources(slot, topSources)
			if err != nil {
				return st, err
			}
			for _, src := range top {
				if src.Drops == 0 || src.Epoch != r.Epoch {
					continue
				}
				ps.TopSources = append(ps.TopSources, status.Source{Prefix: src.Prefix.String(), Drops: src.Drops, Banned: src.BannedUntilNS > now})
			}
			rs.PerSource = ps
		}
		if mode := cookieMode(r.Flags); mode != "" {
			c, err := t.CookieCounters(slot)
			if err != nil {
				return st, err
			}
			rs.SynCookies = &status.SynCookies{Mode: mode, Sent: c.Sent, Validated: c.Validated, Failed: c.Failed,
				Refused: c.Refused, RefusedReset: c.RefusedReset, AssignFailed: c.AssignFailed, OverBudget: c.OverBudget, NotLocal: c.NotLocal,
				Unanswerable: c.Unanswerable, ToSocket: c.ToSocket}
		}
		st.Rules = append(st.Rules, rs)
	}
	st.Total = toCounterStatus(&counters[dataplane.GlobalSlot])
	mem, err := maps.PinnedMemory(st.PinDir)
	if err != nil {
		return st, err
	}
	st.Memory = toMemoryStatus(mem)
	if host, err := t.HostAddrs(); err == nil {
		st.HostAddrs = &status.HostAddrs{Listed: len(host), Incomplete: host.Incomplete(),
			Unmaintained: !t.HostAddrsMaintained(host)}
		if host.Incomplete() {
			st.HostAddrs.Listed-- // the mark is no address
		}
		if host.Has(dataplane.LeaseKey) {
			st.HostAddrs.Listed-- // nor the lease
		}
	}
	return st, nil
}

// cookieMode is a rule's syn_cookies mode from its flags ("" when off).
func cookieMode(flags uint32) string {
	switch {
	case flags&dataplane.RuleCookieAlways != 0:
		return dataplane.CookiesAlways
	case flags&dataplane.RuleCookieAuto != 0:
		return dataplane.CookiesAuto
	}
	return ""
}

// gateState names a breaker gate as the kernel applies it.
func gateState(g dataplane.Gate) string {
	switch {
	case g.Drop == dataplane.GateAll && g.Probes > 0:
		return "half_open"
	case g.Drop == dataplane.GateAll:
		return "open"
	case g.Drop > 0:
		return "partial"
	}
	return ""
}

func toMemoryStatus(mem []maps.MapMemory) *status.Memory {
	s := &status.Memory{Maps: []status.MapMemory{}}
	for _, m := range mem {
		s.Maps = append(s.Maps, status.MapMemory{
			Name: m.Name, Type: m.Type, KeySize: m.KeySize, ValueSize: m.ValueSize, MaxEntries: m.MaxEntries,
			MemlockBytes: m.Memlock, EstimateBytes: m.Estimate,
		})
		s.MemlockBytes += m.Memlock
		s.EstimateBytes += m.Estimate
	}
	return s
}
