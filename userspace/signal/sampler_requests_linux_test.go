package signal

import (
	"testing"

	"github.com/xlimit/xlimit/userspace/config"
)

type fixedConns int64

func (c fixedConns) InFlight(*Rule) (int64, bool) { return int64(c), true }

type fixedRequests struct {
	n  int64
	ok bool
}

func (r fixedRequests) RequestsInFlight(*Rule) (int64, bool) { return r.n, r.ok }

// A response_time rule reads its requests in flight where the kernel
// counts them, and its connections (idle keep-alive ones included) only
// where it does not.
func TestSamplerRequestsInFlight(t *testing.T) {
	rule := &Rule{Name: "web", Signal: config.SignalResponseTime}
	for _, tc := range []struct {
		name     string
		src      KernelSources
		n        float64
		requests bool
	}{
		{"requests counted", KernelSources{InFlight: fixedConns(40), Requests: fixedRequests{3, true}}, 3, true},
		{"rule not counted", KernelSources{InFlight: fixedConns(40), Requests: fixedRequests{3, false}}, 40, false},
		{"no request counter", KernelSources{InFlight: fixedConns(40)}, 40, false},
	} {
		s := &Sampler{}
		s.SetSources(tc.src)
		var sig Signals
		if !s.readRequests(rule, &sig) {
			s.readInFlight(rule, &sig)
		}
		if !sig.HasInFlight || sig.InFlight != tc.n || sig.InFlightRequests != tc.requests {
			t.Errorf("%s: in flight %v (has %v), requests %v; want %v, %v", tc.name, sig.InFlight, sig.HasInFlight, sig.InFlightRequests, tc.n, tc.requests)
		}
	}
}
