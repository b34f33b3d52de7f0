package signal

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
)

// waitProbe waits until the prober has a fresh result that satisfies ok.
func waitProbe(t *testing.T, p *Prober, ok func(ProbeResult) bool) ProbeResult {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if r, fresh := p.Last(time.Now()); fresh && ok(r) {
			return r
		}
		time.Sleep(10 * time.Millisecond)
	}
	r, _ := p.Last(time.Now())
	t.Fatalf("prober never got there; last %+v", r)
	return r
}

func TestProberTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	p, err := StartProber(config.Probe{Kind: config.ProbeTCP, Address: ln.Addr().String(), Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	r := waitProbe(t, p, func(r ProbeResult) bool { return r.OK })
	if r.Latency <= 0 || r.ErrorRate != 0 || r.Seq == 0 {
		t.Errorf("healthy service: %+v", r)
	}
	seq := r.Seq
	waitProbe(t, p, func(r ProbeResult) bool { return r.Seq > seq }) // every probe counts
	ln.Close()
	r = waitProbe(t, p, func(r ProbeResult) bool { return r.ErrorRate >= 0.5 })
	if r.OK || r.Err == nil {
		t.Errorf("closed service: %+v", r)
	}
}

func TestProberHTTP(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		time.Sleep(5 * time.Millisecond)
		w.WriteHeader(status)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	p, err := StartProber(config.Probe{Kind: config.ProbeHTTP, Address: addr, Path: "/health", Interval: 20 * time.Millisecond, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	r := waitProbe(t, p, func(r ProbeResult) bool { return r.OK })
	if r.Latency < 5*time.Millisecond {
		t.Errorf("latency %v below the service's 5 ms", r.Latency)
	}
	if _, fresh := p.Last(time.Now().Add(time.Second)); fresh {
		t.Error("a result two intervals old is still fresh")
	}
}

// TestProberHTTPNoRedirect: a probe never follows a redirect. The probe
// policy checks only the configured address, so a followed redirect would
// let a rules document (from the API or the fleet) point a probe at a
// local open redirect and make every host's daemon fetch a third party's
// URL. A 3xx is the probe's answer: the service answered, and that is all
// the probe measures.
func TestProberHTTPNoRedirect(t *testing.T) {
	var fetched atomic.Int64
	third := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetched.Add(1)
		w.WriteHeader(http.StatusInternalServerError) // a followed redirect would also fail the probe
	}))
	defer third.Close()
	local := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, third.URL+"/elsewhere", http.StatusFound)
	}))
	defer local.Close()
	addr := strings.TrimPrefix(local.URL, "http://")
	p, err := StartProber(config.Probe{Kind: config.ProbeHTTP, Address: addr, Path: "/go", Interval: 20 * time.Millisecond, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	r := waitProbe(t, p, func(r ProbeResult) bool { return r.Seq >= 3 })
	if n := fetched.Load(); n != 0 {
		t.Errorf("the probe followed the redirect: the third server was fetched %d times", n)
	}
	if !r.OK || r.ErrorRate != 0 {
		t.Errorf("a 302 is the service's answer, a success: %+v", r)
	}
}
