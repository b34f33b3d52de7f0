//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/bench/gen"
	"github.com/xlimit/xlimit/tests/kit/lab"
)

// flood is one run of the live-frames generator: one thread per CPU,
// pinned, inside the client namespace, each sending its share of the rate.
type flood struct {
	ns    *lab.NS
	g     *gen.Generator
	frame []byte
	cpus  []int
	// rate is the total offered rate in frames/s; 0 sends as fast as the
	// CPUs allow.
	rate float64
	// chunk is the most frames per BPF_PROG_TEST_RUN call.
	chunk uint32
	batch uint32
}

// threadCPU is the CPU time of the generator's threads, summed: the
// program runs, the transmissions and the receiver's softirq work that the
// kernel does on the same thread when it re-enables bottom halves after
// each batch.
type threadCPU struct {
	ns []atomic.Int64 // per thread, since the thread started, updated after every call
}

func (t *threadCPU) sum() time.Duration {
	var s int64
	for i := range t.ns {
		s += t.ns[i].Load()
	}
	return time.Duration(s)
}

func threadNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

// floodResult is what the generator asked the kernel to send.
type floodResult struct {
	Generated uint64 // frames the program ran on (sum of the calls' repeat counts)
	Calls     uint64
	Elapsed   time.Duration
	// First is when the first call started, Last when the last one
	// returned, over all threads: the flood's extent on the wire.
	First, Last time.Time
}

// run floods until ctx ends. The generated count is read live through
// generated (frames handed to the kernel so far).
func (f *flood) run(ctx context.Context, generated *atomic.Uint64, cpu *threadCPU) (floodResult, error) {
	var res floodResult
	var calls atomic.Uint64
	var wg sync.WaitGroup
	errs := make([]error, len(f.cpus))
	firsts := make([]time.Time, len(f.cpus))
	lasts := make([]time.Time, len(f.cpus))
	threads := cpu
	start := time.Now()
	for i, cpu := range f.cpus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f.ns.Do(func() error {
				return f.thread(ctx, cpu, f.rate/float64(len(f.cpus)), generated, &calls, &threads.ns[i], &firsts[i], &lasts[i])
			})
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	res.Generated = generated.Load()
	res.Calls = calls.Load()
	for i := range f.cpus {
		if !firsts[i].IsZero() && (res.First.IsZero() || firsts[i].Before(res.First)) {
			res.First = firsts[i]
		}
		if lasts[i].After(res.Last) {
			res.Last = lasts[i]
		}
	}
	return res, errors.Join(errs...)
}

// thread runs on an OS thread inside the client namespace: it pins itself
// to cpu, sends at rate (0: flat out) until ctx ends, and restores the
// thread's CPU mask, so that the runtime can reuse the thread.
func (f *flood) thread(ctx context.Context, cpu int, rate float64, generated, calls *atomic.Uint64, used *atomic.Int64, first, last *time.Time) error {
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return fmt.Errorf("get affinity: %w", err)
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pin to CPU %d: %w", cpu, err)
	}
	defer func() {
		if err := unix.SchedSetaffinity(0, &old); err != nil {
			// Keep the thread locked: the runtime ends it with the goroutine.
			runtime.LockOSThread()
		}
	}()
	chunk := f.chunk
	cpu0 := threadNow()
	start := time.Now()
	var sent uint64
	for ctx.Err() == nil {
		n := chunk
		if rate > 0 {
			due := uint64(rate * time.Since(start).Seconds())
			if due < sent+uint64(chunk) {
				// Sleep until a whole chunk is due.
				wait := time.Duration(float64(sent+uint64(chunk)-due) / rate * float64(time.Second))
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return nil
				case <-t.C:
				}
				continue
			}
			// Behind by more than a few chunks (a stall): skip the backlog
			// rather than send it as one long burst.
			if due > sent+4*uint64(chunk) {
				sent = due - uint64(chunk)
			}
		}
		if first.IsZero() {
			*first = time.Now()
		}
		if err := f.g.Run(f.frame, n, f.batch); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		*last = time.Now()
		sent += uint64(n)
		generated.Add(uint64(n))
		calls.Add(1)
		used.Store(threadNow() - cpu0)
	}
	return nil
}
