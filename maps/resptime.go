//go:build linux

package maps

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// The service's measures (bpf/resptime.h): handshakes completed per rule,
// counted by the sock_ops program, and the response time, stamped by the
// XDP program and timed by the TC egress program of bpf/resptime_tc.c, a
// separate object loaded over the XDP object's maps.

// respMaps are the measures' maps of a Tables (nil in pins of an xlimit
// from before them).
type respMaps struct {
	served, flows, hists *ebpf.Map
	// requests counts each rule's requests in flight (bpf/request.h); nil
	// in pins of an xlimit from before it.
	requests *ebpf.Map
}

func (o *Objects) respMaps() *respMaps {
	m := &o.objs.xdpMaps
	return &respMaps{served: m.XlServed, flows: m.XlRespFlows, hists: m.XlRespHists, requests: m.XlRequests}
}

// openRespMaps opens the pinned measures' maps of dir; nil when absent.
func openRespMaps(dir string, opts *ebpf.LoadPinOptions) (*respMaps, error) {
	if !pinned(dir, xdpMapXlServed) {
		return nil, nil
	}
	r := &respMaps{}
	if err := openPins(dir, opts,
		pin{name: xdpMapXlServed, dst: &r.served}, pin{name: xdpMapXlRespFlows, dst: &r.flows}, pin{name: xdpMapXlRespHists, dst: &r.hists},
		pin{name: xdpMapXlRequests, dst: &r.requests, optional: true},
	); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *respMaps) close() error {
	if r == nil {
		return nil
	}
	return closeMaps(r.served, r.flows, r.hists, r.requests)
}

// ErrNoRespMaps is returned by the measures' readers on pins from an
// xlimit before them.
var ErrNoRespMaps = errors.New("the pinned maps have no service measures (xlimit before response_time)")

// Handshakes returns the TCP handshakes completed for a slot's rule since
// the maps were created, summed over CPUs (the sock_ops program counts
// them for the rules of Globals.Served).
func (t *Tables) Handshakes(slot int) (uint64, error) {
	if t.resp == nil {
		return 0, ErrNoRespMaps
	}
	var per []uint64
	if err := t.resp.served.Lookup(uint32(slot), &per); err != nil {
		return 0, fmt.Errorf("read handshakes %d: %w", slot, err)
	}
	var sum uint64
	for _, n := range per {
		sum += n
	}
	return sum, nil
}

// ResponseTimes returns a slot's response-time histogram summed over CPUs.
func (t *Tables) ResponseTimes(slot int) (dataplane.RespHist, error) {
	var sum dataplane.RespHist
	if t.resp == nil {
		return sum, ErrNoRespMaps
	}
	var per []xdpXlRespHist
	if err := t.resp.hists.Lookup(uint32(slot), &per); err != nil {
		return sum, fmt.Errorf("read response times %d: %w", slot, err)
	}
	for i := range per {
		h := dataplane.RespHist{Stamps: per[i].Stamps, Count: per[i].Count, SumNS: per[i].SumNs, Buckets: per[i].Buckets}
		sum.Add(&h)
	}
	return sum, nil
}

// ErrNoRequests is returned by Requests on pins from an xlimit before the
// kernel counted requests in flight.
var ErrNoRequests = errors.New("the pinned maps have no request count (xlimit before requests in flight)")

// Requests returns a slot's requests as the kernel counts them
// (bpf/request.h): in flight, from a request's first byte to its
// response's first byte, and refused over the in-flight cap.
func (t *Tables) Requests(slot int) (dataplane.Requests, error) {
	if t.resp == nil || t.resp.requests == nil {
		return dataplane.Requests{}, ErrNoRequests
	}
	var v xdpXlRequests
	if err := t.resp.requests.Lookup(uint32(slot), &v); err != nil {
		return dataplane.Requests{}, fmt.Errorf("read requests %d: %w", slot, err)
	}
	return dataplane.Requests{InFlight: v.InFlight, Refused: v.Refused}, nil
}

// Flow is a TCP flow whose request the kernel follows (xl_resp_flows), as
// its client sent it.
type Flow struct {
	Family  uint8 // 4 or 6
	Src     [16]byte
	Dst     [16]byte
	SrcPort uint16 // host order
	DstPort uint16
}

// PendingRequest is the stamp of a flow's unanswered request.
type PendingRequest struct {
	StampNS uint64 // 0: answered
	Slot    int
}

// PendingRequests lists the flows the response time follows.
func (t *Tables) PendingRequests() (map[Flow]PendingRequest, error) {
	if t.resp == nil {
		return nil, ErrNoRespMaps
	}
	out := map[Flow]PendingRequest{}
	var k xdpXlFlowKey
	var v xdpXlFlow
	it := t.resp.flows.Iterate()
	for it.Next(&k, &v) {
		f := Flow{Family: k.Family, Src: k.Saddr, Dst: k.Daddr, SrcPort: ntohs(k.Sport), DstPort: ntohs(k.Dport)}
		out[f] = PendingRequest{StampNS: v.StampNs, Slot: int(v.Slot)}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read pending requests: %w", err)
	}
	return out, nil
}

func ntohs(v uint16) uint16 { return v>>8 | v<<8 }

// LoadRequestProgram loads the TC ingress program that refuses the
// requests over their rule's cap on requests in flight (bpf/request_tc.h),
// over the XDP object's maps. fakeClock as Options.FakeClock.
func (o *Objects) LoadRequestProgram(fakeClock bool) (*RespProgram, error) {
	spec, err := loadResptime()
	if err != nil {
		return nil, fmt.Errorf("load request-refusal spec: %w", err)
	}
	prog, err := o.loadOverXDP(spec, "xlimit_tc_requests", "request-refusal", fakeClock, func(err error) error {
		// A verifier's refusal is EACCES too: only one without its
		// log is the missing capability.
		var ve *ebpf.VerifierError
		if errors.Is(err, os.ErrPermission) && !errors.As(err, &ve) {
			return fmt.Errorf("load request-refusal program: %w: %s", errors.Unwrap(err), ErrCapabilities)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &RespProgram{prog: prog}, nil
}

// RespProgram is a loaded TC program of the response time's object: the
// response timer at egress, the request refusal at ingress.
type RespProgram struct{ prog *ebpf.Program }

// Program returns the TC program.
func (r *RespProgram) Program() *ebpf.Program { return r.prog }

// Close releases the program.
func (r *RespProgram) Close() error { return r.prog.Close() }

// LoadRespProgram loads the TC egress program that times responses,
// over the XDP object's maps. fakeClock as Options.FakeClock.
func (o *Objects) LoadRespProgram(fakeClock bool) (*RespProgram, error) {
	spec, err := loadResptime()
	if err != nil {
		return nil, fmt.Errorf("load response-time spec: %w", err)
	}
	prog, err := o.loadOverXDP(spec, "xlimit_tc_resptime", "response-time", fakeClock, func(err error) error {
		if errors.Is(err, os.ErrPermission) {
			return fmt.Errorf("load response-time program: %w: %s", errors.Unwrap(err), ErrCapabilities)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &RespProgram{prog: prog}, nil
}

// ReconcileRequests corrects each rule's requests in flight
// (xl_requests) to the stamped flows the response time follows
// (xl_resp_flows): a stamped flow that the LRU evicts is never counted
// down by the kernel, so without it the count drifts up. It walks the
// flows, counts the stamped ones per slot and adds the difference to
// in_flight by an atomic add on the mmapped map (the kernel's own adds
// are not lost). The race it accepts: a request stamped or answered
// between the walk's visit of its flow and the add (or a flow the walk
// misses or sees twice while the LRU changes) is miscounted by one, until
// the next call corrects it; the error never accumulates. It returns the
// corrections it made, by slot.
func (t *Tables) ReconcileRequests() (map[int]int64, error) {
	if t.resp == nil || t.resp.requests == nil {
		return nil, ErrNoRequests
	}
	m := t.resp.requests
	n := int(m.MaxEntries())
	stamped := make([]int64, n)
	var k xdpXlFlowKey
	var v xdpXlFlow
	it := t.resp.flows.Iterate()
	for it.Next(&k, &v) {
		if v.StampNs != 0 && int(v.Slot) < n {
			stamped[v.Slot]++
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("walk the response flows: %w", err)
	}
	const stride = int(unsafe.Sizeof(xdpXlRequests{})) // round_up(value size, 8)
	size := (n*stride + os.Getpagesize() - 1) &^ (os.Getpagesize() - 1)
	mem, err := unix.Mmap(m.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the requests in flight: %w", err)
	}
	defer unix.Munmap(mem)
	out := map[int]int64{}
	for slot := range n {
		// in_flight is the value's first field.
		p := (*int64)(unsafe.Pointer(&mem[slot*stride]))
		if d := stamped[slot] - atomic.LoadInt64(p); d != 0 {
			atomic.AddInt64(p, d)
			out[slot] = d
		}
	}
	return out, nil
}
