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
	// The namespace's cumulative counters of the latest reading: each
	// rule takes its own differences between its own samples (a host
	// reading between two of them, for the CPU of system protection, must
	// not swallow their connections).
	netCur   NetCounters
	netOK    bool
	prevNet  NetCounters
	prevAt   time.Time
	havePrev bool

	// Sources of the service rate that replace the namespace's counters
	// where they count a rule (the kernel's per-rule counters).
	handshakes HandshakeCounter
	responses  ResponseTimes
	inFlight   ConnCounter
	requests   RequestCounter
	// Per-rule state of the service-rate arithmetic, by rule name.
	tcp  map[string]*tcpService
	udp  map[string]*udpService
	resp map[string]*respState
}

// respState is a response-time rule's previous reading.
type respState struct {
	prev   ResponseReading
	prevAt time.Time
	primed bool
	base   minWindow
}

// SetSources sets the kernel's per-rule counters of completed handshakes,
// response times and connections in flight (nil members: none; TCP rules
// then fall back to the namespace's counters, response_time rules are
// stale, and no rule's connections in flight are capped).
func (s *Sampler) SetSources(k KernelSources) {
	s.handshakes, s.responses, s.inFlight, s.requests = k.Handshakes, k.Responses, k.InFlight, k.Requests
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
	return &Sampler{diag: diag, netstat: ns, cpu: cpu, pfs: pfs, clock: time.Now, timeout: 20 * time.Millisecond,
		tcp: map[string]*tcpService{}, udp: map[string]*udpService{}, resp: map[string]*respState{}}, nil
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
	s.errFresh, s.openOK, s.netOK = false, false, false
	cur, err := s.netstat.Read()
	if err != nil {
		return
	}
	s.netCur, s.netOK = cur, true
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
	if len(rule.Ports) == 0 {
		return sig
	}
	switch {
	case rule.Signal == config.SignalResponseTime:
		s.responseTime(rule, now, &sig)
		if !s.readRequests(rule, &sig) {
			s.readInFlight(rule, &sig)
		}
	case rule.Signal == config.SignalSocketQueue:
		s.socketQueue(rule, now, used, &sig)
	case rule.Signal == config.SignalAcceptQueue || (rule.Signal == "" && rule.SynOnly):
		// An accept_queue rule, or a syn_only rule that system
		// protection caps at its service rate.
		s.acceptQueue(rule, now, used, &sig)
		s.readInFlight(rule, &sig)
	}
	return sig
}

// readRequests reads the rule's requests in flight, where the kernel
// counts them; false when it does not.
func (s *Sampler) readRequests(rule *Rule, sig *Signals) bool {
	if s.requests == nil {
		return false
	}
	n, ok := s.requests.RequestsInFlight(rule)
	if !ok || n < 0 {
		return false
	}
	sig.InFlight, sig.HasInFlight, sig.InFlightRequests = float64(n), true, true
	return true
}

// readInFlight reads the rule's connections in flight, where the kernel
// counts them.
func (s *Sampler) readInFlight(rule *Rule, sig *Signals) {
	if s.inFlight == nil {
		return
	}
	if n, ok := s.inFlight.InFlight(rule); ok && n >= 0 {
		sig.InFlight, sig.HasInFlight = float64(n), true
	}
}

func (s *Sampler) acceptQueue(rule *Rule, now time.Time, used float64, sig *Signals) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	queues, err := s.diag.AcceptQueue(ctx, rule.Ports)
	if err != nil {
		return
	}
	var depth uint64
	for _, q := range queues {
		depth += q.Queued
	}
	sig.QueueDepth, sig.HasQueue = float64(depth), true

	// The connections the service accepted: handshakes completed minus
	// the growth of the queue.
	st := s.tcp[rule.Name]
	if st == nil {
		st = &tcpService{}
		s.tcp[rule.Name] = st
	}
	dt := now.Sub(st.prevAt).Seconds()
	admitted := -1.0
	if rule.SynOnly && dt > 0 {
		admitted = used * dt
	}
	// The namespace's passive opens since this rule's previous sample,
	// unless the kernel counts the rule's own handshakes.
	var hs uint64
	hsOK := false
	if s.netOK {
		cur := s.netCur.PassiveOpens
		if st.haveOpens && cur >= st.prevOpens {
			hs, hsOK = cur-st.prevOpens, true
		}
		st.prevOpens, st.haveOpens = cur, true
	}
	if s.handshakes != nil {
		if total, ok := s.handshakes.Handshakes(rule); ok {
			hs, hsOK = total-st.prevHS, st.haveHS && total >= st.prevHS
			st.prevHS, st.haveHS = total, true
			admitted = -1 // the rule's own count needs no bound
		}
	}
	if rate, ok := st.step(now, float64(depth), hs, admitted); ok && hsOK {
		sig.ServiceRate, sig.HasServiceRate = rate, true
	}

	// Little's law: the wait in the accept queue is its depth over the
	// rate connections arrive into it: for a SYN-only rule what the
	// kernel admitted, otherwise the host's passive opens (an
	// approximation when other ports take connections too). An empty
	// queue is no wait whatever the rate.
	if depth == 0 {
		sig.Latency, sig.LatencyStale = 0, false
		return
	}
	arrivals, ok := used, rule.SynOnly
	if !ok {
		arrivals, ok = s.openRate, s.openOK
	}
	if !ok {
		return
	}
	if w, ok := Littles(float64(depth), arrivals); ok {
		sig.Latency, sig.LatencyStale = w, false
	}
}

func (s *Sampler) socketQueue(rule *Rule, now time.Time, used float64, sig *Signals) {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	queues, err := s.diag.ReceiveQueues(ctx, rule.Ports)
	if err != nil {
		return
	}
	var memory, drops uint64
	sockets := 0
	for _, q := range queues {
		memory += q.Queued
		drops += q.Drops
		sockets += q.Sockets
	}
	if sockets == 0 {
		return // nothing listens: nothing to say
	}
	st := s.udp[rule.Name]
	if st == nil {
		st = &udpService{}
		s.udp[rule.Name] = st
	}
	admitted := -1.0
	if dt := now.Sub(st.prevAt).Seconds(); !rule.Bytes && st.primed && dt > 0 {
		admitted = used * dt
	}
	var read uint64
	readOK := false
	if s.netOK {
		cur := s.netCur.UDPInDatagrams
		if st.haveRead && cur >= st.prevRead {
			read, readOK = cur-st.prevRead, true
		}
		st.prevRead, st.haveRead = cur, true
	}
	rate, queue, dropped, ok := st.step(now, memory, drops, read, admitted)
	if !ok || !readOK {
		return
	}
	sig.ServiceRate, sig.HasServiceRate = rate, true
	sig.QueueDepth, sig.HasQueue = queue, true
	// Drops at the sockets per datagram admitted, instead of the TCP
	// listen overflows.
	sig.ErrorRate, sig.ErrorsStale = 0, false
	if admitted > 0 {
		sig.ErrorRate = min(float64(dropped)/admitted, 1)
	}
	if queue == 0 {
		sig.Latency, sig.LatencyStale = 0, false
	} else if w, ok := Littles(queue, rate); ok {
		sig.Latency, sig.LatencyStale = w, false
	}
}

func (s *Sampler) responseTime(rule *Rule, now time.Time, sig *Signals) {
	if s.responses == nil {
		return
	}
	r, ok := s.responses.ResponseTime(rule)
	if !ok {
		return
	}
	st := s.resp[rule.Name]
	if st == nil {
		st = &respState{}
		s.resp[rule.Name] = st
	}
	prev, prevAt, primed := st.prev, st.prevAt, st.primed
	st.prev, st.prevAt, st.primed = r, now, true
	dt := now.Sub(prevAt).Seconds()
	if !primed || dt <= 0 || r.Responses < prev.Responses {
		return
	}
	n := r.Responses - prev.Responses
	sig.ServiceRate, sig.HasServiceRate = float64(n)/dt, true
	if n == 0 {
		return // no response this tick: no latency sample
	}
	sig.Latency, sig.LatencyStale = r.Latency, false
	sig.BaseLatency = st.base.observe(r.Latency, now)
}
