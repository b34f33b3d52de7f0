//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/loader/pinstatus"
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
	printFleet(e.stdout, rep.Fleet)
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
		st, err := pinstatus.Read(bpffs, iface)
		if err != nil {
			return rep, err
		}
		rep.Interfaces = append(rep.Interfaces, st)
	}
	return rep, nil
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
		state = "NOT ATTACHED: UNPROTECTED (pins only)"
	}
	fmt.Fprintf(w, "%s: %s, program %d, link %d, generation %d, pins %s\n", st.Iface, state, st.ProgramID, st.LinkID, st.Generation, st.PinDir)
	if st.Dispatcher != 0 {
		fmt.Fprintf(w, "  shares the interface through libxdp's dispatcher %d (xdp-loader status %s):\n", st.Dispatcher, st.Iface)
		for _, p := range st.XDPPrograms {
			who := ""
			if p.Xlimit {
				who = "  <- xlimit"
			}
			fmt.Fprintf(w, "    slot %d  priority %-3d  program %-6d %-16s  next on %s%s\n", p.Slot, p.Priority, p.ID, p.Name, strings.Join(p.ChainActions, ","), who)
		}
	}
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
		if c := r.SynCookies; c != nil {
			fmt.Fprintf(w, "  %s: syn_cookies %s: %d sent, %d validated, %d failed, %d refused (%d with a reset), %d not assigned; unanswered: %d over budget, %d not local, %d unanswerable; %d passed to an existing socket\n",
				r.Name, c.Mode, c.Sent, c.Validated, c.Failed, c.Refused, c.RefusedReset, c.AssignFailed, c.OverBudget, c.NotLocal, c.Unanswerable, c.ToSocket)
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
	if p := st.Preflight; p != nil {
		tx := "XDP_TX used"
		if !p.XDPTx {
			tx = "XDP_TX AVOIDED: SYN cookies are the kernel's, refused SYNs dropped without a reset"
		}
		fmt.Fprintf(w, "  driver preflight: %s\n", tx)
		for _, f := range p.Findings {
			fmt.Fprintf(w, "    %s\n", f)
		}
	}
	if h := st.HostAddrs; h != nil {
		fmt.Fprintf(w, "  host addresses: %d listed", h.Listed)
		if h.Incomplete {
			fmt.Fprintf(w, " (incomplete: the host has more than the map holds or they could not be read; SYNs to the others are not answered from XDP; xlimit_host_addrs_unlisted)")
		}
		if h.Unmaintained {
			fmt.Fprintf(w, " (not maintained: no daemon renews its lease; no SYN is answered from XDP, the kernel answers what the rules admit)")
		}
		fmt.Fprintln(w)
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
