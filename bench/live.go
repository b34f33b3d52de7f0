//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// key names a series of repeated points.
type key struct {
	receiver string
	level    float64 // offered target (0: flat out) or configured rate
}

// results is everything measured, for the report.
type results struct {
	c          config
	start, end time.Time
	host       string
	kernel     string
	cpuModel   string
	goVersion  string
	version    string
	loadStart  string
	loadEnd    string
	lab        string
	cpus       []int

	mapsRaw   string
	mapsLines []benchLine
	mapsErr   error
	// queues: loader.BenchmarkQueues, which make bench runs first (every
	// queue live, without live frames), read from -queues; queuesErr why
	// not.
	queues    []benchLine
	queuesErr error
	// liveErr: why the live floods (section 2, live accuracy) did not
	// run, or nil.
	liveErr error
	fake    []fakeClockCase
	fakeErr error

	gen      map[string][]point // generator setups
	genOrder []string
	cmp      map[key][]point // comparison: receiver × offered level
	rnd      map[string][]point
	acc      map[key][]point // live accuracy: receiver × configured rate
	hl       map[string][]point
	mq       map[key][]point     // every queue: receiver × queues flooded
	mqShare  map[key][][]float64 // each point's share of frames by receive queue
	skipped  map[string]string

	src      source
	kcfg     kernelConfig
	testsRaw string
	tests    []goBench
	testsErr error
}

func newResults(c config) *results {
	r := &results{
		c: c, start: time.Now(),
		gen: map[string][]point{}, cmp: map[key][]point{}, rnd: map[string][]point{}, acc: map[key][]point{}, hl: map[string][]point{},
		mq: map[key][]point{}, mqShare: map[key][][]float64{},
		skipped: map[string]string{},
	}
	r.host, _ = os.Hostname()
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		r.kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				r.cpuModel = strings.TrimSpace(v)
				break
			}
		}
	}
	r.goVersion = runtime.Version()
	if out, err := exec.Command("git", "describe", "--always", "--dirty").Output(); err == nil {
		r.version = strings.TrimSpace(string(out))
	}
	r.loadStart = loadavg()
	return r
}

func (r *results) finish() {
	r.end = time.Now()
	r.loadEnd = loadavg()
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	fs := strings.Fields(string(b))
	if len(fs) < 3 {
		return "?"
	}
	return strings.Join(fs[:3], " ")
}

// rotate returns xs starting at index i (mod len): each repetition visits
// the receivers in another order, so that drift in the machine's load
// does not always hit the same one.
func rotate[T any](xs []T, i int) []T {
	i %= len(xs)
	return append(append([]T(nil), xs[i:]...), xs[:i]...)
}

// live runs every live measurement.
func (r *results) live(ctx context.Context, e *env) error {
	c := r.c
	limit := limitSpec{rate: c.rate, burst: max(5, c.rate/10)}

	// The generator alone: how fast it goes against the cheapest receiver,
	// on one CPU and on all, and against the stack.
	type genSetup struct {
		label    string
		receiver string
		cpus     []int
		random   bool
	}
	setups := []genSetup{
		{fmt.Sprintf("XDP_DROP, %d CPUs", len(e.cpus)), rcvDrop, e.cpus, false},
		{"XDP_DROP, 1 CPU", rcvDrop, e.cpus[:1], false},
		{fmt.Sprintf("XDP_DROP, %d CPUs, random sources", len(e.cpus)), rcvDrop, e.cpus, true},
		{fmt.Sprintf("XDP_PASS + UDP stack, %d CPUs", len(e.cpus)), rcvNone, e.cpus, false},
		{fmt.Sprintf("no program (GRO on) + UDP stack, %d CPUs", len(e.cpus)), rcvNoProg, e.cpus, false},
	}
	for _, s := range setups {
		r.genOrder = append(r.genOrder, s.label)
	}
	for rep := range c.reps {
		for _, s := range rotate(setups, rep) {
			p, err := e.flatOnce(ctx, s.receiver, limit, s.cpus, s.random, c.warm, c.window)
			if err != nil {
				return fmt.Errorf("generator, %s: %w", s.label, err)
			}
			r.gen[s.label] = append(r.gen[s.label], p)
			progress("generator %d/%d %s: %.2f Mpps, path %.0f ns/pkt", rep+1, c.reps, s.label, p.rate(p.Offered)/1e6, p.pathNS())
		}
	}

	// The comparison, flat out and at fixed offered rates.
	for rep := range c.reps {
		for _, kind := range rotate(comparisonReceivers, rep) {
			rc, err := e.newReceiver(ctx, kind, limit)
			if err != nil {
				if r.skip(kind, err) {
					continue
				}
				return err
			}
			err = func() error {
				p, err := e.flat(ctx, rc, e.cpus, false, c.warm, c.window)
				if err != nil {
					return err
				}
				r.cmp[key{kind, 0}] = append(r.cmp[key{kind, 0}], p)
				progress("compare %d/%d %s flat out: offered %.2f Mpps, admitted %.0f/s, path %.0f ns/pkt",
					rep+1, c.reps, kind, p.rate(p.Offered)/1e6, p.rate(p.Admitted), p.pathNS())
				for _, lvl := range c.levels {
					p, err := e.measure(ctx, rc, e.frame, e.cpus, lvl, c.levelWarm, c.levelWindow)
					if err != nil {
						return err
					}
					r.cmp[key{kind, lvl}] = append(r.cmp[key{kind, lvl}], p)
					progress("compare %d/%d %s at %.2f Mpps: offered %.2f Mpps, path %.0f ns/pkt",
						rep+1, c.reps, kind, lvl/1e6, p.rate(p.Offered)/1e6, p.pathNS())
				}
				return nil
			}()
			if cerr := rc.close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", kind, err)
			}
		}
	}

	// Random sources against the per-source limiters.
	perSource := limitSpec{rate: c.srcRate, burst: srcBurst(c.srcRate), perSource: true}
	for rep := range c.reps {
		for _, kind := range rotate(randomReceivers, rep) {
			if _, skipped := r.skipped[kind]; skipped {
				continue
			}
			p, err := e.flatOnce(ctx, kind, perSource, e.cpus, true, c.warm, c.window)
			if err != nil {
				return fmt.Errorf("random sources, %s: %w", kind, err)
			}
			r.rnd[kind] = append(r.rnd[kind], p)
			progress("random sources %d/%d %s: offered %.2f Mpps, admitted %.0f/s, path %.0f ns/pkt",
				rep+1, c.reps, kind, p.rate(p.Offered)/1e6, p.rate(p.Admitted), p.pathNS())
		}
	}

	// Every queue: one generator thread per queue flat out (veth's XDP
	// transmit hands a frame to the receive queue of the sending CPU, so
	// the generator on q CPUs floods q queues), XDP_DROP and xlimit, from
	// one queue to all; the veth's per-queue counters say where the frames
	// went.
	for rep := range c.reps {
		for q := 1; q <= len(e.cpus); q++ {
			for _, kind := range rotate([]string{rcvDrop, rcvXlimit}, rep+q) {
				before, err := e.queueRx(ctx)
				if err != nil {
					return err
				}
				p, err := e.flatOnce(ctx, kind, limit, e.cpus[:q], false, c.warm, c.window)
				if err != nil {
					return fmt.Errorf("every queue, %s on %d: %w", kind, q, err)
				}
				after, err := e.queueRx(ctx)
				if err != nil {
					return err
				}
				k := key{kind, float64(q)}
				r.mq[k] = append(r.mq[k], p)
				r.mqShare[k] = append(r.mqShare[k], queueShares(before, after))
				progress("every queue %d/%d %s on %d queues: offered %.2f Mpps, admitted %.0f/s, shares %.2f",
					rep+1, c.reps, kind, q, p.rate(p.Offered)/1e6, p.rate(p.Admitted), queueShares(before, after))
			}
		}
	}

	// Live accuracy, admitted counted by a sink rule right behind the
	// limiter, from a standing start, every counter read at rest.
	for rep := range c.reps {
		for _, kind := range rotate(accuracyReceivers, rep) {
			if _, skipped := r.skipped[kind]; skipped {
				continue
			}
			for _, rate := range c.accRates {
				l := limitSpec{rate: rate, burst: max(5, rate/10), sinkAdmitted: true}
				rc, err := e.newReceiver(ctx, kind, l)
				if err != nil {
					return fmt.Errorf("accuracy, %s: %w", kind, err)
				}
				p, err := e.total(ctx, rc, e.frame, e.cpus, c.accDuration)
				if cerr := rc.close(); err == nil {
					err = cerr
				}
				if err != nil {
					return fmt.Errorf("accuracy, %s at %.0f/s: %w", kind, rate, err)
				}
				p.Burst = l.burst
				r.acc[key{kind, rate}] = append(r.acc[key{kind, rate}], p)
				progress("accuracy %d/%d %s at %.0f/s: admitted %.1f/s beyond the burst (offered %.2f Mpps)",
					rep+1, c.reps, kind, rate, accRate(p), p.rate(p.Offered)/1e6)
			}
		}
	}

	// hashlimit's accuracy by burst and CPUs, with nft limit and xlimit at
	// the small burst for contrast.
	for rep := range c.reps {
		for _, h := range rotate(hashlimitCases(e.cpus, limit.burst), rep) {
			if _, skipped := r.skipped[h.receiver]; skipped {
				continue
			}
			rc, err := e.newReceiver(ctx, h.receiver, limitSpec{rate: c.rate, burst: h.burst})
			if err != nil {
				return fmt.Errorf("%s: %w", h.label(), err)
			}
			p, err := e.measure(ctx, rc, e.frame, h.cpus, 0, c.warm, c.window)
			if cerr := rc.close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", h.label(), err)
			}
			r.hl[h.label()] = append(r.hl[h.label()], p)
			progress("burst %d/%d %s: admitted %.0f/s", rep+1, c.reps, h.label(), p.rate(p.Admitted))
		}
	}
	return nil
}

// accRate is a standing-start run's admitted rate beyond the burst.
func accRate(p point) float64 {
	if p.Window <= 0 {
		return 0
	}
	return (float64(p.Admitted) - p.Burst) / p.Window.Seconds()
}

// hlCase is one configuration of the burst section.
type hlCase struct {
	receiver string
	burst    float64
	cpus     []int
}

func (h hlCase) label() string {
	unit := "CPUs"
	if len(h.cpus) == 1 {
		unit = "CPU"
	}
	return fmt.Sprintf("%s, burst %.0f, %d %s", h.receiver, h.burst, len(h.cpus), unit)
}

func hashlimitCases(cpus []int, burst float64) []hlCase {
	return []hlCase{
		{rcvHashlim, 5, cpus[:1]},
		{rcvHashlim, 5, cpus},
		{rcvHashlim, burst, cpus[:1]},
		{rcvHashlim, burst, cpus},
		{rcvNftLimit, 5, cpus},
		{rcvXlimit, 5, cpus},
	}
}

var (
	comparisonReceivers = []string{rcvDrop, rcvNone, rcvXlimit, rcvNftLimit, rcvNftMeter, rcvHashlim}
	randomReceivers     = []string{rcvDrop, rcvXlimit, rcvNftMeter, rcvHashlim}
	accuracyReceivers   = []string{rcvXlimit, rcvNftLimit}
)

// skip records a receiver whose tool is missing (nft, iptables-nft) and
// reports whether the run can go on without it.
func (r *results) skip(kind string, err error) bool {
	if kind == rcvNftLimit || kind == rcvNftMeter || kind == rcvHashlim {
		if _, lerr := exec.LookPath(map[bool]string{true: "iptables-nft", false: "nft"}[kind == rcvHashlim]); lerr != nil {
			r.skipped[kind] = lerr.Error()
			return true
		}
	}
	return false
}

// srcBurst is the per-source burst: two seconds' worth, at least 2. With
// a burst of 1 a source whose token is back waits for its next packet
// with the token unspent and gets less than its rate; with 2 the bucket
// never fills up under the flood and the rate holds.
func srcBurst(rate float64) float64 { return max(2, 2*rate) }

// flatOnce starts a receiver of the given kind, measures it flat out
// (flat) and stops it.
func (e *env) flatOnce(ctx context.Context, kind string, l limitSpec, cpus []int, random bool, warm, window time.Duration) (point, error) {
	rc, err := e.newReceiver(ctx, kind, l)
	if err != nil {
		return point{}, err
	}
	p, err := e.flat(ctx, rc, cpus, random, warm, window)
	if cerr := rc.close(); err == nil {
		err = cerr
	}
	return p, err
}

// flat measures flat out, with the fixed or the random-source frame.
func (e *env) flat(ctx context.Context, rc receiver, cpus []int, random bool, warm, window time.Duration) (point, error) {
	frame := e.frame
	if random {
		frame = e.frame0
		if err := e.g.SetRandomSources(randomPrefix); err != nil {
			return point{}, err
		}
		defer e.g.SetRandomSources(netipZero)
	}
	return e.measure(ctx, rc, frame, cpus, 0, warm, window)
}

// queueRx reads the frames each receive queue of the server veth has seen
// (ethtool -S: rx_queue_N_xdp_packets).
func (e *env) queueRx(ctx context.Context) ([]uint64, error) {
	out, err := e.lab.Server.Command(ctx, "ethtool", "-S", e.lab.ServerIf).Output()
	if err != nil {
		return nil, fmt.Errorf("ethtool -S %s: %w", e.lab.ServerIf, err)
	}
	var rx []uint64
	for _, line := range strings.Split(string(out), "\n") {
		var q int
		var n uint64
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "rx_queue_%d_xdp_packets: %d", &q, &n); err != nil || q < 0 || q > 255 {
			continue
		}
		for len(rx) <= q {
			rx = append(rx, 0)
		}
		rx[q] = n
	}
	if len(rx) == 0 {
		return nil, fmt.Errorf("ethtool -S %s: no per-queue counters", e.lab.ServerIf)
	}
	return rx, nil
}

// queueShares is each queue's share of the frames between two readings.
func queueShares(before, after []uint64) []float64 {
	var total uint64
	d := make([]uint64, len(after))
	for i := range after {
		if i < len(before) {
			d[i] = after[i] - before[i]
		} else {
			d[i] = after[i]
		}
		total += d[i]
	}
	out := make([]float64, len(d))
	for i := range d {
		if total > 0 {
			out[i] = float64(d[i]) / float64(total)
		}
	}
	return out
}
