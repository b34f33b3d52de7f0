//go:build linux

package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/tests/kit/lab"
)

// The soak's limited rule: 1000 packets/s with a burst of 100, so that a
// 100 ms window admits at most 100 + 100 + one packet per CPU.
const (
	soakRate  = 1000
	soakBurst = 100
	soakPort  = 9000
	// soakMetricsAddr is the daemon's metrics address inside the server's
	// network namespace (private to the test).
	soakMetricsAddr = "127.0.0.1:9542"
)

// soakDuration is $XLIMIT_SOAK_DURATION (a Go duration), 2m by default.
func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	s := os.Getenv("XLIMIT_SOAK_DURATION")
	if s == "" {
		return 2 * time.Minute
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 30*time.Second {
		t.Fatalf("XLIMIT_SOAK_DURATION=%q: want a Go duration of at least 30s", s)
	}
	return d
}

// soakRules is a valid rules file; variant 1 adds an allowlist and a
// second rule, so alternating reloads really change the rule set while the
// limited rule stays as it is.
func soakRules(variant int) string {
	s := fmt.Sprintf(`rules:
  - name: udp-flood
    protocol: udp
    ports: [%d]
    rate: %d
    burst: %d
`, soakPort, soakRate, soakBurst)
	if variant == 1 {
		s = "allow: [203.0.113.0/24]\n" + s + `  - name: web
    protocol: tcp
    ports: [8080]
    syn_only: true
    rate: 500
`
	}
	return s
}

const soakInvalidRules = "rules:\n  - name: udp-flood\n    protocol: udp\n    ports: [9000]\n    rate: -5\n"

// TestSoak floods a limited port for the soak duration while the rules are
// reloaded every second (two valid files alternating, every tenth reload an
// invalid one) and the daemon is killed with SIGKILL and restarted every
// 20 s, except in the last minute (half the soak at most), which one daemon
// lives through; each new daemon adopts the pins. Throughout, every 100 ms window of
// admitted packets (the receiver's kernel timestamps) stays within
// rate × 100 ms + burst + one packet per CPU (docs/dataplane.md), and so do
// the pinned pass counters sampled every 100 ms. Within each daemon's life
// its open file descriptors and goroutines (go_goroutines from /metrics)
// do not grow across reloads, and over the long last life the least-squares
// slope of its goroutines per reload stays below 1/30 (a leak of one per 30
// reloads or faster fails); each restart frees the previous program; and
// after cleanup no BPF program, map or link the daemons used, no pin and no
// namespace of the test is left.
func TestSoak(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("soak: skipped with -short")
	}
	dur := soakDuration(t)

	// Registered before newEnv, so it runs after the env's cleanup
	// (detach, unmount, namespaces removed).
	var objs bpfObjects
	var nsPaths []string
	var nsInodes []uint64
	t.Cleanup(func() { checkNothingLeft(t, &objs, nsPaths, nsInodes) })

	e := newEnv(t)
	for _, ns := range []*lab.NS{e.lab.Client, e.lab.Server} {
		var st syscall.Stat_t
		if err := syscall.Stat(ns.Path, &st); err != nil {
			t.Fatal(err)
		}
		nsPaths, nsInodes = append(nsPaths, ns.Path), append(nsInodes, st.Ino)
	}
	sink, err := lab.ListenUDPCounter(e.lab.Server, netip.AddrPortFrom(e.lab.ServerIP4, soakPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sink.Close() })

	rules := filepath.Join(e.dir, "rules.yaml")
	writeFileAtomic(t, rules, soakRules(0))
	start := func() *daemon { return e.startDaemon(rules, "--metrics-addr", soakMetricsAddr) }
	d := start()
	pinDir := loader.PinDir(e.bpffs, e.lab.ServerIf)
	pins := pinNames(t, pinDir)
	for _, want := range append(maps.PinnedNames(), "link") {
		if !slices.Contains(pins, want) {
			t.Errorf("pin %s missing after the first start: %v", want, pins)
		}
	}
	objs.add(t, pinDir)
	progs := objs.programs(t, pinDir)
	tab, err := maps.OpenPinned(pinDir, true)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := tab.ReadPlan()
	if err != nil {
		tab.Close()
		t.Fatal(err)
	}
	slot := plan.Slot("udp-flood")

	// The flood and the pinned-counter sampler run for the whole soak.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var flood lab.FloodResult
	var floodErr error
	fs := e.lab.ClientFlood(false)
	fs.Proto, fs.DstPort, fs.PayloadLen, fs.Rate, fs.Duration = lab.ProtoUDP, soakPort, 64, 20000, dur
	wg.Add(2)
	go func() {
		defer wg.Done()
		flood, floodErr = lab.Flood(ctx, fs)
	}()
	// A sample's packets passed between the previous sample's from and
	// its own to: the read itself takes time and may be preempted.
	type sample struct {
		from, to time.Time
		pass     uint64
	}
	var samples []sample
	var sampleErr error
	go func() {
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		end := time.Now().Add(dur)
		for time.Now().Before(end) {
			from := time.Now()
			c, err := tab.Counters(slot)
			if err != nil {
				sampleErr = err
				return
			}
			samples = append(samples, sample{from, time.Now(), c.Packets[0]})
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	// The reload and restart schedule.
	t0 := time.Now()
	reloads, invalid, refused, restarts := 0, 0, 0, 0
	type life struct{ fds, goroutines []int }
	lives := []*life{{}}
	cur := lives[0]
	nextRestart := t0.Add(20 * time.Second)
	// The last daemon lives longLife, long enough for a slope.
	longLife := min(time.Minute, dur/2)
	noRestartAfter := t0.Add(dur - longLife)
	for i := 1; time.Since(t0) < dur; i++ {
		time.Sleep(time.Until(t0.Add(time.Duration(i) * time.Second)))
		if time.Since(t0) >= dur {
			break
		}
		if time.Now().After(nextRestart) && !nextRestart.After(noRestartAfter) {
			if err := d.signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			writeFileAtomic(t, rules, soakRules(restarts%2))
			d = start()
			restarts++
			nextRestart = nextRestart.Add(20 * time.Second)
			if !strings.Contains(d.Log(), "adopted=true") {
				t.Errorf("restart %d: the new daemon did not adopt the pins:\n%s", restarts, d.Log())
			}
			objs.add(t, pinDir)
			now := objs.programs(t, pinDir)
			for _, id := range progs {
				if !slices.Contains(now, id) && !waitGone(func() bool { return bpftoolHas("prog", id) }) {
					t.Errorf("restart %d: program %d of the killed daemon still exists", restarts, id)
				}
			}
			progs = now
			cur = &life{}
			lives = append(lives, cur)
			continue
		}
		text := soakRules(i % 2)
		if i%10 == 0 {
			text = soakInvalidRules
		}
		// The daemon also watches the file, so one write may reload
		// twice; either way the outcome must be logged.
		outcome := "msg=reloaded"
		if text == soakInvalidRules {
			outcome = "reload failed"
			invalid++
		}
		before := strings.Count(d.Log(), outcome)
		writeFileAtomic(t, rules, text)
		if err := d.signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(900 * time.Millisecond)
		for strings.Count(d.Log(), outcome) == before && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		reloads++
		if strings.Count(d.Log(), outcome) == before {
			t.Errorf("reload %d: the daemon did not log %q within 900 ms", reloads, outcome)
		} else if text == soakInvalidRules {
			refused++
		}
		pid := d.cmd.Process.Pid
		cur.fds = append(cur.fds, countFDs(t, pid))
		cur.goroutines = append(cur.goroutines, e.goroutines(t))
	}
	cancel()
	wg.Wait()
	tab.Close()
	if floodErr != nil {
		t.Errorf("flood: %v", floodErr)
	}
	if sampleErr != nil {
		t.Errorf("sample counters: %v", sampleErr)
	}
	sink.Settle(200*time.Millisecond, 3*time.Second)

	// The limit, in every 100 ms window of the receiver's timestamps.
	const window = 100 * time.Millisecond
	bound := soakRate*window.Seconds() + soakBurst + float64(2*max(1, soakRate*50e-6))
	stamps := sink.Timestamps()
	worst, worstAt := 0, time.Time{}
	gap, gapAt := time.Duration(0), time.Time{} // longest time without an admitted packet
	for i := 1; i < len(stamps); i++ {
		if d := stamps[i].Sub(stamps[i-1]); d > gap {
			gap, gapAt = d, stamps[i-1]
		}
	}
	steady, steadyAt := 0, time.Time{} // after the first second's burst
	for i, j := 0, 0; i < len(stamps); i++ {
		for j < len(stamps) && stamps[j].Sub(stamps[i]) < window {
			j++
		}
		if j-i > worst {
			worst, worstAt = j-i, stamps[i]
		}
		if j-i > steady && stamps[i].Sub(t0) > time.Second {
			steady, steadyAt = j-i, stamps[i]
		}
	}
	// And between samples of the pinned pass counter.
	worstRate, worstDelta, worstSpan := 0.0, uint64(0), time.Duration(0)
	for i := 1; i < len(samples); i++ {
		dt := samples[i].to.Sub(samples[i-1].from)
		delta := samples[i].pass - samples[i-1].pass
		if lim := soakRate*dt.Seconds() + soakBurst + 2; float64(delta) > lim {
			t.Errorf("pinned counter: %d packets passed in %v at +%v, more than %.0f", delta, dt, samples[i].to.Sub(t0), lim)
		}
		if r := float64(delta) / dt.Seconds(); r > worstRate {
			worstRate, worstDelta, worstSpan = r, delta, dt
		}
	}
	elapsed := flood.Elapsed
	received := len(stamps)
	avg := float64(received) / elapsed.Seconds()
	t.Logf("e2e soak: %v; flood %d packets at %.0f pkt/s offered; %d reloads (%d invalid, %d refused), %d kill -9 restarts; received %d = %.1f pkt/s (limit %d, burst %d); worst 100 ms window %d packets at +%v (bound %.0f), after the first second %d at +%v; worst pinned-counter interval %d packets in %v (%.0f pkt/s); %d counter samples; longest gap between admitted packets %v at +%v",
		dur, flood.Sent, flood.PPS(), reloads, invalid, refused, restarts, received, avg, soakRate, soakBurst, worst,
		worstAt.Sub(t0).Round(time.Millisecond), bound, steady, steadyAt.Sub(t0).Round(time.Millisecond), worstDelta, worstSpan.Round(time.Millisecond), worstRate, len(samples), gap.Round(time.Millisecond), gapAt.Sub(t0).Round(time.Millisecond))
	if flood.PPS() < 5*soakRate {
		t.Errorf("the flood reached only %.0f pkt/s: not a flood", flood.PPS())
	}
	if float64(worst) > bound {
		t.Errorf("the limit did not hold: %d packets in 100 ms at +%v, bound %.0f", worst, worstAt.Sub(t0), bound)
	}
	if max := soakRate*elapsed.Seconds() + soakBurst + 2; float64(received) > max {
		t.Errorf("received %d over %v, more than %.0f", received, elapsed, max)
	}
	// Restarts and reloads must not stop traffic either: the flood keeps
	// the bucket busy, so nearly the full rate passes.
	if avg < 0.9*soakRate {
		t.Errorf("only %.1f pkt/s passed on average, want at least 90%% of %d", avg, soakRate)
	}
	if refused != invalid {
		t.Errorf("%d invalid rules files, %d refused", invalid, refused)
	}
	if reloads < int(dur/time.Second)/2 || restarts < int((dur-longLife)/(20*time.Second))-1 {
		t.Errorf("only %d reloads and %d restarts in %v", reloads, restarts, dur)
	}

	// No growth within a daemon's life. A sample can catch a descriptor
	// that comes and goes (the scrape's own connection), one more or one
	// less; a leak moves the middle of the samples instead: the median of
	// the last third must not be above the median of the first third.
	floor := func(xs []int) int {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for i, l := range lives {
		t.Logf("e2e soak: daemon %d: open fds after each reload %v; goroutines %v", i+1, l.fds, l.goroutines)
		n := len(l.fds)
		if n < 6 {
			continue
		}
		if first, last := floor(l.fds[:n/3]), floor(l.fds[n-n/3:]); last > first {
			t.Errorf("daemon %d: open fds grew from %d to %d across %d reloads", i+1, first, last, n)
		}
		// Goroutines come and go with scrapes and ticks (12 and 13 both
		// occur all along): a leak shows as the whole last third above
		// the whole first third, by more than that jitter.
		if first, last := slices.Max(l.goroutines[:n/3]), slices.Min(l.goroutines[n-n/3:]); last > first+2 {
			t.Errorf("daemon %d: goroutines grew from at most %d to at least %d across %d reloads", i+1, first, last, n)
		}
		// Over a long life, the slope: sampling jitter (one goroutine
		// more or less) moves a least-squares slope over 40 reloads or
		// more by about 0.005; a leak of one goroutine per 30 reloads
		// moves it by 0.033.
		if n >= 40 {
			slope := lsSlope(l.goroutines)
			t.Logf("e2e soak: daemon %d: %d reloads in one life, goroutines grow by %.4f per reload (bound %.4f)", i+1, n, slope, soakLeakSlope)
			if slope > soakLeakSlope {
				t.Errorf("daemon %d: goroutines grow by %.4f per reload over %d reloads (%v), above %.4f: a leak", i+1, slope, n, l.goroutines, soakLeakSlope)
			}
		}
	}
	if got := pinNames(t, pinDir); !slices.Equal(got, pins) {
		t.Errorf("pins after the soak %v, want %v as after the first start", got, pins)
	}
}

// writeFileAtomic replaces path with text (rename), as editors and config
// management do, so the daemon never reads a half-written file.
func writeFileAtomic(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func pinNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func countFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("count fds of %d: %v", pid, err)
	}
	return len(ents)
}

// soakLeakSlope is the largest goroutine growth per reload the soak accepts
// over a long daemon life.
const soakLeakSlope = 1.0 / 30

// lsSlope is the least-squares slope of ys against their index.
func lsSlope(ys []int) float64 {
	n := float64(len(ys))
	var sx, sy, sxx, sxy float64
	for i, y := range ys {
		x := float64(i)
		sx, sy, sxx, sxy = sx+x, sy+float64(y), sxx+x*x, sxy+x*float64(y)
	}
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}

// goroutines scrapes go_goroutines from the daemon's /metrics, over a
// connection opened inside the server's namespace.
func (e *env) goroutines(t *testing.T) int {
	t.Helper()
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := e.lab.Server.Do(func() error {
				var err error
				c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 3 * time.Second}).Get("http://" + soakMetricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("go_goroutines %q: %v", v, err)
			}
			return int(n)
		}
	}
	t.Fatalf("no go_goroutines in /metrics (%v)", sc.Err())
	return 0
}

// bpfObjects are the IDs of every BPF program, map and link the test's
// daemons used, found from the pins (other tests on the machine create
// xlimit objects of the same names at the same time, so names alone
// cannot tell them apart).
type bpfObjects struct {
	progs, maps, links map[int]string // id → name (links: type)
}

type bpftoolObj struct {
	ID     int         `json:"id"`
	Name   string      `json:"name"`
	Type   bpftoolType `json:"type"`
	MapIDs []int       `json:"map_ids"`
	ProgID int         `json:"prog_id"`
}

// bpftoolType is an object's type: a name, or the number when this
// bpftool has no name for it (Debian 12's prints TCX links as 11).
type bpftoolType string

func (t *bpftoolType) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*t = bpftoolType(s)
		return nil
	}
	var n int
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("bpftool type %s: neither a name nor a number", b)
	}
	*t = bpftoolType(strconv.Itoa(n))
	return nil
}

func bpftool(args ...string) ([]bpftoolObj, error) {
	out, err := exec.Command("bpftool", append([]string{"-j"}, args...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("bpftool %v: %w", args, err)
	}
	var objs []bpftoolObj
	if len(out) > 0 && out[0] == '{' {
		var o bpftoolObj
		err = json.Unmarshal(out, &o)
		objs = append(objs, o)
	} else {
		err = json.Unmarshal(out, &objs)
	}
	if err != nil {
		return nil, fmt.Errorf("bpftool %v: %w", args, err)
	}
	return objs, nil
}

// bpftoolHas reports whether an object of the kind (prog, map, link) with
// that id exists.
func bpftoolHas(kind string, id int) bool {
	_, err := bpftool(kind, "show", "id", strconv.Itoa(id))
	return err == nil
}

// programs returns the ids of the programs that use the pinned maps.
func (o *bpfObjects) programs(t *testing.T, pinDir string) []int {
	t.Helper()
	pinned := o.pinnedMaps(t, pinDir)
	all, err := bpftool("prog", "show")
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	for _, p := range all {
		if slices.ContainsFunc(p.MapIDs, func(id int) bool { return pinned[id] }) {
			ids = append(ids, p.ID)
		}
	}
	return ids
}

func (o *bpfObjects) pinnedMaps(t *testing.T, pinDir string) map[int]bool {
	t.Helper()
	ids := map[int]bool{}
	for _, name := range pinNames(t, pinDir) {
		if m, err := bpftool("map", "show", "pinned", filepath.Join(pinDir, name)); err == nil {
			ids[m[0].ID] = true
		}
	}
	return ids
}

// add records the programs using the pinned maps, every map they use and
// every link attaching them.
func (o *bpfObjects) add(t *testing.T, pinDir string) {
	t.Helper()
	if o.progs == nil {
		o.progs, o.maps, o.links = map[int]string{}, map[int]string{}, map[int]string{}
	}
	pinned := o.pinnedMaps(t, pinDir)
	if len(pinned) == 0 {
		t.Fatalf("no pinned maps in %s", pinDir)
	}
	all, err := bpftool("prog", "show")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range all {
		if !slices.ContainsFunc(p.MapIDs, func(id int) bool { return pinned[id] }) {
			continue
		}
		o.progs[p.ID] = p.Name
		for _, id := range p.MapIDs {
			o.maps[id] = ""
		}
	}
	for id := range pinned {
		o.maps[id] = ""
	}
	links, err := bpftool("link", "show")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if _, ok := o.progs[l.ProgID]; ok {
			o.links[l.ID] = string(l.Type)
		}
	}
}

// waitGone polls exists for up to 5 s (the kernel frees BPF objects after
// an RCU grace period) and reports whether it turned false.
func waitGone(exists func() bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	for exists() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// checkNothingLeft runs after the env's cleanup: every BPF object the
// daemons used is freed, and the test's namespaces are gone (no name, no
// process inside).
func checkNothingLeft(t *testing.T, o *bpfObjects, nsPaths []string, nsInodes []uint64) {
	if o.progs == nil {
		return
	}
	left := func(kind string, ids map[int]string) []int {
		var out []int
		for id := range ids {
			if !waitGone(func() bool { return bpftoolHas(kind, id) }) {
				out = append(out, id)
			}
		}
		sort.Ints(out)
		return out
	}
	p, m, l := left("prog", o.progs), left("map", o.maps), left("link", o.links)
	t.Logf("e2e soak: the daemons used %d programs, %d maps, %d links; left after cleanup: programs %v, maps %v, links %v",
		len(o.progs), len(o.maps), len(o.links), p, m, l)
	if len(p)+len(m)+len(l) > 0 {
		t.Errorf("BPF objects leaked: programs %v, maps %v, links %v", p, m, l)
	}
	for _, path := range nsPaths {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s still named (stat: %v)", path, err)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		target, err := os.Readlink(p)
		if err != nil {
			continue
		}
		for _, ino := range nsInodes {
			if target == fmt.Sprintf("net:[%d]", ino) {
				t.Errorf("process %s is still in the test's namespace %s", filepath.Dir(filepath.Dir(p)), target)
			}
		}
	}
}
