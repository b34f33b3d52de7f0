package control

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// httpPlant is a service behind a proxy, request by request on a fake
// clock: workers × work (with ±10 % jitter), a FIFO queue inside the
// service, a fixed overhead (the proxy) added to every response, clients
// that give up after 2 s. The kernel in front refuses a request while the
// requests in flight are at the cap (cap 0: none), and, for clients that
// open a connection per request, a request over the rule's token bucket.
//
// A SYN the bucket refuses is answered with a reset only while the rule's
// reset bucket (at the rule's rate and burst, bpf/reset.h) and the host's
// (1000/s, burst 1000) have room: otherwise it is dropped silently, and
// its client retransmits the SYN after 1 s and then 3 s (Linux's SYN
// timeouts), past its 2 s dial timeout: a timeout. A keep-alive request
// the cap refuses kills its connection; the client retries it once on a
// new connection (net/http retries an idempotent request that failed on a
// reused connection), which meets the SYN gate and the cap again.
type httpPlant struct {
	rng      *rand.Rand
	workers  int
	work     float64 // seconds
	overhead float64
	keep     bool // keep-alive: requests ride established connections, the rate never sees them

	now     float64
	busy    []float64 // end times of the requests in service
	started []float64 // their arrival times
	queue   []float64 // arrival times of those waiting
	stalled float64   // until when the service takes nothing and finishes nothing

	cap          float64
	rate, burst  float64
	tokens       float64
	rstTokens    float64 // the rule's reset bucket
	hostRst      float64 // the host's reset bucket
	synRetry     []synWait
	tickResp     []float64 // response times finished this tick
	tickAdmitted int
	tickOffered  int
	tickRefused  int // by the rate
	// Of the requests that arrived inside [winStart, winEnd):
	winStart, winEnd float64
	good             []float64 // response times of those served
	refusedWin       int
	timeoutWin       int
	maxQueue         int
}

func newHTTPPlant(seed uint64, keep bool) *httpPlant {
	return &httpPlant{rng: rand.New(rand.NewPCG(seed, 42)), workers: 4, work: 0.010, overhead: 0.001, keep: keep}
}

func (p *httpPlant) inFlight() int { return len(p.busy) + len(p.queue) }

func (p *httpPlant) inWindow(arrival float64) bool {
	return arrival >= p.winStart && arrival < p.winEnd
}

// advance runs the plant for d seconds offered rate lambda (Poisson), in
// steps of 0.1 ms.
func (p *httpPlant) advance(d, lambda float64) {
	const step = 0.0001
	for end := p.now + d; p.now < end-1e-12; {
		p.now += step
		p.tokens = min(p.tokens+p.rate*step, max(p.burst, 1))
		p.rstTokens = min(p.rstTokens+p.rate*step, max(p.burst, 1))
		p.hostRst = min(p.hostRst+1000*step, 1000)
		// SYNs retransmitted now.
		for i := 0; i < len(p.synRetry); {
			if w := p.synRetry[i]; w.at <= p.now+1e-12 {
				p.synRetry = slices.Delete(p.synRetry, i, i+1)
				p.connect(w.arrival, w.tries, w.retried)
				continue
			}
			i++
		}
		for range poisson(p.rng, lambda*step) {
			p.tickOffered++
			if !p.keep {
				p.connect(p.now, 0, false)
				continue
			}
			p.request(p.now, false)
		}
		if p.now < p.stalled {
			continue
		}
		// Completions, then the queue into free workers.
		for i := 0; i < len(p.busy); {
			if p.busy[i] <= p.now {
				rt := p.busy[i] - p.started[i] + p.overhead
				if rt <= 2 {
					p.tickResp = append(p.tickResp, rt)
					if p.inWindow(p.started[i]) {
						p.good = append(p.good, rt)
					}
				} else if p.inWindow(p.started[i]) {
					p.timeoutWin++
				}
				p.busy = slices.Delete(p.busy, i, i+1)
				p.started = slices.Delete(p.started, i, i+1)
				continue
			}
			i++
		}
		for len(p.queue) > 0 && p.now-p.queue[0] > 2 {
			// The client gave up; the service drops it unstarted.
			if p.inWindow(p.queue[0]) {
				p.timeoutWin++
			}
			p.queue = p.queue[1:]
		}
		for len(p.busy) < p.workers && len(p.queue) > 0 {
			w := p.work * (0.9 + 0.2*p.rng.Float64())
			p.busy = append(p.busy, p.now+w)
			p.started = append(p.started, p.queue[0])
			p.queue = p.queue[1:]
		}
		p.maxQueue = max(p.maxQueue, len(p.queue))
	}
}

// synWait is a SYN dropped silently, to be retransmitted at at.
type synWait struct {
	at, arrival float64
	tries       int
	retried     bool
}

// connect is a SYN of a request that arrived at arrival (tries: SYNs
// dropped silently before it): through the rule's bucket, then the
// request.
func (p *httpPlant) connect(arrival float64, tries int, retried bool) {
	if p.rate > 0 {
		if p.tokens < 1 {
			p.tickRefused++
			if p.rstTokens >= 1 && p.hostRst >= 1 {
				p.rstTokens--
				p.hostRst--
				if p.inWindow(arrival) {
					p.refusedWin++
				}
				return
			}
			// Silent: retransmitted after 1 s, then 2 s more; the
			// dial gives up at 2 s.
			if next := arrival + float64(int(1)<<(tries+1)) - 1; next-arrival < 2 {
				p.synRetry = append(p.synRetry, synWait{at: next, arrival: arrival, tries: tries + 1, retried: retried})
			} else if p.inWindow(arrival) {
				p.timeoutWin++
			}
			return
		}
		p.tokens--
	}
	p.request(arrival, retried)
}

// request is a request on an established connection: the cap, then the
// service's queue. A keep-alive request the cap refused is retried once
// on a new connection.
func (p *httpPlant) request(arrival float64, retried bool) {
	if p.cap > 0 && float64(p.inFlight()) >= p.cap {
		if p.keep && !retried {
			p.connect(arrival, 0, true)
			return
		}
		if p.inWindow(arrival) {
			p.refusedWin++
		}
		return
	}
	p.tickAdmitted++
	p.queue = append(p.queue, arrival)
}

// signals is what the sampler reads at the end of a tick of length dt:
// the responses' median, their count, the requests in flight (the
// kernel's count), the base as the minimum of the medians seen.
func (p *httpPlant) signals(dt float64, base *float64) Signals {
	s := Signals{UsedRate: float64(p.tickAdmitted) / dt, Demand: float64(p.tickOffered) / dt, RateRefused: float64(p.tickRefused) / dt,
		ErrorsStale: true, CPUStale: true, LatencyStale: true,
		InFlight: float64(p.inFlight()), HasInFlight: true, InFlightRequests: true,
		ServiceRate: float64(len(p.tickResp)) / dt, HasServiceRate: true}
	if len(p.tickResp) > 0 {
		slices.Sort(p.tickResp)
		med := p.tickResp[len(p.tickResp)/2]
		if *base == 0 || med < *base {
			*base = med
		}
		s.Latency, s.LatencyStale, s.BaseLatency = seconds(med), false, seconds(*base)
	}
	p.tickResp, p.tickAdmitted, p.tickOffered, p.tickRefused = p.tickResp[:0], 0, 0, 0
	return s
}

func pct99(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[max(int(math.Ceil(0.99*float64(len(v))))-1, 0)]
}

type spikeResult struct {
	goodput, p99 float64 // of the spike's requests
	refused      int
	timeouts     int
	maxQueue     int
	caps         []float64 // the cap after each tick of the spike
	minRate      float64   // the lowest rate written during the spike
}

// runSpike offers 0.5 C for 5 s, mult × C for 10 s, 0.5 C for 5 s (C =
// 400/s, the plant's nominal capacity) and steers the plant with tr (nil:
// a fixed cap fixedCap, nginx limit_conn's analogue).
func runSpike(t *testing.T, tr *Track, fixedCap float64, mult float64, keep bool, seed uint64) spikeResult {
	t.Helper()
	const c, tick = 400.0, 0.05
	p := newHTTPPlant(seed, keep)
	p.winStart, p.winEnd = 5, 15
	p.cap = fixedCap
	if tr != nil {
		p.rate, p.burst, p.tokens = tr.Rate(), max(tr.Rate()*0.01, 1), 1
	}
	var base float64
	res := spikeResult{minRate: math.Inf(1)}
	for k := 0; k < 20/tick; k++ {
		now := float64(k) * tick
		lambda := 0.5 * c
		if now >= 5 && now < 15 {
			lambda = mult * c
		}
		p.advance(tick, lambda)
		sig := p.signals(tick, &base)
		if tr == nil {
			continue
		}
		st := tr.Step(sig, seconds(tick))
		p.cap, p.rate = st.InFlightCap, st.Rate
		p.burst = max(st.MaxBurst, 1)
		if now >= 5 && now < 15 {
			res.caps = append(res.caps, st.InFlightCap)
			res.minRate = min(res.minRate, st.Rate)
		}
	}
	// Let the last of the spike's requests finish.
	p.advance(2.5, 0)
	res.goodput = float64(len(p.good)) / (p.winEnd - p.winStart)
	res.p99, res.refused, res.timeouts, res.maxQueue = pct99(p.good), p.refusedWin, p.timeoutWin, p.maxQueue
	return res
}

// The law's keep-alive scenario of issue 42, in the model: a spike of 2×
// and 10× the capacity with keep-alive clients (only the cap can refuse
// them) and with a connection per request (the rate and the cap), beside a
// fixed cap of 8 requests (nginx's limit_conn 8 of the benchmark). No
// number of the rule depends on the capacity: rate 100000, min 1.
func TestTrackRequestsSpike(t *testing.T) {
	for _, keep := range []bool{true, false} {
		for _, mult := range []float64{2, 10} {
			ref := runSpike(t, nil, 8, mult, keep, 7)
			tr := mustTrack(t, 30*time.Millisecond, 1, 100000, 100000)
			got := runSpike(t, tr, 0, mult, keep, 7)
			t.Logf("keep-alive %v, %v×: law goodput %.0f/s p99 %.1f ms refused %d timeouts %d queue %d caps %v…; fixed cap 8: %.0f/s p99 %.1f ms",
				keep, mult, got.goodput, 1000*got.p99, got.refused, got.timeouts, got.maxQueue, got.caps[:min(12, len(got.caps))], ref.goodput, 1000*ref.p99)
			if got.goodput < 0.95*400 {
				t.Errorf("keep-alive %v, %v×: goodput %.0f/s, want ≥ 95 %% of 400", keep, mult, got.goodput)
			}
			if got.p99 > ref.p99+0.010 {
				t.Errorf("keep-alive %v, %v×: p99 %.1f ms, want ≤ the fixed cap's %.1f ms + 10 ms", keep, mult, 1000*got.p99, 1000*ref.p99)
			}
			if got.timeouts > 0 {
				t.Errorf("keep-alive %v, %v×: %d timeouts", keep, mult, got.timeouts)
			}
			// The rate is never cut below the service's rate: keep-alive
			// clients' replacement connections are not starved.
			if got.minRate < 400 {
				t.Errorf("keep-alive %v, %v×: rate cut to %.0f/s during the spike, below the capacity", keep, mult, got.minRate)
			}
		}
	}
}

// A service that stops answering for a second (a pause of its process)
// while requests are in flight: the limit does not sit at what it was
// when the responses stopped, it probes upward after requestStall, and
// the service is back at its capacity within a second of resuming.
func TestTrackRequestsStallProbes(t *testing.T) {
	const tick = 0.05
	tr := mustTrack(t, 30*time.Millisecond, 1, 100000, 100000)
	p := newHTTPPlant(3, true)
	p.winStart, p.winEnd = 4, 5
	var base float64
	var capAtStall, capAfter float64
	var actions []Action
	for k := 0; k < 100; k++ {
		now := float64(k) * tick
		if k == 40 {
			p.stalled = now + 1 // 2 s to 3 s
		}
		p.advance(tick, 800)
		st := tr.Step(p.signals(tick, &base), seconds(tick))
		p.cap, p.rate = st.InFlightCap, st.Rate
		switch {
		case k == 40:
			capAtStall = st.InFlightCap
		case k == 59:
			capAfter = st.InFlightCap
		}
		if k > 40 && k < 60 {
			actions = append(actions, st.Action)
		}
	}
	t.Logf("cap %v at the stall, %v a second later; actions %v; goodput in the second after it %d", capAtStall, capAfter, actions, len(p.good))
	if capAfter <= capAtStall {
		t.Errorf("cap %v after a second without responses, want above %v (probed)", capAfter, capAtStall)
	}
	if !slices.Contains(actions, ActionProbe) {
		t.Errorf("no probe during the stall: %v", actions)
	}
	if len(p.good) < 360 {
		t.Errorf("served %d in the second from 4 s (a second after the stall), want ≥ 360", len(p.good))
	}
}

// The service slows from 10 to 25 ms a request under 2× load: at the next
// sample the cap falls to what the slower service completes within the
// goal (Little's law), not by halves over many ticks.
func TestTrackRequestsCapacityStep(t *testing.T) {
	const tick = 0.05
	tr := mustTrack(t, 30*time.Millisecond, 1, 100000, 100000)
	p := newHTTPPlant(5, true)
	var base float64
	var before, caps []float64
	for k := 0; k < 200; k++ {
		if k == 100 {
			p.work = 0.025
		}
		p.advance(tick, 800)
		st := tr.Step(p.signals(tick, &base), seconds(tick))
		p.cap, p.rate = st.InFlightCap, st.Rate
		if k >= 80 && k < 100 {
			before = append(before, st.InFlightCap)
		}
		if k >= 100 && k < 110 {
			caps = append(caps, st.InFlightCap)
		}
	}
	t.Logf("caps before %v, after the step %v", before, caps)
	// 4 workers / 25 ms = 160/s; goal ≈ 11 + 10 ms → ≈ 3.4 in flight at
	// the old base, more as the base is the slower service's.
	if c := caps[2]; c > 8 {
		t.Errorf("cap %v two ticks after the step, want ≤ 8", c)
	}
	if slices.Max(before) > 14 || slices.Min(before) < 4 {
		t.Errorf("cap before the step in [%v, %v], want within [4, 14] for 4 workers", slices.Min(before), slices.Max(before))
	}
}

// Branches of the requests regime, exact.
func TestTrackRequestsBranches(t *testing.T) {
	tick := 50 * time.Millisecond
	sig := func(n, rtt, base, mu float64) Signals {
		return Signals{InFlight: n, HasInFlight: true, InFlightRequests: true, HasServiceRate: true, ServiceRate: mu,
			Latency: seconds(rtt), BaseLatency: seconds(base), LatencyStale: rtt == 0, ErrorsStale: true, CPUStale: true}
	}
	tr := mustTrack(t, 30*time.Millisecond, 1, 100000, 50000)
	// First sample, 2 in flight at the idle latency: room for twice that
	// plus two, or the completions within the goal (0.021 × 180 = 3.8).
	st := tr.Step(sig(2, 0.011, 0.011, 180), tick)
	if st.InFlightCap != 6 || st.Action != ActionHoldIdle {
		t.Fatalf("first sample: cap %v action %v, want 6 hold_idle", st.InFlightCap, st.Action)
	}
	// At the cap, fast: probe by 1 + s/τ = 1 + 0.01/0.075.
	st = tr.Step(sig(6, 0.015, 0.011, 380), tick)
	if want := math.Round(6 * (1 + 0.01/0.075)); st.InFlightCap != want || st.Action != ActionProbe {
		t.Fatalf("binding, fast: cap %v action %v, want %v probe", st.InFlightCap, st.Action, want)
	}
	// Slow: Little's law, 400/s × 21 ms = 8.4, not below half the limit.
	tr.req.limit = 30
	st = tr.Step(sig(30, 0.080, 0.011, 400), tick)
	if st.InFlightCap != 15 || st.Action != ActionTrack {
		t.Fatalf("slow, from 30: cap %v action %v, want 15 (half) track", st.InFlightCap, st.Action)
	}
	st = tr.Step(sig(15, 0.040, 0.011, 400), tick)
	if st.InFlightCap != 8 {
		t.Fatalf("slow, from 15: cap %v, want 8 (400 × 0.021)", st.InFlightCap)
	}
	// The rate of new connections stays at the rule's own (50000): the
	// cap refuses requests, by resets at any rate; a rate at what the
	// service completes refused SYNs past the reset budgets, silently.
	if st.Rate != 50000 {
		t.Fatalf("rate %v, want the rule's 50000", st.Rate)
	}
	// Errors above the threshold cut it to μ for the tick; it grows back
	// by 1 + s/τ a sample, from what the service completes.
	errs := sig(8, 0.015, 0.011, 400)
	errs.ErrorsStale, errs.ErrorRate = false, 0.5
	if st = tr.Step(errs, tick); st.Rate != 400 || st.Action != ActionCutErrors {
		t.Fatalf("errors: rate %v %v, want 400 cut_errors", st.Rate, st.Action)
	}
	if st = tr.Step(sig(8, 0.015, 0.011, 400), tick); st.Rate <= 400 || st.Rate >= 50000 {
		t.Fatalf("after errors: rate %v, want grown from 400, not yet back at 50000", st.Rate)
	}
	for range 100 {
		st = tr.Step(sig(8, 0.015, 0.011, 400), tick)
	}
	if st.Rate != 50000 {
		t.Fatalf("100 samples after errors: rate %v, want back at 50000", st.Rate)
	}
	// No response with requests in flight: held for requestStall, then
	// probed each tick.
	limit, rate := tr.req.limit, tr.Rate()
	for i := 1; i <= 12; i++ {
		st = tr.Step(sig(8, 0, 0, 0), tick)
		stalled := float64(i)*0.05 >= requestStall-1e-9
		if !stalled && (st.Action != ActionHoldStale || tr.req.limit != limit || st.Rate != rate) {
			t.Fatalf("tick %d without responses: %v cap %v rate %v, want held", i, st.Action, st.InFlightCap, st.Rate)
		}
		if stalled && (st.Action != ActionProbe || tr.req.limit <= limit || st.Rate <= rate) {
			t.Fatalf("tick %d without responses: %v limit %v rate %v, want probed above %v, %v", i, st.Action, tr.req.limit, st.Rate, limit, rate)
		}
		limit, rate = tr.req.limit, st.Rate
	}
	// Idle (nothing in flight, no response): held whatever the time.
	limit, rate = tr.req.limit, tr.Rate()
	for range 100 {
		st = tr.Step(sig(0, 0, 0, 0), tick)
	}
	if tr.req.limit != limit || st.Rate != rate || st.Action != ActionHoldStale {
		t.Fatalf("idle: limit %v rate %v %v, want held at %v %v", tr.req.limit, st.Rate, st.Action, limit, rate)
	}
	// An unused limit shrinks to twice the peak in flight plus two.
	for range requestPeakSamples {
		st = tr.Step(sig(1, 0.011, 0.011, 100), tick)
	}
	if st.InFlightCap != 4 || st.Action != ActionHoldIdle {
		t.Fatalf("unused: cap %v %v, want 4 hold_idle", st.InFlightCap, st.Action)
	}
}

// Issue 42's hold: a response_time rule cut to 91/s after a spike, then
// ticks without a response (the connections' requests abandoned). Without
// a request count the law held 91/s for 8 s while the service could serve
// 366/s; now it holds for requestStall, then probes back up to the
// capacity it measured, and no further.
func TestTrackNoResponseProbesToCapacity(t *testing.T) {
	tick := 50 * time.Millisecond
	tr := mustTrack(t, 30*time.Millisecond, 36, 7320, 366)
	// Saturated samples: the service completes 366/s with a long queue;
	// the rate is cut.
	for range 3 {
		tr.Step(Signals{Latency: 1500 * time.Millisecond, BaseLatency: 11 * time.Millisecond, HasServiceRate: true, ServiceRate: 366,
			UsedRate: 91, Demand: 3000, ErrorsStale: true, CPUStale: true, InFlight: 500, HasInFlight: true}, tick)
	}
	cut := tr.Rate()
	if cut >= 366 {
		t.Fatalf("rate %v after saturated samples, want a cut below 366", cut)
	}
	noResp := Signals{LatencyStale: true, HasServiceRate: true, ServiceRate: 0, UsedRate: 20, Demand: 3000, ErrorsStale: true, CPUStale: true,
		InFlight: 500, HasInFlight: true}
	var rates []float64
	for range 40 {
		rates = append(rates, tr.Step(noResp, tick).Rate)
	}
	t.Logf("cut to %.0f; then without responses: %.0f", cut, rates)
	for i, r := range rates[:9] {
		if r != cut {
			t.Fatalf("tick %d without responses: rate %v, want held at %v for %v", i+1, r, cut, requestStall)
		}
	}
	best := 366 * (1 + 0.01/(tauFactor*requestStall))
	if r := rates[len(rates)-1]; math.Abs(r-best) > 1e-6 {
		t.Fatalf("rate %v after 2 s without responses, want back at the capacity seen × probe, %v", r, best)
	}
}
