package signal

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// fakeHost is an injected clock and /proc/stat: Run advances both by dt
// with the given usage of ncpu CPUs.
type fakeHost struct {
	now  time.Time
	st   procfs.CPUStat
	ncpu float64
	err  error
}

func newFakeHost() *fakeHost {
	return &fakeHost{
		now:  time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC),
		st:   procfs.CPUStat{User: 1000, System: 500, Idle: 5000, Iowait: 20},
		ncpu: 2,
	}
}

func (h *fakeHost) clock() time.Time { return h.now }

func (h *fakeHost) read() (procfs.CPUStat, error) { return h.st, h.err }

// Run spends dt at usage u: busy time split over user, system and softirq,
// the rest idle.
func (h *fakeHost) Run(dt time.Duration, u float64) {
	cpuSec := dt.Seconds() * h.ncpu
	h.st.User += 0.6 * u * cpuSec
	h.st.System += 0.3 * u * cpuSec
	h.st.SoftIRQ += 0.1 * u * cpuSec
	h.st.Idle += (1 - u) * cpuSec
	h.now = h.now.Add(dt)
}

func newTestCPU(t *testing.T, h *fakeHost, window time.Duration) *CPU {
	t.Helper()
	c, err := NewCPU(window, h.clock, h.read)
	if err != nil {
		t.Fatalf("NewCPU: %v", err)
	}
	return c
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestCPUWindow(t *testing.T) {
	h := newFakeHost()
	c := newTestCPU(t, h, 250*time.Millisecond)
	const tick = 50 * time.Millisecond
	// Interval k (k ≥ 1) ends at k·50 ms and runs at usage[k].
	usage := []float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9, 0.0}
	for k := range usage {
		if k > 0 {
			h.Run(tick, usage[k])
		}
		u, fresh, err := c.Sample()
		if err != nil {
			t.Fatalf("tick %d: %v", k, err)
		}
		if k < 5 { // 0..200 ms: no reading 250 ms old yet
			if fresh || u != 0 {
				t.Errorf("tick %d: usage %v fresh %v before the window filled", k, u, fresh)
			}
			continue
		}
		// The span is the newest ≥ 250 ms: exactly the last 5 intervals.
		want := 0.0
		for j := k - 4; j <= k; j++ {
			want += usage[j] / 5
		}
		if !fresh || !near(u, want) {
			t.Errorf("tick %d: usage %v fresh %v, want %v over the last 250 ms", k, u, fresh, want)
		}
	}
	if n := len(c.ring); n > 6 {
		t.Errorf("ring holds %d readings, want at most 6 at 50 ms ticks", n)
	}
}

func TestCPUIrregularTicks(t *testing.T) {
	h := newFakeHost()
	c := newTestCPU(t, h, 250*time.Millisecond)
	// Readings at 0, 60, 130, 240 ms: still stale at 240.
	for _, step := range []struct {
		dt time.Duration
		u  float64
	}{{0, 0}, {60 * time.Millisecond, 1}, {70 * time.Millisecond, 0}, {110 * time.Millisecond, 0.5}} {
		h.Run(step.dt, step.u)
		if _, fresh, _ := c.Sample(); fresh {
			t.Fatalf("fresh at %v, before 250 ms", h.now.Sub(newFakeHost().now))
		}
	}
	// 260 ms: base is the reading at 0 (260 ms old), usage over 260 ms.
	h.Run(20*time.Millisecond, 0)
	u, fresh, _ := c.Sample()
	want := (60*1 + 70*0 + 110*0.5 + 20*0) / 260.0
	if !fresh || !near(u, want) {
		t.Errorf("260 ms: usage %v fresh %v, want %v", u, fresh, want)
	}
	// 400 ms: the newest reading at least 250 ms old is the one at 130 ms
	// (270 ms old; 240 ms is only 160 ms old).
	h.Run(140*time.Millisecond, 1)
	u, fresh, _ = c.Sample()
	want = (110*0.5 + 20*0 + 140*1) / 270.0
	if !fresh || !near(u, want) {
		t.Errorf("400 ms: usage %v fresh %v, want %v", u, fresh, want)
	}
}

func TestCPUCounterReset(t *testing.T) {
	h := newFakeHost()
	c := newTestCPU(t, h, 250*time.Millisecond)
	for range 7 {
		c.Sample()
		h.Run(50*time.Millisecond, 0.4)
	}
	u, fresh, _ := c.Sample()
	if !fresh || !near(u, 0.4) {
		t.Fatalf("before reset: usage %v fresh %v, want 0.4", u, fresh)
	}
	// The counters restart near zero (a wrap, or CPUs going offline).
	h.st = procfs.CPUStat{User: 1, Idle: 3}
	for k := range 5 {
		h.Run(50*time.Millisecond, 0.8)
		u, fresh, err := c.Sample()
		if err != nil || fresh || !near(u, 0.4) {
			t.Fatalf("%d ticks after reset: usage %v fresh %v err %v; want the last value 0.4, stale", k+1, u, fresh, err)
		}
	}
	// 250 ms after the reset: fresh again, over post-reset readings only.
	h.Run(50*time.Millisecond, 0.8)
	u, fresh, _ = c.Sample()
	if !fresh || !near(u, 0.8) {
		t.Errorf("after refill: usage %v fresh %v, want 0.8", u, fresh)
	}
}

func TestCPUClockBackwards(t *testing.T) {
	h := newFakeHost()
	c := newTestCPU(t, h, 250*time.Millisecond)
	for range 7 {
		c.Sample()
		h.Run(50*time.Millisecond, 0.3)
	}
	h.now = h.now.Add(-time.Second)
	if _, fresh, _ := c.Sample(); fresh {
		t.Error("fresh after the clock stepped back")
	}
}

func TestCPUIowaitGlitch(t *testing.T) {
	// iowait may go backwards slightly on tickless kernels: not a reset.
	h := newFakeHost()
	c := newTestCPU(t, h, 250*time.Millisecond)
	for range 6 {
		c.Sample()
		h.Run(50*time.Millisecond, 0.5)
	}
	h.st.Iowait -= 0.02
	u, fresh, _ := c.Sample()
	if !fresh || u < 0.5 || u > 0.53 {
		t.Errorf("usage %v fresh %v after an iowait glitch, want about 0.5", u, fresh)
	}
}

func TestCPUReadError(t *testing.T) {
	h := newFakeHost()
	c := newTestCPU(t, h, 250*time.Millisecond)
	for range 7 {
		c.Sample()
		h.Run(50*time.Millisecond, 0.6)
	}
	errBoom := errors.New("boom")
	h.err = errBoom
	u, fresh, err := c.Sample()
	if !errors.Is(err, errBoom) || fresh || !near(u, 0.6) {
		t.Errorf("Sample on a failed read = %v, %v, %v; want the last value 0.6, stale, the error", u, fresh, err)
	}
	h.err = nil
	h.Run(50*time.Millisecond, 0.6)
	if u, fresh, err := c.Sample(); err != nil || !fresh || !near(u, 0.6) {
		t.Errorf("after recovery: %v, %v, %v", u, fresh, err)
	}
}

func TestCPURingBounded(t *testing.T) {
	h := newFakeHost()
	c := newTestCPU(t, h, 250*time.Millisecond)
	maxLen := 0
	for k := range 2000 { // 1 ms ticks for 2 s; usage 1 in the second half
		u := 0.0
		if k >= 1000 {
			u = 1
		}
		h.Run(time.Millisecond, u)
		got, fresh, _ := c.Sample()
		maxLen = max(maxLen, len(c.ring))
		if k >= 1300 && (!fresh || got != 1) {
			t.Fatalf("tick %d: usage %v fresh %v, want 1", k, got, fresh)
		}
	}
	if maxLen > cpuSpacing+3 {
		t.Errorf("ring grew to %d readings, want at most %d", maxLen, cpuSpacing+3)
	}
}

func TestNewCPUInvalid(t *testing.T) {
	h := newFakeHost()
	if _, err := NewCPU(100*time.Millisecond, h.clock, h.read); err == nil {
		t.Error("NewCPU accepted a 100 ms window")
	}
	if _, err := NewCPU(time.Second, nil, h.read); err == nil {
		t.Error("NewCPU accepted a nil clock")
	}
	if _, err := NewCPU(time.Second, h.clock, nil); err == nil {
		t.Error("NewCPU accepted a nil reader")
	}
}

func TestHostCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc")
	}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewHostCPU(fs, 250*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// Keep one CPU busy: usage is then at least about 1/NumCPU.
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
		}
	}()
	defer func() { stop.Store(true); <-done }()
	if _, fresh, err := c.Sample(); err != nil || fresh {
		t.Fatalf("first sample: fresh %v, %v", fresh, err)
	}
	time.Sleep(c.Window() + 50*time.Millisecond)
	u, fresh, err := c.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if !fresh || u < 0.5/float64(runtime.NumCPU()) || u > 1 {
		t.Errorf("host usage %v fresh %v with one CPU of %d spinning", u, fresh, runtime.NumCPU())
	}
	t.Logf("host CPU usage %.3f", u)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadCPUPressure(t *testing.T) {
	dir := t.TempDir()
	fs, err := procfs.NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	// No pressure directory: unavailable, not an error.
	p, err := ReadCPUPressure(fs)
	if err != nil || p.Available {
		t.Errorf("without PSI: %+v, %v; want unavailable, no error", p, err)
	}
	writeFile(t, filepath.Join(dir, "pressure", "cpu"),
		"some avg10=12.50 avg60=3.00 avg300=0.25 total=1234567\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
	p, err = ReadCPUPressure(fs)
	want := Pressure{Available: true, Avg10: 0.125, Avg60: 0.03, Avg300: 0.0025, Total: 1234567 * time.Microsecond}
	if err != nil || !p.Available || !near(p.Avg10, want.Avg10) || !near(p.Avg60, want.Avg60) ||
		!near(p.Avg300, want.Avg300) || p.Total != want.Total {
		t.Errorf("ReadCPUPressure = %+v, %v; want %+v", p, err, want)
	}
	writeFile(t, filepath.Join(dir, "pressure", "cpu"), "some avg10=x\n")
	if _, err := ReadCPUPressure(fs); err == nil {
		t.Error("no error on a malformed pressure file")
	}
	if runtime.GOOS == "linux" {
		if host, err := procfs.NewDefaultFS(); err == nil {
			p, err := ReadCPUPressure(host)
			if err != nil {
				t.Errorf("host pressure: %v", err)
			}
			t.Logf("host cpu pressure: %+v", p)
		}
	}
}

func TestReadLoadAvg(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "loadavg"), "0.52 1.25 2.00 3/456 7890\n")
	fs, err := procfs.NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	la, err := ReadLoadAvg(fs)
	if err != nil || la != (procfs.LoadAvg{Load1: 0.52, Load5: 1.25, Load15: 2}) {
		t.Errorf("ReadLoadAvg = %+v, %v", la, err)
	}
	if err := os.Remove(filepath.Join(dir, "loadavg")); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadLoadAvg(fs); err == nil {
		t.Error("no error without a loadavg file")
	}
}

func BenchmarkHostCPUSample(b *testing.B) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		b.Fatal(err)
	}
	c, err := NewHostCPU(fs, 250*time.Millisecond)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, _, err := c.Sample(); err != nil {
			b.Fatal(err)
		}
	}
}
