//go:build linux

package maps

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/corpus"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// XDP return codes of BPF_PROG_TEST_RUN.
const (
	xdpDrop = 1
	xdpPass = 2
	xdpTx   = 3 // a refused SYN answered with a reset
)

// harness runs the kernel program (with the fake clock) and the Go model
// side by side on the same plan, frames and times.
type harness struct {
	obj   *Objects
	tab   *Tables
	plan  *dataplane.Plan
	model *dataplane.Model
	clock uint64
	set   bool // clock written at least once
	// cpu is the CPU every packet of the harness runs on, and tid the OS
	// thread bound to it (pinToOneCPU, or enter in a subtest):
	// kernelRunOut refuses any other thread.
	cpu, tid int
	// daemonGone: no daemon renews the lease on xl_host_addrs
	// (daemonKilled). Otherwise setHost gives it a lease that never ends
	// in both, standing for a daemon that renews it every second.
	daemonGone bool
}

// newHarness loads the program with the fake clock; it skips the test when
// not root. The objects are closed when the test ends.
func newHarness(tb testing.TB) *harness {
	tb.Helper()
	requireRoot(tb)
	pinToOneCPU(tb)
	return loadHarness(tb, "")
}

// loadHarness is newHarness's load, over the pins in pinDir ("": none),
// for a test that has already pinned its thread.
func loadHarness(tb testing.TB, pinDir string) *harness {
	tb.Helper()
	o, err := Load(Options{FakeClock: true, PinDir: pinDir})
	if err != nil {
		tb.Fatalf("load: %v", err)
	}
	tb.Cleanup(func() { o.Close() })
	h := &harness{obj: o, tab: o.Tables(), model: &dataplane.Model{}}
	h.bind(tb)
	h.setHost(tb, defaultHost())
	return h
}

// bind records the calling thread, which the test has pinned to one CPU,
// as the harness's thread.
func (h *harness) bind(tb testing.TB) {
	tb.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		tb.Fatalf("read CPU affinity: %v", err)
	}
	h.cpu = -1
	for c := range runtime.NumCPU() {
		if set.IsSet(c) {
			h.cpu = c
			break
		}
	}
	if set.Count() != 1 || h.cpu < 0 {
		tb.Fatalf("bind the harness: the test's thread may run on %d CPUs; pin it to one first (pinToOneCPU)", set.Count())
	}
	h.tid = unix.Gettid()
}

// enter moves a subtest onto the harness's CPU: t.Run runs the subtest on
// a goroutine of its own, which the parent test's pinned thread does not
// carry. Every subtest that sends through a harness made by its parent
// calls it first.
func (h *harness) enter(tb testing.TB) {
	tb.Helper()
	pinTo(tb, h.cpu)
	prev := h.tid
	h.tid = unix.Gettid()
	tb.Cleanup(func() { h.tid = prev })
}

// onThread fails the test when the caller is not on the harness's thread:
// the program's token caches are per CPU and the model is one CPU, so a
// packet sent from another CPU makes the two differ for no fault of
// either (a subtest that forgot enter, found by CI in a 2-CPU guest).
func (h *harness) onThread(tb testing.TB) {
	tb.Helper()
	if tid := unix.Gettid(); tid != h.tid {
		tb.Fatalf("harness used from thread %d, not its thread %d pinned to CPU %d: a subtest calls h.enter(t) first", tid, h.tid, h.cpu)
	}
}

// defaultHost is the host that the test frames are addressed to: the
// frame package's default MAC 02:00:00:00:00:02 and addresses 192.0.2.1
// and 2001:db8::1, and the servers of the gate tests, 10.9.0.1 and
// 2001:db8::80.
func defaultHost() dataplane.HostAddrs {
	h := dataplane.HostAddrs{dataplane.MACKey(net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}): 1}
	for _, a := range []string{"192.0.2.1", "2001:db8::1", "10.9.0.1", "2001:db8::80"} {
		h[dataplane.IPKey(netip.MustParseAddr(a))] = 1
	}
	return h
}

// setHost makes addrs the host's own addresses in both the kernel
// (xl_host_addrs) and the model.
func (h *harness) setHost(tb testing.TB, addrs dataplane.HostAddrs) {
	tb.Helper()
	if err := h.tab.SetHostAddrs(addrs); err != nil {
		tb.Fatal(err)
	}
	h.model.Host = maps.Clone(addrs)
	if !h.daemonGone {
		h.renewLease(tb)
	}
}

// keepLease renews tab's lease on xl_host_addrs now and every second until
// the test ends, as a running daemon does: for tests on the real clock.
func keepLease(tb testing.TB, tab *Tables) {
	tb.Helper()
	if err := tab.LeaseHostAddrs(); err != nil {
		tb.Fatal(err)
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				_ = tab.LeaseHostAddrs()
			}
		}
	}()
	tb.Cleanup(func() { close(done); <-stopped })
}

// renewLease gives xl_host_addrs a lease that never ends in both: a
// daemon renewing it every second, whatever times a test jumps to.
func (h *harness) renewLease(tb testing.TB) {
	tb.Helper()
	const forever = ^uint32(0)
	kk := xdpXlHostKey{Kind: dataplane.HostLease}
	if err := h.tab.hostAddrs.Update(&kk, &xdpXlHostAddr{Ifindex: forever}, ebpf.UpdateAny); err != nil {
		tb.Fatal(err)
	}
	h.model.Host[dataplane.LeaseKey] = forever
}

// daemonKilled stands for a daemon killed without its exit hook at the
// harness's clock: its last renewal (Tables.LeaseHostAddrs) is the lease
// that runs out, in both.
func (h *harness) daemonKilled(tb testing.TB) {
	tb.Helper()
	if err := h.tab.LeaseHostAddrs(); err != nil {
		tb.Fatal(err)
	}
	h.model.Host[dataplane.LeaseKey] = dataplane.LeaseEnd(h.clock)
	h.daemonGone = true
}

var nextCPU atomic.Int32

// pinToOneCPU keeps the test's goroutine on one OS thread bound to one CPU
// until the test ends: the program's token caches are per CPU, and the Go
// model is one CPU, so every packet of a harness must run on the same one.
// Harnesses spread over the CPUs so parallel tests do not queue on one.
func pinToOneCPU(tb testing.TB) {
	tb.Helper()
	pinTo(tb, int(nextCPU.Add(1))%runtime.NumCPU())
}

// pinTo locks the test's goroutine to its OS thread and binds the thread
// to cpu until the test ends.
func pinTo(tb testing.TB, cpu int) {
	tb.Helper()
	runtime.LockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		runtime.UnlockOSThread()
		tb.Fatalf("read CPU affinity: %v", err)
	}
	var one unix.CPUSet
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		runtime.UnlockOSThread()
		tb.Fatalf("pin to one CPU: %v", err)
	}
	tb.Cleanup(func() {
		_ = unix.SchedSetaffinity(0, &old)
		runtime.UnlockOSThread()
	})
}

// compile compiles spec against prev, failing the test on error.
func compile(tb testing.TB, spec *dataplane.Spec, prev *dataplane.Plan) *dataplane.Plan {
	tb.Helper()
	p, err := dataplane.Compile(spec, prev)
	if err != nil {
		tb.Fatalf("compile: %v", err)
	}
	return p
}

// apply makes p the active plan of both the kernel and the model. The model
// keeps its bucket state and counters, as the kernel's maps do.
func (h *harness) apply(tb testing.TB, p *dataplane.Plan) {
	tb.Helper()
	if err := h.tab.Apply(p); err != nil {
		tb.Fatalf("apply: %v", err)
	}
	h.plan = p
	h.model.Plan = p
	h.model.Reload()
	// The per-source table's seed (the generation just written has it)
	// and size: the model's sets are the kernel's.
	seed, err := h.tab.SourceSeed()
	if err != nil {
		tb.Fatalf("read the per-source seed: %v", err)
	}
	h.model.SrcSeed, h.model.SrcSets = seed, h.obj.SourceSets()
	if h.model.SrcFilterLines, err = h.obj.SourceFilterLines(); err != nil {
		tb.Fatal(err)
	}
}

// slot returns the slot of a rule of the active plan, failing when absent.
func (h *harness) slot(tb testing.TB, name string) int {
	tb.Helper()
	s := h.plan.Slot(name)
	if s < 0 {
		tb.Fatalf("no rule %q in the plan", name)
	}
	return s
}

func (h *harness) setClock(tb testing.TB, now uint64) {
	tb.Helper()
	if h.set && h.clock == now {
		return
	}
	if err := h.tab.SetClock(now); err != nil {
		tb.Fatal(err)
	}
	h.clock, h.set = now, true
}

// setLimit writes the control loop's limit for a slot into both.
func (h *harness) setLimit(tb testing.TB, slot int, l dataplane.Limit) {
	tb.Helper()
	if err := h.tab.SetLimit(slot, l); err != nil {
		tb.Fatal(err)
	}
	h.model.Limits[slot] = l
}

// setConns writes a slot's count of connections in flight into both.
func (h *harness) setConns(tb testing.TB, slot int, c dataplane.Conns) {
	tb.Helper()
	if err := h.tab.SetConns(slot, c); err != nil {
		tb.Fatal(err)
	}
	h.model.Conns[slot] = c
}

// kernelRun runs frame n times at time now in the kernel only and returns
// whether the last run passed. A run interrupted by a signal is restarted
// by cilium/ebpf with the whole repeat count (the runs already done have
// counted): tests that care compare the global counters with what they
// offered.
func (h *harness) kernelRun(tb testing.TB, frame []byte, now uint64, n uint32) bool {
	tb.Helper()
	ret, _ := h.kernelRunOut(tb, frame, now, n)
	return ret == xdpPass
}

// kernelRunOut is kernelRun returning the XDP return code (pass, drop or
// tx) and the frame as the program left it.
func (h *harness) kernelRunOut(tb testing.TB, frame []byte, now uint64, n uint32) (uint32, []byte) {
	tb.Helper()
	h.onThread(tb)
	h.setClock(tb, now)
	out := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: out, Repeat: n}
	ret, err := h.obj.Program().Run(opts)
	if err != nil {
		tb.Fatalf("run %d bytes: %v", len(frame), err)
	}
	switch ret {
	case xdpPass, xdpDrop, xdpTx:
		return ret, opts.DataOut
	}
	tb.Fatalf("run: XDP return code %d", ret)
	return 0, nil
}

// run runs one frame at time now in the kernel and in the model, and fails
// the test when their verdicts differ.
func (h *harness) run(tb testing.TB, frame []byte, now uint64) (pass bool, res dataplane.Result) {
	tb.Helper()
	ret, _ := h.kernelRunOut(tb, frame, now, 1)
	pass = ret == xdpPass
	res = h.model.Eval(frame, now)
	if pass != res.Pass() || (ret == xdpTx) != (res.Reset || res.Cookie) {
		tb.Fatalf("at %d ns, frame %x: kernel returned %d, model %v/%v reset=%v", now, frame, ret, res.Verdict, res.Reason, res.Reset)
	}
	return pass, res
}

// counters reads every slot's counters from the kernel.
func (h *harness) counters(tb testing.TB) [dataplane.CounterSlots]dataplane.Counters {
	tb.Helper()
	c, err := h.tab.AllCounters()
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// slotCounters reads one slot's counters from the kernel.
func (h *harness) slotCounters(tb testing.TB, slot int) dataplane.Counters {
	tb.Helper()
	c, err := h.tab.Counters(slot)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

type allCounters = [dataplane.CounterSlots]dataplane.Counters

// deltas returns after - before, slot by slot.
func deltas(after, before allCounters) allCounters {
	var d allCounters
	for i := range d {
		d[i] = after[i].Sub(before[i])
	}
	return d
}

// one is the counters of one packet of n bytes with a verdict and reason.
var one = corpus.One

// diffCounters describes the slots where got and want differ, or "".
func diffCounters(got, want allCounters, plan *dataplane.Plan) string {
	var b strings.Builder
	for i := range got {
		if got[i] != want[i] {
			name := "global"
			if i < dataplane.MaxRules {
				name = fmt.Sprintf("slot %d (%q)", i, plan.Rules[i].Name)
			}
			fmt.Fprintf(&b, "\n  %s:\n    got  %s\n    want %s", name, fmtCounters(got[i]), fmtCounters(want[i]))
		}
	}
	return b.String()
}

func fmtCounters(c dataplane.Counters) string {
	var parts []string
	for v := range dataplane.VerdictMax {
		if c.Packets[v] != 0 || c.Bytes[v] != 0 {
			parts = append(parts, fmt.Sprintf("%v=%d/%dB", v, c.Packets[v], c.Bytes[v]))
		}
	}
	for r := range dataplane.ReasonMax {
		if c.Reasons[r] != 0 {
			parts = append(parts, fmt.Sprintf("%v:%d", r, c.Reasons[r]))
		}
	}
	for r := range dataplane.ResetMax {
		if c.Resets[r] != 0 {
			parts = append(parts, fmt.Sprintf("reset %v:%d", r, c.Resets[r]))
		}
	}
	if len(parts) == 0 {
		return "zero"
	}
	return strings.Join(parts, " ")
}
