//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// writeReport writes base.md (the tables) and base.json (every cell's raw
// summaries).
func writeReport(base string, f facts, cells []*cell, o options) error {
	raw, err := json.MarshalIndent(struct {
		Facts facts   `json:"facts"`
		Cells []*cell `json:"cells"`
	}{f, cells}, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(base+".json", raw, 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("# make bench-http: nginx → a Go app with a bounded pool, vegeta, side by side (issue 42)")
	w("")
	w("- commit: `%s` (`%s`), xlimit built from `%s`; kernel %s; %d CPUs; nginx %s", f.Commit, f.Describe, f.XlimitCommit, f.Kernel, f.CPUs, f.Nginx)
	if f.ClientXDP {
		w("- the client end of the veth pair runs an XDP program that passes every frame but those to the flood's sources (XDP_TX answers delivered at once, as by a real NIC)")
	} else {
		w("- the client end of the veth pair runs no XDP program (-client-xdp=false): XDP_TX answers may wait in its ring")
	}
	w("- started %s, ended %s; load average before %s, after %s", f.Started, orDash(f.Ended), f.LoadBefore, orDash(f.LoadAfter))
	if len(f.Strangers) > 0 || len(f.StrangersAfter) > 0 {
		w("- **processes this run did not start** (may falsify figures): before %s, after %s", strings.Join(f.Strangers, " "), strings.Join(f.StrangersAfter, " "))
	} else {
		w("- no nginx, trafgen, vegeta, wrk or app process but this run's (checked before, after each cell, at the end)")
	}
	if f.Recreated > 0 {
		w("- **the veth pair stopped carrying traffic to the client %d time(s)** and was made again before the next cell (the cells it happened in are marked `wedged`; their figures are not the variant's)", f.Recreated)
	}
	w("- the app: %d workers × %v, requests beyond the pool wait inside it; **measured capacity C = %.0f requests/s** (keep-alive load at 1.5× nominal, served between 2 s and 7 s)", appPool, appWork, f.Capacity)
	w("- the client: vegeta v12.13.0 as a library (tests/realhost/cmd/load), open loop, request timeout %v and dial timeout %v; keep-alive off: a new connection per request, no pool cap (each request is its own client); keep-alive on: net/http's pool, at most %d connections (MaxConnsPerHost), %d idle kept", timeout, timeout, kaConns, kaIdle)
	w("- each cell: %.1f×C for %v, then the step (2× or 10× C) for %v, then %.1f×C for %v; the figures are of the requests that left during the step. A fresh xlimit daemon per cell.", lowShare, lowDur, highDur, lowShare, lowDur)
	w("- columns: sent/s is the offered rate achieved; goodput the 2xx answers per second of the step; p50/p99 of the 2xx; refused p99 the time until a refused request (reset, refused connection, 5xx) failed; timeouts the client's (%v, the dial's included); other errors those neither a refusal nor a timeout (the raw JSON names them); app queue the most requests that waited inside the app at once; cpu the machine's busy share over the cell", timeout)
	w("")
	w("Variants:")
	w("")
	for _, v := range variants(o.example) {
		w("- `%s`: %s", v.Name, v.What)
	}
	w("")
	for _, flood := range []bool{false, true} {
		for _, ka := range []bool{false, true} {
			for _, m := range split(o.mults) {
				var group []*cell
				for _, c := range cells {
					if c.Flood == flood && c.KeepAlive == ka && fmt.Sprint(c.Mult) == m {
						group = append(group, c)
					}
				}
				if len(group) == 0 {
					continue
				}
				title := fmt.Sprintf("## %s×, keep-alive %s", m, onOff(ka))
				if flood {
					title += ", spoofed SYN flood running"
				}
				w("%s", title)
				w("")
				hdr := "| variant | sent/s | goodput/s | of C | p50 ms | p99 ms | refused p99 ms | timeouts | resets | 503s | other errors | app queue | cpu | load avg |"
				sep := "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
				if flood {
					hdr += " flood sent/s | rx at server/s | XDP_TX | XDP_TX per packet received |"
					sep += "---|---|---|---|"
				}
				w("%s target |", hdr)
				w("%s---|", sep)
				ref := find(group, "nginx-limit_conn")
				for _, c := range group {
					ov := c.Overload
					if ov == nil {
						w("| %s | error: %s |", c.Variant, c.Err)
						continue
					}
					refused := "—"
					if ov.Refused > 0 {
						refused = fmt.Sprintf("%.1f", ov.RefusedMs)
					}
					other := 0
					for _, n := range ov.Other {
						other += n
					}
					row := fmt.Sprintf("| %s | %.0f | %.1f | %.0f %% | %.1f | %.1f | %s | %d | %d | %d | %d | %d | %.0f %% | %s |",
						c.Variant, ov.SentRate, ov.Goodput, 100*ov.Goodput/f.Capacity, ov.P50ms, ov.P99ms, refused,
						ov.Timeout, ov.Reset, ov.E503, other, c.MaxQueue, 100*c.CPUBusy, c.LoadAvg)
					if flood {
						row += fmt.Sprintf(" %.0f | %.0f | %d | %.3f |", c.FloodPPS, c.FloodRecv, c.XDPTx, c.PerSYN)
					}
					v := verdict(c, ref, f.Capacity)
					if c.Wedged {
						v = "**wedged** (the lab stopped carrying traffic to the client: " + fmt.Sprint(c.ServerTxDropped) + " server tx drops) " + v
					}
					row += " " + v + " |"
					w("%s", row)
				}
				for _, c := range group {
					if c.Err != "" && c.Overload != nil {
						w("")
						w("(%s: %s)", c.Variant, strings.TrimPrefix(c.Err, "; "))
					}
				}
				w("")
			}
		}
	}
	w("Targets (issue 42, for `xl-example`, docs/examples/http-service.yaml as it ships): goodput ≥ 95 %% of C, p99 ≤ `nginx-limit_conn`'s p99 + 10 ms in the same table, refused p99 ≤ 10 ms, 0 client timeouts; under the flood also at most one packet sent per SYN received.")
	w("")
	w("Raw: `%s.json` (every cell's load summary, the app's stats, `xlimit status`, the rules); log: `%s.log`; the daemon's log of each cell (a line per tick): `%s-xlimit/`.", base, base, base)
	return os.WriteFile(base+".md", []byte(b.String()), 0o644)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func find(cs []*cell, name string) *cell {
	for _, c := range cs {
		if c.Variant == name {
			return c
		}
	}
	return nil
}

// verdict checks the targets for the recommended file's rows.
func verdict(c, ref *cell, capacity float64) string {
	if c.Variant != "xl-example" {
		return ""
	}
	ov := c.Overload
	var miss []string
	if ov.Goodput < 0.95*capacity {
		miss = append(miss, fmt.Sprintf("goodput %.0f %% < 95 %%", 100*ov.Goodput/capacity))
	}
	if ref != nil && ref.Overload != nil && ov.P99ms > ref.Overload.P99ms+10 {
		miss = append(miss, fmt.Sprintf("p99 %.1f > %.1f + 10", ov.P99ms, ref.Overload.P99ms))
	}
	if ov.RefusedMs > 10 {
		miss = append(miss, fmt.Sprintf("refused p99 %.1f > 10", ov.RefusedMs))
	}
	if ov.Timeout > 0 {
		miss = append(miss, fmt.Sprintf("%d timeouts", ov.Timeout))
	}
	if c.Flood && c.PerSYN > 1 {
		miss = append(miss, fmt.Sprintf("%.2f packets per SYN", c.PerSYN))
	}
	if len(miss) == 0 {
		return "met"
	}
	return "MISSED: " + strings.Join(miss, ", ")
}
