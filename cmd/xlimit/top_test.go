//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/daemon"
	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

func TestFormatNumbers(t *testing.T) {
	for _, tc := range []struct {
		v          float64
		count, num string
	}{
		{0, "0", "0"},
		{7, "7", "7"},
		{999.4, "999", "999.4"},
		{999.6, "1,000", "999.6"},
		{1000, "1,000", "1,000"},
		{1234567.8, "1,234,568", "1,234,568"},
		{-1234, "-1,234", "-1,234"},
		{0.5, "1", "0.5"},
		{0.001, "0", "0.001"},
		{12.345678, "12", "12.35"},
		{1.25e10, "12,500,000,000", "12,500,000,000"},
		{math.NaN(), "-", "-"},
	} {
		if got := formatCount(tc.v); got != tc.count {
			t.Errorf("formatCount(%v) = %q, want %q", tc.v, got, tc.count)
		}
		if got := formatNumber(tc.v); got != tc.num {
			t.Errorf("formatNumber(%v) = %q, want %q", tc.v, got, tc.num)
		}
	}
}

func counters(pass, drop, would uint64, reasons map[string]uint64) counterStatus {
	return counterStatus{
		Packets: map[string]uint64{"pass": pass, "drop": drop, "would_drop": would},
		Bytes:   map[string]uint64{"pass": pass * 100, "drop": drop * 100, "would_drop": would * 100},
		Reasons: reasons,
	}
}

// topSamples are two readings two seconds apart: udp-service passes
// 1,000/s and drops 19,000/s; web (shadow) would drop 50/s.
func topSamples() (prev, cur topSample) {
	t0 := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	mk := func(at time.Time, k uint64) topSample {
		return topSample{at: at, ifaces: []ifaceSample{{name: "eth0", st: ifaceStatus{
			Iface: "eth0", PinDir: "/sys/fs/bpf/xlimit/eth0", Attached: true, Ifindex: 2, ProgramID: 41, LinkID: 7, Generation: 1,
			Rules: []ruleStatus{
				{Slot: 0, Name: "udp-service", Unit: "packets", Rate: 1000, Burst: 1000, RateSource: "static",
					Counters: counters(5000+1000*k, 100+19000*k, 0, nil),
					PerSource: &perSourceStatus{Rate: 100, Burst: 100, PrefixV4: 32, PrefixV6: 64, TopSources: []sourceStatus{
						{Prefix: "198.18.0.1/32", Drops: 90 + 15000*k}, {Prefix: "198.18.0.9/32", Drops: 10 + 4000*k, Banned: true}}}},
				{Slot: 1, Name: "web", Unit: "bytes", Rate: 1.25e6, Burst: 65535, RateSource: "control", Shadow: true,
					Counters: counters(300*k, 0, 50*k, nil)},
			},
			Total: counters(6000+1300*k, 100+19000*k, 0, map[string]uint64{"admit": 5000 + 1000*k, "no_rule": 1000 + 300*k, "rule": 100 + 19000*k}),
		}}}}
	}
	return mk(t0, 0), mk(t0.Add(2*time.Second), 2)
}

var ansiRE = regexp.MustCompile("\x1b\\[[0-9;?]*[A-Za-z]")

func TestTopFrame(t *testing.T) {
	prev, cur := topSamples()
	v := &topView{bpffs: "/sys/fs/bpf", interval: time.Second, host: "web-7"}
	plain := v.frame(cur, &prev)
	t.Logf("frame:\n%s", plain)
	if strings.Contains(plain, "\x1b") {
		t.Fatalf("plain frame has escape sequences")
	}
	lines := strings.Split(plain, "\n")
	find := func(prefix string) string {
		for _, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), prefix) {
				return l
			}
		}
		t.Fatalf("no line starting with %q in\n%s", prefix, plain)
		return ""
	}
	if !strings.HasPrefix(lines[0], "xlimit top @ web-7   2026-01-02 15:04:07 UTC   every 1s") {
		t.Errorf("title %q", lines[0])
	}
	if l := find("eth0"); !strings.Contains(l, "attached | program 41 | link 7 | generation 1") {
		t.Errorf("interface line %q", l)
	}
	header := find("RULE")
	// Right-aligned numbers end under the end of their column's title.
	endOf := func(line, s string) int {
		i := strings.Index(line, s)
		if i < 0 {
			t.Fatalf("%q not in %q", s, line)
		}
		return i + len(s)
	}
	for _, tc := range []struct{ prefix, title, value string }{
		{"udp-service", "PASS/s", "1,000"},
		{"udp-service", "DROP/s", "19,000"},
		{"udp-service", "RATE/s", "1,000"},
		{"web (shadow)", "WOULD_DROP/s", "50"},
		{"web (shadow)", "RATE/s", "1,250,000"},
		{"web (shadow)", "BURST", "65,535"},
		{"all packets", "PASS/s", "1,300"},
		{"all packets", "DROP/s", "19,000"},
	} {
		row, end := find(tc.prefix), endOf(header, tc.title)
		if end > len(row) || row[end-len(tc.value):end] != tc.value || end < len(row) && row[end] != ' ' {
			t.Errorf("%s: %s %q does not end under the title (column %d)\n%s\n%s", tc.prefix, tc.title, tc.value, end, header, row)
		}
	}
	if f := strings.Fields(find("web (shadow)")); f[3] != "control" || f[2] != "bytes" {
		t.Errorf("web row %q", f)
	}
	for _, tc := range []struct{ reason, want string }{
		{"admit", "admit  pass   1,000  7,000"},
		{"no_rule", "no_rule  pass   300  1,600"},
		{"rule", "rule  drop   19,000  38,100"},
	} {
		if got := strings.Join(strings.Fields(find(tc.reason+" ")), "  "); got != strings.Join(strings.Fields(tc.want), "  ") {
			t.Errorf("reason %s: %q, want %q", tc.reason, got, tc.want)
		}
	}
	src := find("TOP DROPPED SOURCES")
	if a, b := find("198.18.0.1/32"), find("198.18.0.9/32"); strings.Index(plain, a) > strings.Index(plain, b) ||
		!strings.Contains(a, "15,000  30,090") || !strings.Contains(b, "4,000   8,010  banned") || endOf(src, "DROP/s") != endOf(a, "15,000") {
		t.Errorf("top sources:\n%s\n%s\n%s", src, a, b)
	}

	// With colours: drops (and would-drops) above zero are highlighted, and
	// without the escape sequences the frame is the plain one.
	v.colors = true
	colored := v.frame(cur, &prev)
	if got := ansiRE.ReplaceAllString(colored, ""); got != plain {
		t.Errorf("coloured frame differs from the plain one without its escapes:\n%s", got)
	}
	if !strings.Contains(colored, styleDrop+"19,000"+ansiReset) || !strings.Contains(colored, styleWouldDrop+"50"+ansiReset) {
		t.Errorf("drops not highlighted:\n%q", colored)
	}
	for _, l := range strings.Split(colored, "\n") {
		if strings.HasPrefix(strings.TrimSpace(ansiRE.ReplaceAllString(l, "")), "web") && strings.Contains(l, styleDrop) {
			t.Errorf("a zero drop is highlighted: %q", l)
		}
	}

	// The first frame has no rates yet.
	first := (&topView{interval: time.Second}).frame(prev, nil)
	if !strings.Contains(first, "(rates after the first interval)") || strings.Contains(first, "19,000") {
		t.Errorf("first frame:\n%s", first)
	}
	// Counters that went backwards (re-attached) show no rate.
	reset := (&topView{interval: time.Second}).frame(prev, &cur)
	for _, l := range strings.Split(reset, "\n") {
		if f := strings.Fields(l); len(f) == 8 && f[0] == "udp-service" && (f[5] != "-" || f[6] != "-") {
			t.Errorf("rates after a counter reset: %q", l)
		}
	}
}

func TestTopErrorsAndEmpty(t *testing.T) {
	v := &topView{bpffs: "/x", interval: time.Second}
	f := v.frame(topSample{at: time.Now()}, nil)
	if !strings.Contains(f, "not attached anywhere (no pins under /x/xlimit)") {
		t.Errorf("empty frame:\n%s", f)
	}
	f = v.frame(topSample{at: time.Now(), ifaces: []ifaceSample{{name: "eth9", err: errors.New("open pinned maps: no such file")}}}, nil)
	if !strings.Contains(f, "eth9  ERROR") || !strings.Contains(f, "no such file") {
		t.Errorf("error frame:\n%s", f)
	}
	// --once against a bpffs without pins prints the empty frame and succeeds.
	var out, errOut bytes.Buffer
	err := cmdTop(context.Background(), &env{stdout: &out, stderr: &errOut}, []string{"--once", "--interval", "10ms", "--bpffs", t.TempDir()})
	if err != nil || !strings.Contains(out.String(), "not attached anywhere") {
		t.Errorf("top --once without pins: %v\n%s", err, out.String())
	}
	// Named interfaces that have no pins are errors.
	err = cmdTop(context.Background(), &env{stdout: &out, stderr: &errOut}, []string{"--once", "--interval", "10ms", "--bpffs", t.TempDir(), "--iface", "nope0"})
	if err == nil {
		t.Errorf("top --once --iface nope0 succeeded:\n%s", out.String())
	}
}

func TestTopUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--interval", "0"}, {"--interval", "-1s"}, {"--color", "sometimes"}, {"extra"}, {"--bogus"},
	} {
		var out, errOut bytes.Buffer
		if err := cmdTop(context.Background(), &env{stdout: &out, stderr: &errOut}, args); !errors.Is(err, errUsage) {
			t.Errorf("top %v: %v, want a usage error", args, err)
		}
	}
	var out bytes.Buffer
	if err := cmdTop(context.Background(), &env{stdout: &out, stderr: &out}, []string{"--help"}); err == nil || !strings.Contains(out.String(), "Usage: xlimit top") {
		t.Errorf("top --help: %v %q", err, out.String())
	}
}

// fill sets every field reachable from v to a non-zero value, so that
// omitempty hides nothing.
func fill(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i))
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem())
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fill(v.Index(0))
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(k)
		fill(e)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(3)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(3)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(1.5)
	}
}

// TestStatusSchemaMatchesAPI: `xlimit status --json` and the API's
// GET /v1/status have one schema, field for field, both ways.
func TestStatusSchemaMatchesAPI(t *testing.T) {
	roundTrip := func(from, to any) {
		t.Helper()
		fill(reflect.ValueOf(from).Elem())
		a, err := json.Marshal(from)
		if err != nil {
			t.Fatal(err)
		}
		dec := json.NewDecoder(bytes.NewReader(a))
		dec.DisallowUnknownFields()
		if err := dec.Decode(to); err != nil {
			t.Fatalf("%T -> %T: %v", from, to, err)
		}
		b, _ := json.Marshal(to)
		if !bytes.Equal(a, b) {
			t.Errorf("%T -> %T changes the JSON:\n%s\n%s", from, to, a, b)
		}
	}
	roundTrip(&statusReport{}, &api.StatusReport{})
	roundTrip(&api.StatusReport{}, &statusReport{})
}

// TestTopEndToEnd attaches the real program in a lab, floods a rule at a
// known rate and checks what `xlimit top --once` shows. The rates are
// small (5000/s offered against 1000/s) so that any machine's generator
// reaches them: the test judges top against the rate it saw, never skips.
func TestTopEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and attaches XDP (CI runs it as root)")
	}
	const limit, offered, port = 1000.0, 5000.0, 9000
	l, err := lab.New(lab.Options{Prefix: "xltop"})
	if err != nil {
		t.Fatal(err)
	}
	bpffs := filepath.Join(t.TempDir(), "bpffs")
	if err := loader.EnsureBPFFS(bpffs); err != nil {
		l.Close()
		t.Fatal(err)
	}
	var a *loader.Attachment
	t.Cleanup(func() {
		if a != nil {
			if err := a.Close(); err != nil {
				t.Errorf("close attachment: %v", err)
			}
		}
		if err := loader.Detach(bpffs, l.ServerIf); err != nil {
			t.Errorf("detach: %v", err)
		}
		if err := unix.Unmount(bpffs, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	if err := l.Server.Do(func() error {
		var err error
		a, err = loader.Attach(l.ServerIf, loader.Options{BPFFS: bpffs})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("top.yaml", []byte("rules:\n  - name: udp-service\n    protocol: udp\n    ports: [9000]\n    rate: 1000\n    burst: 100\n"))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := dataplane.Compile(daemon.Translate(cfg).Dataplane, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Tables().Apply(plan); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	spec := l.ClientFlood(false)
	spec.Proto, spec.DstPort, spec.PayloadLen, spec.Rate, spec.Duration = lab.ProtoUDP, port, 64, offered, 4*time.Second
	type result struct {
		res lab.FloodResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := lab.Flood(ctx, spec)
		done <- result{res, err}
	}()
	// Past the burst, into the steady state: the rule has dropped for a
	// while (half a second of drops at the offered rate).
	slot := plan.Slot("udp-service")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := a.Tables().Counters(slot)
		if err != nil {
			t.Fatalf("read counters: %v", err)
		}
		if c.Packets[dataplane.VerdictDrop] >= uint64((offered-limit)/2) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood has not pushed the rule into dropping within 10 s: counters %+v", c)
		}
	}

	var out, errOut bytes.Buffer
	err = cmdTop(ctx, &env{stdout: &out, stderr: &errOut}, []string{"--once", "--interval", "1s", "--bpffs", bpffs, "--iface", l.ServerIf})
	r := <-done
	t.Logf("xlimit top --once:\n%s", out.String())
	if err != nil {
		t.Fatalf("top: %v (%s)", err, errOut.String())
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	pps := r.res.PPS()
	t.Logf("flood: %d packets in %v = %.0f/s offered", r.res.Sent, r.res.Elapsed, pps)
	if pps < 2*limit {
		t.Fatalf("the generator reached only %.0f of %.0f packets/s, under twice the limit %.0f: nothing to judge top by", pps, offered, limit)
	}

	var row, total []string
	for line := range strings.Lines(out.String()) {
		switch f := strings.Fields(line); {
		case len(f) > 0 && f[0] == "udp-service":
			row = f
		case len(f) > 1 && f[0] == "all" && f[1] == "packets":
			total = f
		}
	}
	if len(row) != 8 || len(total) < 5 {
		t.Fatalf("no udp-service or total row in:\n%s", out.String())
	}
	num := func(s string) float64 {
		v, err := strconv.ParseFloat(strings.ReplaceAll(s, ",", ""), 64)
		if err != nil {
			t.Fatalf("not a number: %q", s)
		}
		return v
	}
	if row[1] != "packets" || row[2] != "static" || num(row[3]) != limit || num(row[4]) != 100 {
		t.Errorf("rule columns: %q", row)
	}
	pass, drop, would := num(row[5]), num(row[6]), num(row[7])
	if math.Abs(pass-limit) > 0.1*limit {
		t.Errorf("pass/s %.0f, want about the limit %.0f", pass, limit)
	}
	if want := pps - limit; math.Abs(drop-want) > 0.15*pps {
		t.Errorf("drop/s %.0f, want about %.0f (offered %.0f/s - limit %.0f/s)", drop, want, pps, limit)
	}
	if would != 0 {
		t.Errorf("would_drop/s %.0f on a rule without shadow", would)
	}
	if td := num(total[len(total)-2]); math.Abs(td-drop) > 0.01*drop+5 {
		t.Errorf("interface drop/s %.0f, rule drop/s %.0f: %q", td, drop, total)
	}
	if !regexp.MustCompile(`(?m)^\s+rule\s+drop\s+[0-9,]+\s+[0-9,]+$`).MatchString(out.String()) {
		t.Errorf("no 'rule' reason row:\n%s", out.String())
	}
}
