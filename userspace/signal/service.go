package signal

import (
	"math"
	"time"
)

// The service rate: how much work a rule's service actually took over a
// tick, the input the capacity-tracking law (control.Track) follows. It is
// computed from what is readable without changing the service, through
// sources that can be replaced as better ones appear (the kernel's own
// per-rule counters, maps/):
//
//   - TCP (accept_queue, and system protection of syn_only rules):
//     connections accepted = handshakes completed − Δ accept-queue depth.
//     Handshakes come from a HandshakeCounter when one counts the rule, else
//     from the namespace's Tcp PassiveOpens, at most the SYNs the rule
//     admitted (the namespace counts every port's).
//   - UDP (socket_queue): datagrams read = the namespace's Udp InDatagrams
//     (counted by recvmsg), at most what the rule admitted plus what was
//     queued. The queue in datagrams is integrated from admitted − read −
//     dropped and reset to 0 whenever the sockets' receive memory is empty
//     (sock_diag reports it in bytes of buffers, not datagrams).
//   - response_time: responses started, from a ResponseTimes source.

// HandshakeCounter counts, per rule, the TCP handshakes completed for its
// ports (connections put into an accept queue), cumulatively. ok is false
// when the rule is not counted.
type HandshakeCounter interface {
	Handshakes(rule *Rule) (total uint64, ok bool)
}

// ConnCounter reads, per rule, its TCP connections in flight as the
// kernel counts them (from the completed handshake until the service
// closes the connection). ok is false when the rule is not counted.
type ConnCounter interface {
	InFlight(rule *Rule) (n int64, ok bool)
}

// RequestCounter reads, per response_time rule, its HTTP requests in
// flight as the kernel counts them (from a request's first byte to its
// response's first byte: an idle keep-alive connection is not in flight),
// where the kernel counts them and refuses the requests over the rule's
// in-flight cap. ok is false when the rule's requests are not counted; the
// sampler then reads its connections (ConnCounter).
type RequestCounter interface {
	RequestsInFlight(rule *Rule) (n int64, ok bool)
}

// KernelSources are the kernel's per-rule measures of the protected
// services; a nil member measures nothing.
type KernelSources struct {
	Handshakes HandshakeCounter
	Responses  ResponseTimes
	InFlight   ConnCounter
	// Requests, when not nil, counts response_time rules' requests in
	// flight; Track then caps requests, not connections.
	Requests RequestCounter
}

// ResponseTimes reads the on-wire response time of a rule's service
// (signal response_time): requests stamped as they arrive, and the time
// to the first byte of each response.
type ResponseTimes interface {
	ResponseTime(rule *Rule) (ResponseReading, bool)
}

// ResponseReading is a rule's response-time counters at one instant.
type ResponseReading struct {
	// Responses counts, cumulatively, the responses whose first byte was
	// seen: the requests the service took and answered.
	Responses uint64
	// Latency is the response time of the responses counted since the
	// previous reading (TickResponseTime: the lower quartile of the
	// histogram's increase); meaningless when no response was counted
	// since.
	Latency time.Duration
}

// BaseWindow is how far back the base latency of a response-time or probe
// signal looks: the queueing delay is the sample minus the minimum of this
// window. A service held at its target for longer than the window without
// one sample at its idle latency would see its base drift up
// (docs/control.md).
const BaseWindow = 60 * time.Second

// minWindow is the minimum of the samples of the last BaseWindow, kept per
// second.
type minWindow struct {
	mins [60]time.Duration
	secs [60]int64
}

// observe adds a sample at now and returns the window's minimum.
func (m *minWindow) observe(v time.Duration, now time.Time) time.Duration {
	sec := now.Unix()
	i := int(sec % int64(len(m.mins)))
	if m.secs[i] != sec {
		m.mins[i], m.secs[i] = v, sec
	} else if v < m.mins[i] {
		m.mins[i] = v
	}
	base := time.Duration(math.MaxInt64)
	for j := range m.mins {
		if sec-m.secs[j] < int64(len(m.mins)) && m.secs[j] <= sec {
			base = min(base, m.mins[j])
		}
	}
	return base
}

// tcpService is the service-rate arithmetic of a TCP rule between two
// ticks.
type tcpService struct {
	prevQueue float64
	prevAt    time.Time
	primed    bool
	prevHS    uint64
	haveHS    bool
	prevOpens uint64 // the namespace's PassiveOpens at the previous sample
	haveOpens bool
}

// step takes this tick's accept-queue depth and the handshakes completed
// since the previous tick (handshakes, or hsOK false when unknown), with
// the rule's admitted count over the tick (admitted, or -1 when the rule
// does not count connections), and returns the connections the service
// accepted per second.
func (t *tcpService) step(now time.Time, queue float64, handshakes uint64, admitted float64) (rate float64, ok bool) {
	dt := now.Sub(t.prevAt).Seconds()
	prev, primed := t.prevQueue, t.primed
	t.prevQueue, t.prevAt, t.primed = queue, now, true
	if !primed || dt <= 0 {
		return 0, false
	}
	hs := float64(handshakes)
	if admitted >= 0 {
		hs = min(hs, admitted)
	}
	return max(hs-(queue-prev), 0) / dt, true
}

// udpService is the service-rate arithmetic of a UDP rule between two
// ticks.
type udpService struct {
	queue     float64 // datagrams, estimated
	prevDrops uint64
	prevAt    time.Time
	primed    bool
	prevRead  uint64 // the namespace's InDatagrams at the previous sample
	haveRead  bool
}

// step takes this tick's receive memory (bytes) and cumulative drops of the
// rule's sockets, the datagrams read in the namespace and the rule admitted
// since the previous tick (admitted −1: unknown), and returns the datagrams
// read per second, the estimated queue in datagrams and the drops since
// the previous tick.
func (u *udpService) step(now time.Time, memory, drops, read uint64, admitted float64) (rate, queue float64, dropped uint64, ok bool) {
	dt := now.Sub(u.prevAt).Seconds()
	prevDrops, primed := u.prevDrops, u.primed
	u.prevDrops, u.prevAt, u.primed = drops, now, true
	if drops >= prevDrops {
		dropped = drops - prevDrops
	} // else a socket went away: its drops with it
	served := float64(read)
	if admitted >= 0 {
		served = min(served, admitted+u.queue)
		u.queue = max(u.queue+admitted-served-float64(dropped), 0)
	}
	switch {
	case memory == 0:
		u.queue = 0
	case u.queue < 1:
		u.queue = 1 // something is queued
	}
	if !primed || dt <= 0 {
		return 0, u.queue, 0, false
	}
	return served / dt, u.queue, dropped, true
}

// SystemLoad is the host's overload as system protection reads it: CPU
// usage, or CPU pressure (PSI some avg10) where asked for (PressureHigh >
// 0) and reported, whichever is the higher fraction of its threshold,
// expressed on the scale of CPUHigh so that one comparison with CPUHigh
// decides. The readers are injected (the Sampler's CPU and CPUPressure in
// the daemon).
type SystemLoad struct {
	CPU          func() (usage float64, fresh bool)
	Pressure     func() (pressure float64, available bool) // nil: none
	CPUHigh      float64
	PressureHigh float64
}

// Load returns the overload reading and whether it is fresh.
func (l *SystemLoad) Load() (float64, bool) {
	usage, fresh := l.CPU()
	if l.PressureHigh > 0 && l.Pressure != nil && l.CPUHigh > 0 {
		if p, ok := l.Pressure(); ok && (!fresh || p/l.PressureHigh > usage/l.CPUHigh) {
			return p / l.PressureHigh * l.CPUHigh, true
		}
	}
	return usage, fresh
}
