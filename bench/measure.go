//go:build linux

package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/xlimit/xlimit/bench/gen"
)

// snapshot is every counter at one moment.
type snapshot struct {
	at        time.Time
	cpu       map[int]cpuTimes
	srv, cli  linkStats
	snmp      snmp
	generated uint64
	genCPU    time.Duration
	ksoftirqd time.Duration
	rc        counts // the receiver's own counters
}

// cheap reads every counter that this process reads itself, in a fraction
// of a millisecond.
func (e *env) cheap(generated *atomic.Uint64, threads *threadCPU) (snapshot, error) {
	var s snapshot
	var err error
	s.at = time.Now()
	if s.cpu, err = readCPUTimes(); err != nil {
		return s, err
	}
	s.generated = generated.Load()
	s.genCPU = threads.sum()
	if s.ksoftirqd, err = e.ksoftirqdTime(); err != nil {
		return s, err
	}
	if s.srv, err = e.srv.read(); err != nil {
		return s, err
	}
	if s.cli, err = e.cli.read(); err != nil {
		return s, err
	}
	if s.snmp, err = readSNMP(e.lab.Server); err != nil {
		return s, err
	}
	return s, nil
}

// snap reads the receiver's counters (which may take a command, tens of
// milliseconds under load) between two cheap snapshots and returns their
// midpoint, so that every counter describes about the same moment.
func (e *env) snap(r receiver, generated *atomic.Uint64, threads *threadCPU) (snapshot, error) {
	a, err := e.cheap(generated, threads)
	if err != nil || r == nil {
		return a, err
	}
	rc, err := r.counters()
	if err != nil {
		return a, err
	}
	b, err := e.cheap(generated, threads)
	if err != nil {
		return a, err
	}
	mid := func(x, y uint64) uint64 { return x + (y-x)/2 }
	m := snapshot{
		at:        a.at.Add(b.at.Sub(a.at) / 2),
		cpu:       map[int]cpuTimes{},
		generated: mid(a.generated, b.generated),
		genCPU:    a.genCPU + (b.genCPU-a.genCPU)/2,
		ksoftirqd: a.ksoftirqd + (b.ksoftirqd-a.ksoftirqd)/2,
		rc:        rc,
	}
	for c, x := range a.cpu {
		y := b.cpu[c]
		m.cpu[c] = cpuTimes{mid(x.user, y.user), mid(x.nice, y.nice), mid(x.system, y.system), mid(x.idle, y.idle),
			mid(x.iowait, y.iowait), mid(x.irq, y.irq), mid(x.softirq, y.softirq), mid(x.steal, y.steal)}
	}
	m.srv = linkStats{mid(a.srv.RxPackets, b.srv.RxPackets), mid(a.srv.RxDropped, b.srv.RxDropped), mid(a.srv.TxPackets, b.srv.TxPackets), mid(a.srv.TxDropped, b.srv.TxDropped)}
	m.cli = linkStats{mid(a.cli.RxPackets, b.cli.RxPackets), mid(a.cli.RxDropped, b.cli.RxDropped), mid(a.cli.TxPackets, b.cli.TxPackets), mid(a.cli.TxDropped, b.cli.TxDropped)}
	m.snmp = snmp{mid(a.snmp.UDPIn, b.snmp.UDPIn), mid(a.snmp.UDPNoPorts, b.snmp.UDPNoPorts), mid(a.snmp.UDPInErrors, b.snmp.UDPInErrors),
		mid(a.snmp.UDPRcvbufErrors, b.snmp.UDPRcvbufErrors), mid(a.snmp.IPInReceives, b.snmp.IPInReceives),
		mid(a.snmp.IPInDelivers, b.snmp.IPInDelivers), mid(a.snmp.IPInDiscards, b.snmp.IPInDiscards)}
	return m, nil
}

// point is one measurement window of one receiver at one offered load.
type point struct {
	Receiver string
	Target   float64 // offered rate asked of the generator; 0 = flat out
	Window   time.Duration

	Generated uint64  // frames the generator ran its program on
	Offered   uint64  // frames the server veth received (its NAPI saw them)
	RingDrops uint64  // frames refused by the veth (receive ring full), never seen by any filter
	Dropped   uint64  // the receiver's drop counter
	Admitted  uint64  // reached the UDP layer (socket, socket buffer full, or no socket)
	SinkRule  bool    // Admitted was counted by the nft sink rule, not at the UDP layer
	Burst     float64 // the limiter's burst, for a run from a standing start (total)
	Delivered uint64  // read by the sink
	RcvbufErr uint64

	Softirq float64 // CPU seconds in softirq, all CPUs, over the window (/proc/stat)
	Busy    float64 // CPU seconds not idle, all CPUs (/proc/stat: everything on the machine)
	Total   float64 // CPU seconds elapsed, all CPUs
	// PathCPU is the CPU time of the generator's threads plus ksoftirqd's:
	// generating, transmitting and receiving the frames, wherever the
	// softirq ran, and nothing else on the machine.
	PathCPU time.Duration
}

// pathNS is PathCPU per offered packet, in ns.
func (p point) pathNS() float64 {
	if p.Offered == 0 {
		return 0
	}
	return float64(p.PathCPU.Nanoseconds()) / float64(p.Offered)
}

func (p point) rate(n uint64) float64 { return float64(n) / p.Window.Seconds() }

// softirqPerM is softirq CPU milliseconds per million offered packets.
func (p point) softirqPerM() float64 {
	if p.Offered == 0 {
		return 0
	}
	return p.Softirq * 1e3 / (float64(p.Offered) / 1e6)
}

// measure floods with g/frame at target (0: flat out) for warm, then
// measures a window of the given length while the flood goes on.
func (e *env) measure(ctx context.Context, r receiver, frame []byte, cpus []int, target float64, warm, window time.Duration) (point, error) {
	p := point{Target: target}
	if r != nil {
		p.Receiver = r.name()
	}
	chunk := uint32(8192)
	if target > 0 {
		// About 1 ms worth per call and CPU, at least a batch.
		chunk = uint32(max(64, min(8192, target/float64(len(cpus))/1000)))
	}
	f := &flood{ns: e.lab.Client, g: e.g, frame: frame, cpus: cpus, rate: target, chunk: chunk, batch: gen.DefaultBatch}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var generated atomic.Uint64
	threads := &threadCPU{ns: make([]atomic.Int64, len(cpus))}
	type out struct {
		res floodResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := f.run(fctx, &generated, threads)
		done <- out{res, err}
	}()
	wait := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case o := <-done:
			done <- o
			return fmt.Errorf("generator stopped early: %v", o.err)
		case <-time.After(d):
			return nil
		}
	}
	stop := func() error {
		cancel()
		o := <-done
		return o.err
	}
	if err := wait(warm); err != nil {
		stop()
		return p, err
	}
	a, err := e.snap(r, &generated, threads)
	if err != nil {
		stop()
		return p, err
	}
	if err := wait(window); err != nil {
		stop()
		return p, err
	}
	b, err := e.snap(r, &generated, threads)
	if err != nil {
		stop()
		return p, err
	}
	if err := stop(); err != nil {
		return p, err
	}
	p.Window = b.at.Sub(a.at)
	p.Generated = b.generated - a.generated
	ds, dc := b.srv.sub(a.srv), b.cli.sub(a.cli)
	p.Offered = ds.RxPackets
	p.RingDrops = ds.RxDropped + dc.TxDropped
	p.Dropped = b.rc.dropped - a.rc.dropped
	sn := b.snmp.sub(a.snmp)
	p.Admitted = sn.admitted()
	if b.rc.hasAdmitted {
		p.Admitted = b.rc.admitted - a.rc.admitted
		p.SinkRule = true
	}
	if p.Receiver == rcvDrop {
		p.Dropped = p.Offered // XDP_DROP drops everything; it has no counter
	}
	p.Delivered = sn.UDPIn
	p.RcvbufErr = sn.UDPRcvbufErrors
	// Every CPU: the receiving side may run anywhere.
	p.Softirq, p.Busy, p.Total = cpuDelta(a.cpu, b.cpu, e.cpus)
	p.PathCPU = b.genCPU - a.genCPU + b.ksoftirqd - a.ksoftirqd
	return p, nil
}

// total floods flat out for d from a standing start and reads every
// counter at rest, before and after: no command runs during the flood. The
// window is the flood's extent (first call to last); a limiter then
// admits its burst plus rate × window.
func (e *env) total(ctx context.Context, r receiver, frame []byte, cpus []int, d time.Duration) (point, error) {
	p := point{Receiver: r.name()}
	var generated atomic.Uint64
	threads := &threadCPU{ns: make([]atomic.Int64, len(cpus))}
	a, err := e.snap(r, &generated, threads)
	if err != nil {
		return p, err
	}
	f := &flood{ns: e.lab.Client, g: e.g, frame: frame, cpus: cpus, chunk: 8192, batch: gen.DefaultBatch}
	fctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	res, err := f.run(fctx, &generated, threads)
	if err != nil {
		return p, err
	}
	if ctx.Err() != nil {
		return p, ctx.Err()
	}
	// Frames still in the veth's ring are processed within microseconds.
	time.Sleep(50 * time.Millisecond)
	b, err := e.snap(r, &generated, threads)
	if err != nil {
		return p, err
	}
	p.Window = res.Last.Sub(res.First)
	p.Generated = b.generated - a.generated
	ds, dc := b.srv.sub(a.srv), b.cli.sub(a.cli)
	p.Offered = ds.RxPackets
	p.RingDrops = ds.RxDropped + dc.TxDropped
	p.Dropped = b.rc.dropped - a.rc.dropped
	p.Admitted = b.snmp.sub(a.snmp).admitted()
	if b.rc.hasAdmitted {
		p.Admitted = b.rc.admitted - a.rc.admitted
		p.SinkRule = true
	}
	return p, nil
}
