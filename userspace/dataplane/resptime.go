package dataplane

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// The kernel's measures of a protected service (bpf/resptime.h): the
// handshakes completed per rule (xl_served), and the response time of the
// rules with signal response_time (xl_resp_hists), with the fast refusal
// of `refuse: reset` (bpf/refuse.h).

// Response-time histogram of bpf/resptime.h.
const (
	// RespBuckets is the number of buckets (XL_RESP_BUCKETS).
	RespBuckets = 96
	// RespUnitShift: the histogram counts units of 2^10 ns.
	RespUnitShift = 10
	// RespFlows is how many flows' unanswered requests the kernel follows
	// at once (XL_RESP_FLOWS, an LRU).
	RespFlows = 65536
)

// Requests is a rule's requests as the kernel counts them (bpf/request.h,
// rules with signal response_time).
type Requests struct {
	// InFlight counts the requests whose first byte arrived and whose
	// response's first byte has not left yet; an idle keep-alive
	// connection is not in flight.
	InFlight int64
	// Refused counts new requests refused over the rule's in-flight cap.
	Refused uint64
}

// Refusal answers of RuleSpec.Refuse.
const (
	RefuseDrop  = "drop"
	RefuseReset = "reset"
)

func compileRuleResp(r *RuleSpec, pr *Rule, g *Globals, bit uint64) error {
	tcp := r.Protocol == "tcp" || r.Protocol == "any"
	switch r.Refuse {
	case "", RefuseDrop:
	case RefuseReset:
		if !tcp {
			return fmt.Errorf("compile rule %s: refuse reset needs protocol tcp or any, not %s", r.Name, r.Protocol)
		}
		// With syn_cookies too: the SYNs the cookie path answers are
		// never refused at XDP; a valid cookie ACK the rule refuses at TC
		// is answered with a reset by the kernel's listener, to a source
		// the cookie proved (syncookie_tc.c); the SYNs it cannot answer
		// and the rule refuses, within the reset budgets (refuse.h).
		pr.Flags |= RuleRefuseReset
	default:
		return fmt.Errorf("compile rule %s: refuse %q: want drop or reset", r.Name, r.Refuse)
	}
	if (r.ServiceRate || r.ResponseTime || r.InFlight) && !tcp {
		return fmt.Errorf("compile rule %s: the service rate, the response time and the connections in flight are measured for tcp, not %s", r.Name, r.Protocol)
	}
	if r.InFlight {
		g.Concurrent |= bit
	}
	if r.ServiceRate {
		g.Served |= bit
	}
	if r.ResponseTime {
		g.RespTime |= bit
	}
	return nil
}

// RespBucket is the histogram bucket of a response time (xl_resp_bucket):
// u = ns >> 10; below 4, bucket u; else, with e the highest bit of u,
// 4 (e − 1) plus the two bits below it, at most RespBuckets − 1.
func RespBucket(ns uint64) int {
	u := ns >> RespUnitShift
	if u < 4 {
		return int(u)
	}
	e := bits.Len64(u) - 1
	b := 4*(e-1) + int(u>>(e-2)&3)
	return min(b, RespBuckets-1)
}

// RespBucketLow is the smallest response time of bucket b.
func RespBucketLow(b int) time.Duration {
	if b < 4 {
		return time.Duration(uint64(b) << RespUnitShift)
	}
	e, m := b/4+1, uint64(b%4)
	return time.Duration((4 + m) << (e - 2) << RespUnitShift)
}

// RespHist is a rule's response-time histogram summed over CPUs (struct
// xl_resp_hist): counts since the program was loaded.
type RespHist struct {
	Stamps  uint64 // requests stamped (XDP)
	Count   uint64 // responses timed (TC egress)
	SumNS   uint64 // their response times summed
	Buckets [RespBuckets]uint64
}

// Add adds o into h.
func (h *RespHist) Add(o *RespHist) {
	h.Stamps += o.Stamps
	h.Count += o.Count
	h.SumNS += o.SumNS
	for i := range h.Buckets {
		h.Buckets[i] += o.Buckets[i]
	}
}

// Sub returns h − o, the responses between two readings; ok is false when
// a count went down (the program and its maps were replaced).
func (h RespHist) Sub(o RespHist) (d RespHist, ok bool) {
	if h.Stamps < o.Stamps || h.Count < o.Count || h.SumNS < o.SumNS {
		return RespHist{}, false
	}
	d = RespHist{Stamps: h.Stamps - o.Stamps, Count: h.Count - o.Count, SumNS: h.SumNS - o.SumNS}
	for i := range h.Buckets {
		if h.Buckets[i] < o.Buckets[i] {
			return RespHist{}, false
		}
		d.Buckets[i] = h.Buckets[i] - o.Buckets[i]
	}
	return d, true
}

// Mean is the mean response time, 0 without responses.
func (h *RespHist) Mean() time.Duration {
	if h.Count == 0 {
		return 0
	}
	return time.Duration(h.SumNS / h.Count)
}

// Quantile is the response time below which a fraction q of the
// responses fall, interpolated linearly within its bucket (the top
// bucket's upper bound taken as twice its lower one); 0 without
// responses.
func (h *RespHist) Quantile(q float64) time.Duration {
	var total uint64
	for _, n := range h.Buckets {
		total += n
	}
	if total == 0 || math.IsNaN(q) {
		return 0
	}
	rank := min(max(q, 0), 1) * float64(total)
	var seen float64
	for b, n := range h.Buckets {
		if n == 0 {
			continue
		}
		if seen+float64(n) >= rank {
			lo := RespBucketLow(b)
			hi := 2 * lo
			if b+1 < RespBuckets {
				hi = RespBucketLow(b + 1)
			}
			f := (rank - seen) / float64(n)
			return lo + time.Duration(f*float64(hi-lo))
		}
		seen += float64(n)
	}
	return RespBucketLow(RespBuckets - 1)
}
