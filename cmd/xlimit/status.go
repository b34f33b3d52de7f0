//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The schema of `xlimit status --json` is the API's (GET /v1/status).
type (
	statusReport    = api.StatusReport
	ifaceStatus     = api.IfaceStatus
	ruleStatus      = api.RuleStatus
	perSourceStatus = api.PerSourceStatus
	sourceStatus    = api.SourceStatus
	counterStatus   = api.CounterStatus
)

func toCounterStatus(c *dataplane.Counters) counterStatus {
	s := counterStatus{Packets: map[string]uint64{}, Bytes: map[string]uint64{}, Reasons: map[string]uint64{}}
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

func cmdStatus(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "status", "[--iface IF] [--json]",
		"Show the rules, the rates in force, the counters and the maps' kernel memory of every\n"+
			"protected interface: from the running daemon's API when one answers, else from the\n"+
			"pinned maps (no daemon needed).")
	ifaces := fs.StringArray("iface", nil, "interface to show (repeatable; default: every one)")
	asJSON := fs.Bool("json", false, "print JSON")
	bpffs := fs.String("bpffs", loader.DefaultBPFFS, "bpffs mount point (given: read these pins, not the API)")
	sock := fs.String("api-socket", "/run/xlimit/api.sock", "the daemon's API socket")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	rep, ok := statusFromAPI(ctx, *sock, *ifaces)
	if !ok || fs.Changed("bpffs") {
		var err error
		if rep, err = statusFromPins(*bpffs, *ifaces); err != nil {
			return err
		}
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	if len(rep.Interfaces) == 0 {
		fmt.Fprintf(e.stdout, "xlimit is not attached anywhere (no pins under %s/xlimit)\n", *bpffs)
		return nil
	}
	for _, st := range rep.Interfaces {
		printStatus(e.stdout, &st)
	}
	return nil
}

// statusFromAPI asks a running daemon; ok is false when none answers.
func statusFromAPI(ctx context.Context, sock string, ifaces []string) (statusReport, bool) {
	if _, err := os.Stat(sock); err != nil {
		return statusReport{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c := api.NewClient(sock)
	defer c.Close()
	rep, err := c.Status(ctx)
	if err != nil {
		return statusReport{}, false
	}
	if len(ifaces) > 0 {
		all := rep.Interfaces
		rep.Interfaces = nil
		for _, st := range all {
			if slices.Contains(ifaces, st.Iface) {
				rep.Interfaces = append(rep.Interfaces, st)
			}
		}
	}
	return rep, true
}

func statusFromPins(bpffs string, names []string) (statusReport, error) {
	var rep statusReport
	if len(names) == 0 {
		var err error
		if names, err = loader.Pinned(bpffs); err != nil {
			return rep, err
		}
	}
	for _, iface := range names {
		st, err := readStatus(bpffs, iface)
		if err != nil {
			return rep, err
		}
		rep.Interfaces = append(rep.Interfaces, st)
	}
	return rep, nil
}

// topSources is how many of the most dropped sources status lists per rule.
const topSources = 10

func readStatus(bpffs, iface string) (ifaceStatus, error) {
	st := ifaceStatus{Iface: iface, PinDir: loader.PinDir(bpffs, iface)}
	ls, err := loader.Inspect(bpffs, iface)
	if err != nil {
		return st, fmt.Errorf("inspect %s: %w", iface, err)
	}
	st.Attached, st.Ifindex, st.ProgramID, st.LinkID = ls.Attached, ls.Ifindex, ls.ProgramID, ls.LinkID
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
	now := monotonicNS()
	for _, slot := range plan.ActiveSlots() {
		r := &plan.Rules[slot]
		rs := ruleStatus{
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
			cs := &api.ConcurrencyStatus{Soft: int(r.ConcSoft), Max: int(r.ConcMax)}
			if c, err := t.Conns(slot); err != nil {
				return st, err
			} else if c.Epoch == r.Epoch {
				cs.InFlight = c.Count
			}
			rs.Concurrency = cs
		}
		if r.Flags&dataplane.RulePerSource != 0 {
			ps := &perSourceStatus{
				Rate: r.Source.Rate(), Burst: r.Source.Burst(),
				PrefixV4: int(r.Prefix4), PrefixV6: int(r.Prefix6), Ban: r.Flags&dataplane.RuleBan != 0,
				TopSources: []sourceStatus{},
			}
			top, err := t.Sources(slot, topSources)
			if err != nil {
				return st, err
			}
			for _, src := range top {
				if src.Drops == 0 || src.Epoch != r.Epoch {
					continue
				}
				ps.TopSources = append(ps.TopSources, sourceStatus{Prefix: src.Prefix.String(), Drops: src.Drops, Banned: src.BannedUntilNS > now})
			}
			rs.PerSource = ps
		}
		st.Rules = append(st.Rules, rs)
	}
	st.Total = toCounterStatus(&counters[dataplane.GlobalSlot])
	mem, err := maps.PinnedMemory(st.PinDir)
	if err != nil {
		return st, err
	}
	st.Memory = toMemoryStatus(mem)
	return st, nil
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

func toMemoryStatus(mem []maps.MapMemory) *api.MemoryStatus {
	s := &api.MemoryStatus{Maps: []api.MapMemory{}}
	for _, m := range mem {
		s.Maps = append(s.Maps, api.MapMemory{
			Name: m.Name, Type: m.Type, KeySize: m.KeySize, ValueSize: m.ValueSize, MaxEntries: m.MaxEntries,
			MemlockBytes: m.Memlock, EstimateBytes: m.Estimate,
		})
		s.MemlockBytes += m.Memlock
		s.EstimateBytes += m.Estimate
	}
	return s
}

// printMemory prints the maps' memory on one line: the total, then the
// largest maps.
func printMemory(w io.Writer, m *api.MemoryStatus) {
	fmt.Fprintf(w, "  memory: %s in %d maps (kernel memlock; estimated %s):", fmtBytes(m.MemlockBytes), len(m.Maps), fmtBytes(m.EstimateBytes))
	for i, mm := range m.Maps {
		if i == 4 {
			fmt.Fprint(w, " …")
			break
		}
		n := mm.MemlockBytes
		if n == 0 {
			n = mm.EstimateBytes
		}
		fmt.Fprintf(w, " %s %s", mm.Name, fmtBytes(n))
	}
	fmt.Fprintln(w)
}

func fmtBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func printStatus(w io.Writer, st *ifaceStatus) {
	state := "attached"
	if !st.Attached {
		state = "NOT ATTACHED (pins only)"
	}
	fmt.Fprintf(w, "%s: %s, program %d, link %d, generation %d, pins %s\n", st.Iface, state, st.ProgramID, st.LinkID, st.Generation, st.PinDir)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rule\trate\tburst\tunit\tsource\tpass\tdrop\twould_drop\t")
	for _, r := range st.Rules {
		name := r.Name
		if r.Shadow {
			name += " (shadow)"
		}
		fmt.Fprintf(tw, "%s\t%.6g\t%.6g\t%s\t%s\t%d\t%d\t%d\t\n", name, r.Rate, r.Burst, r.Unit, r.RateSource,
			r.Counters.Packets["pass"], r.Counters.Packets["drop"], r.Counters.Packets["would_drop"])
	}
	fmt.Fprintf(tw, "(all packets)\t\t\t\t\t%d\t%d\t\t\n", st.Total.Packets["pass"], st.Total.Packets["drop"])
	tw.Flush()
	for _, r := range st.Rules {
		if c := r.Concurrency; c != nil {
			fmt.Fprintf(w, "  %s: %d connections in flight (concurrency soft %d, max %d)\n", r.Name, c.InFlight, c.Soft, c.Max)
		}
		switch r.Breaker {
		case "open":
			fmt.Fprintf(w, "  %s: circuit breaker open: new connections refused at XDP\n", r.Name)
		case "half_open":
			fmt.Fprintf(w, "  %s: circuit breaker half-open: only probe connections pass\n", r.Name)
		case "partial":
			fmt.Fprintf(w, "  %s: circuit breaker: part of the new connections refused\n", r.Name)
		}
	}
	for _, r := range st.Rules {
		ps := r.PerSource
		if ps == nil {
			continue
		}
		fmt.Fprintf(w, "  %s: per source %.6g/s burst %.6g (/%d, /%d)", r.Name, ps.Rate, ps.Burst, ps.PrefixV4, ps.PrefixV6)
		if len(ps.TopSources) == 0 {
			fmt.Fprintln(w, ", no source dropped")
			continue
		}
		fmt.Fprintln(w, ", most dropped:")
		for _, src := range ps.TopSources {
			banned := ""
			if src.Banned {
				banned = " (banned)"
			}
			fmt.Fprintf(w, "    %-43s %12d%s\n", src.Prefix, src.Drops, banned)
		}
	}
	if st.Memory != nil {
		printMemory(w, st.Memory)
	}
	if len(st.Total.Reasons) > 0 {
		fmt.Fprintf(w, "  by reason:")
		for r := range dataplane.ReasonMax {
			if n, ok := st.Total.Reasons[r.String()]; ok {
				fmt.Fprintf(w, " %s=%d", r, n)
			}
		}
		fmt.Fprintln(w)
	}
}
