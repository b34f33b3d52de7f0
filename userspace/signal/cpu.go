package signal

import (
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/prometheus/procfs"
)

// MinCPUWindow is the shortest window NewCPU accepts: /proc/stat counts in
// ticks of USER_HZ (10 ms), far too coarse for a 50 ms span.
const MinCPUWindow = 250 * time.Millisecond

// cpuSpacing divides the window into the resolution of the ring: a reading
// replaces the newest one instead of adding to the ring while that one is
// less than window/cpuSpacing after its predecessor, which bounds the ring
// at cpuSpacing+3 entries whatever the sampling rate (and makes a span at
// most window/cpuSpacing plus one sampling interval longer than the window).
const cpuSpacing = 32

// cpuIdleTolerance is how far (in CPU-seconds) the idle+iowait counter may
// go backwards before NewCPU's sampler takes it for a reset: iowait is known
// to decrease slightly on tickless kernels (proc(5)).
const cpuIdleTolerance = 0.1

type cpuReading struct {
	at         time.Time
	busy, idle float64 // CPU-seconds
}

// CPU computes host CPU usage from cumulative /proc/stat counters over a
// sliding window: every Sample takes a reading and returns the usage
// between it and the newest earlier reading at least one window older. A
// CPU is not safe for concurrent use.
type CPU struct {
	window  time.Duration
	spacing time.Duration
	clock   func() time.Time
	read    func() (procfs.CPUStat, error)
	ring    []cpuReading // oldest first
	last    float64
}

// NewCPU returns a sampler over window (at least MinCPUWindow), reading the
// time from clock and the counters from read. NewHostCPU wires in the real
// ones.
func NewCPU(window time.Duration, clock func() time.Time, read func() (procfs.CPUStat, error)) (*CPU, error) {
	if window < MinCPUWindow {
		return nil, fmt.Errorf("new cpu sampler: window %v shorter than %v", window, MinCPUWindow)
	}
	if clock == nil || read == nil {
		return nil, errors.New("new cpu sampler: clock and reader are required")
	}
	return &CPU{
		window:  window,
		spacing: window / cpuSpacing,
		clock:   clock,
		read:    read,
		ring:    make([]cpuReading, 0, cpuSpacing+4),
	}, nil
}

// NewHostCPU returns a sampler of the host's CPU usage (the "cpu" line of
// fs's stat file) over window, timed by time.Now.
func NewHostCPU(pfs procfs.FS, window time.Duration) (*CPU, error) {
	return NewCPU(window, time.Now, func() (procfs.CPUStat, error) {
		st, err := pfs.Stat()
		if err != nil {
			return procfs.CPUStat{}, err
		}
		return st.CPUTotal, nil
	})
}

// Window returns the sampler's window.
func (c *CPU) Window() time.Duration { return c.window }

// Sample takes a reading and returns the host's CPU usage in [0, 1] (busy
// time over all time, summed over the CPUs) over the newest span of at
// least the window ending now. fresh is false, and usage is the last fresh
// value (0 before the first), until the sampler holds a reading at least one
// window old: after start, after a counter reset and after the clock went
// backwards, which all restart the ring. A failed read returns its error
// with the last value, not fresh. After a pause in sampling the span is as
// long as the pause (the average over it).
func (c *CPU) Sample() (usage float64, fresh bool, err error) {
	now := c.clock()
	st, err := c.read()
	if err != nil {
		return c.last, false, fmt.Errorf("read cpu counters: %w", err)
	}
	// guest and guest_nice are already part of user and nice.
	r := cpuReading{
		at:   now,
		busy: st.User + st.Nice + st.System + st.IRQ + st.SoftIRQ + st.Steal,
		idle: st.Idle + st.Iowait,
	}
	if n := len(c.ring); n > 0 {
		prev := c.ring[n-1]
		if r.at.Before(prev.at) || r.busy < prev.busy || r.idle < prev.idle-cpuIdleTolerance {
			c.ring = c.ring[:0] // clock stepped back or counters reset
		}
	}
	// The newest slot is provisional until it lies a spacing past the one
	// before it: every other pair of neighbours is at least a spacing apart.
	if n := len(c.ring); n >= 2 && c.ring[n-1].at.Sub(c.ring[n-2].at) < c.spacing {
		c.ring[n-1] = r
	} else {
		c.ring = append(c.ring, r)
	}

	// The base is the newest earlier reading at least a window old.
	base := -1
	for i := len(c.ring) - 2; i >= 0; i-- {
		if now.Sub(c.ring[i].at) >= c.window {
			base = i
			break
		}
	}
	if base < 0 {
		return c.last, false, nil
	}
	if base > 0 { // older readings can never be a base again
		c.ring = c.ring[:copy(c.ring, c.ring[base:])]
	}
	b := c.ring[0]
	busy := r.busy - b.busy
	total := busy + max(r.idle-b.idle, 0)
	if total <= 0 {
		// No tick counted in a whole window: the counters are not moving.
		return c.last, false, nil
	}
	c.last = min(max(busy/total, 0), 1)
	return c.last, true, nil
}

// Pressure is the "some" line of a PSI file: the share of time in which at
// least one runnable task waited for the resource.
type Pressure struct {
	// Available is false when the kernel has no PSI (built without it or
	// booted with psi=0); the other fields are then zero.
	Available bool
	// Avg10, Avg60 and Avg300 are running averages over 10 s, 60 s and
	// 300 s, as fractions in [0, 1] (the file's percentages / 100).
	Avg10, Avg60, Avg300 float64
	// Total is the cumulative stall time.
	Total time.Duration
}

// ReadCPUPressure reads the CPU pressure of the host from fs's
// pressure/cpu. A kernel without PSI yields Available false and no error.
func ReadCPUPressure(pfs procfs.FS) (Pressure, error) {
	st, err := pfs.PSIStatsForResource("cpu")
	if err != nil {
		// ENOENT: no /proc/pressure; EOPNOTSUPP (errors.ErrUnsupported):
		// PSI files present but disabled.
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, errors.ErrUnsupported) {
			return Pressure{}, nil
		}
		return Pressure{}, fmt.Errorf("read cpu pressure: %w", err)
	}
	if st.Some == nil {
		return Pressure{}, errors.New("read cpu pressure: no \"some\" line")
	}
	return Pressure{
		Available: true,
		Avg10:     st.Some.Avg10 / 100,
		Avg60:     st.Some.Avg60 / 100,
		Avg300:    st.Some.Avg300 / 100,
		Total:     time.Duration(st.Some.Total) * time.Microsecond,
	}, nil
}

// ReadLoadAvg reads the 1, 5 and 15 minute load averages from fs's loadavg.
func ReadLoadAvg(pfs procfs.FS) (procfs.LoadAvg, error) {
	la, err := pfs.LoadAvg()
	if err != nil {
		return procfs.LoadAvg{}, fmt.Errorf("read load average: %w", err)
	}
	return *la, nil
}
