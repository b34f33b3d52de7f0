package signal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/procfs"

	"github.com/xlimit/xlimit/userspace/config"
)

// Sampler feeds adaptive rules with signals read without changing the
// protected services: the accept queue of their ports (sock_diag), the
// host's listen overflows as the error rate, and the host's CPU usage. It
// is the Host of a Reader. It reads in the network namespace of the
// thread that created it, and is used from one goroutine (the loop's).
type Sampler struct {
	diag    *Diag
	netstat *NetStat
	cpu     *CPU
	clock   func() time.Time
	timeout time.Duration

	// Host-wide readings are taken once per tick and shared by the rules.
	at       time.Time
	cpuUsage float64
	cpuFresh bool
	pressure Pressure
	pfs      procfs.FS
	errRate  float64
	errFresh bool
	openRate float64 // connections accepted into listen queues, per second
	openOK   bool
	prevNet  NetCounters
	prevAt   time.Time
	havePrev bool
}

// NewSampler opens the sockets and files the sampler reads.
func NewSampler(cpuWindow time.Duration) (*Sampler, error) {
	pfs, err := procfs.NewDefaultFS()
	if err != nil {
		return nil, fmt.Errorf("open procfs: %w", err)
	}
	cpu, err := NewHostCPU(pfs, cpuWindow)
	if err != nil {
		return nil, err
	}
	diag, err := NewDiag()
	if err != nil {
		return nil, err
	}
	ns, err := OpenNetStat()
	if err != nil {
		diag.Close()
		return nil, err
	}
	return &Sampler{diag: diag, netstat: ns, cpu: cpu, pfs: pfs, clock: time.Now, timeout: 20 * time.Millisecond}, nil
}

// Close releases the sockets and files.
func (s *Sampler) Close() error {
	return errors.Join(s.diag.Close(), s.netstat.Close())
}

// host reads the host-wide signals once per tick.
func (s *Sampler) host(now time.Time) {
	if now.Sub(s.at) < 10*time.Millisecond {
		return
	}
	s.at = now
	usage, fresh, err := s.cpu.Sample()
	s.cpuUsage, s.cpuFresh = usage, fresh && err == nil
	if p, err := ReadCPUPressure(s.pfs); err == nil {
		s.pressure = p
	} else {
		s.pressure = Pressure{}
	}
	s.errFresh, s.openOK = false, false
	cur, err := s.netstat.Read()
	if err != nil {
		return
	}
	if s.havePrev {
		if d, ok := cur.Sub(s.prevNet); ok {
			// Listen overflows per connection attempt that reached a
			// listener (accepted into the queue or refused by it).
			attempts := float64(d.PassiveOpens + d.ListenOverflows)
			s.errRate, s.errFresh = 0, true
			if attempts > 0 {
				s.errRate = float64(d.ListenOverflows) / attempts
			}
			if dt := now.Sub(s.prevAt).Seconds(); dt > 0 {
				s.openRate, s.openOK = float64(d.PassiveOpens)/dt, true
			}
		}
	}
	s.prevNet, s.prevAt, s.havePrev = cur, now, true
}

// CPU returns the host's CPU usage over the sampler's window, read at most
// once per tick, and whether it is fresh.
func (s *Sampler) CPU() (float64, bool) {
	s.host(s.clock())
	return s.cpuUsage, s.cpuFresh
}

// CPUPressure returns the host's CPU pressure (PSI "some" avg10 as a
// fraction) and whether the kernel reports pressure.
func (s *Sampler) CPUPressure() (float64, bool) {
	s.host(s.clock())
	return s.pressure.Avg10, s.pressure.Available
}

// Sample returns the host's signals of the rule's service this tick.
func (s *Sampler) Sample(rule *Rule, used float64) Signals {
	now := s.clock()
	s.host(now)
	sig := Signals{
		UsedRate:     used,
		CPU:          s.cpuUsage,
		CPUStale:     !s.cpuFresh,
		ErrorRate:    s.errRate,
		ErrorsStale:  !s.errFresh,
		LatencyStale: true,
	}
	if rule.Signal != config.SignalAcceptQueue || len(rule.Ports) == 0 {
		return sig
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	queues, err := s.diag.AcceptQueue(ctx, rule.Ports)
	if err != nil {
		return sig
	}
	var depth uint64
	for _, q := range queues {
		depth += q.Queued
	}
	// Little's law: the wait in the accept queue is its depth over the
	// rate connections arrive into it: for a SYN-only rule what the
	// kernel admitted, otherwise the host's passive opens (an
	// approximation when other ports take connections too). An empty
	// queue is no wait whatever the rate.
	if depth == 0 {
		sig.Latency, sig.LatencyStale = 0, false
		return sig
	}
	arrivals, ok := used, rule.SynOnly
	if !ok {
		arrivals, ok = s.openRate, s.openOK
	}
	if !ok {
		return sig
	}
	if w, ok := Littles(float64(depth), arrivals); ok {
		sig.Latency, sig.LatencyStale = w, false
	}
	return sig
}
