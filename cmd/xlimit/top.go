//go:build linux

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/loader/pinstatus"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// ANSI sequences used by top.
const (
	ansiHome       = "\x1b[H"
	ansiClearBelow = "\x1b[J"
	ansiClearEOL   = "\x1b[K"
	ansiHideCursor = "\x1b[?25l"
	ansiShowCursor = "\x1b[?25h"
	ansiReset      = "\x1b[0m"
	styleBold      = "\x1b[1m"
	styleDim       = "\x1b[2m"
	styleHeader    = "\x1b[1;4m"
	styleDrop      = "\x1b[1;31m"
	styleWouldDrop = "\x1b[1;33m"
	stylePass      = "\x1b[32m"
	styleBad       = "\x1b[1;37;41m"
)

func cmdTop(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "top", "[--iface IF]... [--bpffs DIR] [--interval 1s] [--once]",
		"A live view of every protected interface, read from the pinned maps (no running daemon\n"+
			"is needed): per rule the packets passed, dropped and (shadow) would-be dropped per\n"+
			"second, the rate and burst in force and whether they come from the rules file\n"+
			"(static) or the control loop; per interface all packets by reason per second.\n"+
			"Rates are counter deltas over the interval. Ctrl-C quits.")
	ifaces := fs.StringArray("iface", nil, "interface to show (repeatable; default: every pinned one)")
	bpffs := fs.String("bpffs", loader.DefaultBPFFS, "bpffs mount point")
	interval := fs.Duration("interval", time.Second, "refresh interval")
	once := fs.Bool("once", false, "print one frame after one interval and exit")
	color := fs.String("color", "auto", "highlight with ANSI colours: auto (when stdout is a terminal and NO_COLOR is unset), always or never")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if *interval < 10*time.Millisecond {
		return fmt.Errorf("%w: --interval must be at least 10ms", errUsage)
	}
	tty := isTerminal(e.stdout)
	var colors bool
	switch *color {
	case "auto":
		colors = tty && os.Getenv("NO_COLOR") == ""
	case "always":
		colors = true
	case "never":
	default:
		return fmt.Errorf("%w: --color must be auto, always or never", errUsage)
	}
	t := &topView{bpffs: *bpffs, ifaces: *ifaces, interval: *interval, colors: colors, live: tty && !*once}
	return t.run(ctx, e.stdout, *once)
}

// topView is the state of one `xlimit top`.
type topView struct {
	bpffs    string
	ifaces   []string // empty: every pinned interface, looked up at each sample
	interval time.Duration
	colors   bool // ANSI styles
	live     bool // redraw in place (a terminal, not --once)
	host     string
}

// topSample is one reading of every interface's counters.
type topSample struct {
	at     time.Time
	ifaces []ifaceSample
}

type ifaceSample struct {
	name string
	st   ifaceStatus
	err  error
}

func (t *topView) run(ctx context.Context, w io.Writer, once bool) error {
	t.host, _ = os.Hostname()
	prev, err := t.sample()
	if err != nil {
		return err
	}
	if t.live {
		fmt.Fprint(w, ansiHideCursor)
		defer fmt.Fprint(w, ansiShowCursor)
		t.draw(w, t.frame(prev, nil))
	}
	tick := time.NewTicker(t.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		cur, err := t.sample()
		if err != nil {
			return err
		}
		t.draw(w, t.frame(cur, &prev))
		prev = cur
		if once {
			var errs []error
			for _, is := range cur.ifaces {
				errs = append(errs, is.err)
			}
			return errors.Join(errs...)
		}
	}
}

// sample reads every interface's status (pinstatus.Read, as `xlimit status`).
func (t *topView) sample() (topSample, error) {
	s := topSample{at: time.Now()}
	names := t.ifaces
	if len(names) == 0 {
		var err error
		if names, err = loader.Pinned(t.bpffs); err != nil {
			return s, err
		}
	}
	for _, name := range names {
		st, err := pinstatus.Read(t.bpffs, name)
		s.ifaces = append(s.ifaces, ifaceSample{name: name, st: st, err: err})
	}
	return s, nil
}

// draw writes a frame: in place on a live terminal (home, overwrite each
// line, clear the rest), else as a block followed by a blank line.
func (t *topView) draw(w io.Writer, frame string) {
	if !t.live {
		fmt.Fprintln(w, frame)
		return
	}
	var b strings.Builder
	b.WriteString(ansiHome)
	for line := range strings.Lines(frame) {
		b.WriteString(strings.TrimSuffix(line, "\n"))
		b.WriteString(ansiClearEOL + "\n")
	}
	b.WriteString(ansiClearBelow)
	io.WriteString(w, b.String())
}

// frame renders cur, with rates from the deltas since prev (nil: no rates
// yet).
func (t *topView) frame(cur topSample, prev *topSample) string {
	var b strings.Builder
	title := "xlimit top"
	if t.host != "" {
		title += " @ " + t.host
	}
	fmt.Fprintf(&b, "%s   %s   every %v", t.style(styleBold, title), cur.at.Format("2006-01-02 15:04:05 MST"), t.interval)
	var dt float64
	if prev != nil {
		dt = cur.at.Sub(prev.at).Seconds()
	} else {
		b.WriteString("   (rates after the first interval)")
	}
	b.WriteString("\n")
	if len(cur.ifaces) == 0 {
		fmt.Fprintf(&b, "\nxlimit is not attached anywhere (no pins under %s/xlimit)\n", t.bpffs)
	}
	for _, is := range cur.ifaces {
		var before *ifaceStatus
		if prev != nil {
			for i := range prev.ifaces {
				if p := &prev.ifaces[i]; p.name == is.name && p.err == nil && p.st.LinkID == is.st.LinkID {
					before = &p.st
				}
			}
		}
		t.ifaceFrame(&b, &is, before, dt)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func (t *topView) ifaceFrame(b *strings.Builder, is *ifaceSample, prev *ifaceStatus, dt float64) {
	st := &is.st
	if prev != nil && prev.CountersReadNS != 0 && st.CountersReadNS > prev.CountersReadNS {
		// The interval between the two counter reads, not between the
		// samples: reading the rest of a status can take long on a busy
		// host.
		dt = float64(st.CountersReadNS-prev.CountersReadNS) / 1e9
	}
	b.WriteString("\n")
	if is.err != nil {
		fmt.Fprintf(b, "%s  %s\n", t.style(styleBold, is.name), t.badge("ERROR"))
		fmt.Fprintf(b, "  %v\n", is.err)
		return
	}
	state := t.style(stylePass, "attached")
	if !st.Attached {
		state = t.badge("NOT ATTACHED") + " (pins only: nothing is enforced)"
	}
	fmt.Fprintf(b, "%s  %s | program %d | link %d | generation %d\n",
		t.style(styleBold, st.Iface), state, st.ProgramID, st.LinkID, st.Generation)
	b.WriteString("\n")

	cols := []topColumn{
		{title: "RULE"}, {title: "UNIT"}, {title: "SOURCE"},
		{title: "RATE/s", right: true}, {title: "BURST", right: true},
		{title: "PASS/s", right: true}, {title: "DROP/s", right: true}, {title: "WOULD_DROP/s", right: true},
	}
	var rows [][]topCell
	for _, r := range st.Rules {
		var pr *ruleStatus
		if prev != nil {
			for i := range prev.Rules {
				if p := &prev.Rules[i]; p.Slot == r.Slot && p.Name == r.Name {
					pr = p
				}
			}
		}
		name := r.Name
		if r.Shadow {
			name += " (shadow)"
		}
		var before map[string]uint64
		if pr != nil {
			before = pr.Counters.Packets
		}
		rows = append(rows, []topCell{
			{text: name}, {text: r.Unit}, {text: r.RateSource},
			{text: formatNumber(r.Rate)}, {text: formatNumber(r.Burst)},
			t.rateCell(r.Counters.Packets, before, "pass", dt, ""),
			t.rateCell(r.Counters.Packets, before, "drop", dt, styleDrop),
			t.rateCell(r.Counters.Packets, before, "would_drop", dt, styleWouldDrop),
		})
	}
	if len(st.Rules) == 0 {
		rows = append(rows, []topCell{{text: "(no rules)", style: styleDim}, {}, {}, {}, {}, {}, {}, {}})
	}
	var beforePackets, beforeReasons map[string]uint64
	if prev != nil {
		beforePackets, beforeReasons = prev.Total.Packets, prev.Total.Reasons
	}
	rows = append(rows, []topCell{
		{text: "all packets", style: styleBold}, {}, {}, {}, {},
		t.rateCell(st.Total.Packets, beforePackets, "pass", dt, ""),
		t.rateCell(st.Total.Packets, beforePackets, "drop", dt, styleDrop),
		t.rateCell(st.Total.Packets, beforePackets, "would_drop", dt, styleWouldDrop),
	})
	t.table(b, "  ", cols, rows)
	t.sourcesFrame(b, st, prev, dt)

	// Every reason the interface has seen, with its rate.
	var reasons [][]topCell
	for r := range dataplane.ReasonMax {
		if _, seen := st.Total.Reasons[r.String()]; !seen {
			continue
		}
		verdict, style := "pass", ""
		if r.IsDrop() {
			verdict, style = "drop", styleDrop
		}
		reasons = append(reasons, []topCell{
			{text: r.String()}, {text: verdict},
			t.rateCell(st.Total.Reasons, beforeReasons, r.String(), dt, style),
			{text: formatCount(float64(st.Total.Reasons[r.String()]))},
		})
	}
	if len(reasons) > 0 {
		b.WriteString("\n")
		t.table(b, "  ", []topColumn{{title: "REASON"}, {title: "VERDICT"}, {title: "PACKETS/s", right: true}, {title: "TOTAL", right: true}}, reasons)
	}
}

// maxTopSources is how many of the most dropped sources top lists per
// interface.
const maxTopSources = 10

// sourcesFrame lists the sources that per-source limits dropped most,
// busiest first (by drops per second, then in total).
func (t *topView) sourcesFrame(b *strings.Builder, st, prev *ifaceStatus, dt float64) {
	type srcRow struct {
		rule, prefix string
		rate         float64 // -1: unknown (not among the top sources before)
		total        uint64
		banned       bool
	}
	var list []srcRow
	for _, r := range st.Rules {
		if r.PerSource == nil {
			continue
		}
		before := map[string]uint64{}
		known := false
		if prev != nil && dt > 0 {
			for _, p := range prev.Rules {
				if p.Slot == r.Slot && p.Name == r.Name && p.PerSource != nil {
					known = true
					for _, src := range p.PerSource.TopSources {
						before[src.Prefix] = src.Drops
					}
				}
			}
		}
		for _, src := range r.PerSource.TopSources {
			row := srcRow{rule: r.Name, prefix: src.Prefix, rate: -1, total: src.Drops, banned: src.Banned}
			if was, ok := before[src.Prefix]; known && ok && was <= src.Drops {
				row.rate = float64(src.Drops-was) / dt
			}
			list = append(list, row)
		}
	}
	if len(list) == 0 {
		return
	}
	slices.SortStableFunc(list, func(a, b srcRow) int {
		return cmp.Or(cmp.Compare(b.rate, a.rate), cmp.Compare(b.total, a.total))
	})
	rows := make([][]topCell, 0, maxTopSources)
	for _, s := range list[:min(len(list), maxTopSources)] {
		rate := topCell{text: "-"}
		if s.rate >= 0 {
			rate = topCell{text: formatCount(s.rate)}
			if s.rate > 0 {
				rate.style = styleDrop
			}
		}
		state := ""
		if s.banned {
			state = "banned"
		}
		rows = append(rows, []topCell{{text: s.prefix}, {text: s.rule}, rate, {text: formatCount(float64(s.total))}, {text: state, style: styleDrop}})
	}
	b.WriteString("\n")
	t.table(b, "  ", []topColumn{{title: "TOP DROPPED SOURCES"}, {title: "RULE"}, {title: "DROP/s", right: true}, {title: "TOTAL", right: true}, {title: ""}}, rows)
}

// rateCell is the per-second rate of counter key between before and cur,
// styled when positive; "-" without a previous reading (before is nil) or
// after a reset.
func (t *topView) rateCell(cur, before map[string]uint64, key string, dt float64, style string) topCell {
	if before == nil || dt <= 0 {
		return topCell{text: "-"}
	}
	now, was := cur[key], before[key]
	if now < was {
		return topCell{text: "-"} // counters were reset (re-attached)
	}
	rate := float64(now-was) / dt
	c := topCell{text: formatCount(rate)}
	if rate > 0 {
		c.style = style
	}
	return c
}

type topColumn struct {
	title string
	right bool
}

type topCell struct {
	text  string
	style string // ANSI SGR sequence, applied when colours are on
}

// table writes an aligned table; widths count runes of the plain text, so
// the styles do not disturb the alignment.
func (t *topView) table(b *strings.Builder, indent string, cols []topColumn, rows [][]topCell) {
	width := make([]int, len(cols))
	for i, c := range cols {
		width[i] = utf8.RuneCountInString(c.title)
	}
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], utf8.RuneCountInString(c.text))
		}
	}
	line := func(cells []topCell) {
		var l strings.Builder
		l.WriteString(indent)
		for i, c := range cells {
			if i > 0 {
				l.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c.text))
			text := t.style(c.style, c.text)
			if cols[i].right {
				l.WriteString(pad + text)
			} else if i < len(cells)-1 {
				l.WriteString(text + pad)
			} else {
				l.WriteString(text)
			}
		}
		b.WriteString(strings.TrimRight(l.String(), " ") + "\n")
	}
	header := make([]topCell, len(cols))
	for i, c := range cols {
		header[i] = topCell{text: c.title, style: styleHeader}
	}
	line(header)
	for _, row := range rows {
		line(row)
	}
}

// badge is an alarm: white on red with colours, the bare text without.
func (t *topView) badge(text string) string {
	if !t.colors {
		return text
	}
	return styleBad + " " + text + " " + ansiReset
}

func (t *topView) style(style, text string) string {
	if !t.colors || style == "" || text == "" {
		return text
	}
	return style + text + ansiReset
}

// formatCount rounds to an integer with thousands separators.
func formatCount(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return groupThousands(strconv.FormatFloat(math.Round(v), 'f', 0, 64))
}

// formatNumber prints a configured rate or burst: whole numbers (and
// anything from 1000 up) with thousands separators, smaller fractions with
// up to four significant digits.
func formatNumber(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) || v == math.Trunc(v) || math.Abs(v) >= 1000 {
		return formatCount(v)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// groupThousands inserts commas into a string of digits (with an optional
// leading minus sign).
func groupThousands(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
