package fleet

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// SimParams describe a simulated fleet: every host runs a Host against
// one MemStore on a virtual clock; a host's control loop writes min(its
// ceiling, Cap) every Tick, and its offered rate per rule is skewed
// (Zipf over the hosts) and shifts at ShiftAt (the ranks are redrawn).
type SimParams struct {
	Hosts, Rules int
	Duration     time.Duration
	ShiftAt      time.Duration
	Tick         time.Duration // the loop's period (50 ms in the daemon)
	Interval     time.Duration // the epoch T
	Step         time.Duration // the simulation's resolution
	Skew         float64       // Zipf exponent of the demand over the hosts
	Budget       float64       // per rule
	// Load is the total offered rate of a rule as a multiple of the
	// budget; rules alternate between Load and Load/3 (over- and
	// undersubscribed).
	Load float64
	// Lost is the probability that an exchange fails.
	Lost float64
	// RTT bounds an exchange's round trip (uniform in [0, RTT]): the store
	// reads its clock half-way, the host gets the answer at the end.
	RTT  time.Duration
	Seed uint64
}

// SimResult is what a simulation measured.
type SimResult struct {
	Params SimParams
	// MaxOver is the largest excess of the sum of the rates in force over
	// the budget, over all rules and the steps after the first second, as
	// a fraction of the budget, after the cold start (2T + L + one tick:
	// every host new, at a safe share); MaxOverLeased the same over the
	// hosts whose rate an allocation covers (the bound says ≤ 0);
	// ColdOver is MaxOver during the cold start.
	MaxOver, MaxOverLeased, ColdOver float64
	// AdmitErr is the mean, over the steady-state checks before the shift
	// and over rules, of |admitted − min(budget, offered)| ÷ budget: the
	// budget left unused (the headroom of the hosts below the water
	// level) or exceeded.
	AdmitErr float64
	// Converge is the time from the shift until 99 % of the (host, rule)
	// pairs hold a share within 10 % of their max-min share of the true
	// demand and every rule's admitted rate is within 2 % of the budget
	// of what those shares admit; -1 if never.
	Converge time.Duration
	// Calls and Commands per second of the store (Redis commands the
	// script would run).
	CallsPerSec, CommandsPerSec float64
	// Gaps counts writes that came after the previous write's deadline
	// (the kernel would have fallen back to the static rate meanwhile).
	Gaps int
	// Fallback is the fraction of (host, rule, tick) writes at a safe
	// share after the cold start.
	Fallback float64
}

var debugOver func(now time.Time, r int, hosts []*Host, rates []float64)

// Simulate runs p.
func Simulate(p SimParams) (SimResult, error) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	var storeDelay time.Duration
	store := NewMemStore(func() time.Time { return now.Add(storeDelay) }, p.Interval)
	rng := rand.New(rand.NewPCG(p.Seed, 1))
	type hostSim struct {
		h        *Host
		name     string
		phase    time.Duration
		lastTick time.Time
		rate     []float64   // in force, per rule
		deadline []time.Time // of the write in force; zero: none
	}
	rules := make([]Rule, p.Rules)
	for r := range rules {
		rules[r] = Rule{Name: fmt.Sprintf("r%d", r), Key: fmt.Sprintf("k%d", r), Budget: p.Budget, Burst: p.Budget / 10}
	}
	hosts := make([]*hostSim, p.Hosts)
	for i := range hosts {
		name := fmt.Sprintf("host-%04d", i)
		h, err := NewHost(name, Config{Interval: p.Interval, Guard: p.Tick + p.Tick/2})
		if err != nil {
			return SimResult{}, err
		}
		h.SetRules(rules)
		hosts[i] = &hostSim{h: h, name: name, phase: time.Duration(rng.Int64N(int64(p.Tick/p.Step))) * p.Step, rate: make([]float64, p.Rules), deadline: make([]time.Time, p.Rules)}
	}
	// offered[phase][rule][host]
	offered := [2][][]float64{}
	for ph := range 2 {
		offered[ph] = make([][]float64, p.Rules)
		for r := range p.Rules {
			total := p.Budget * p.Load
			if r%2 == 1 {
				total /= 3
			}
			perm := rng.Perm(p.Hosts)
			w := make([]float64, p.Hosts)
			sum := 0.0
			for i := range w {
				w[i] = 1 / math.Pow(float64(perm[i]+1), p.Skew)
				sum += w[i]
			}
			offered[ph][r] = make([]float64, p.Hosts)
			for i := range w {
				offered[ph][r][i] = total * w[i] / sum
			}
		}
	}
	// The ideal: the max-min shares of the true demands (with the same
	// headroom and floor the hosts use).
	ideal := [2][][]float64{}
	for ph := range 2 {
		ideal[ph] = make([][]float64, p.Rules)
		for r := range p.Rules {
			ds := make([]float64, p.Hosts)
			for i := range ds {
				ds[i] = offered[ph][r][i] * DefaultHeadroom
			}
			a := Allocate(p.Budget, ds)
			ideal[ph][r] = make([]float64, p.Hosts)
			for i := range ds {
				ideal[ph][r][i] = a.Share(ds[i])
			}
		}
	}
	res := SimResult{Params: p, Converge: -1}
	// A cold fleet has no allocation until every host has reported once
	// and the next epoch's window has passed.
	coldEnd := 2*p.Interval + p.Interval*3/4 + p.Tick
	checkFrom := coldEnd + time.Second
	sumRate := make([]float64, p.Rules)
	leasedSum := make([]float64, p.Rules)
	leased := make([][]bool, p.Rules)
	for r := range leased {
		leased[r] = make([]bool, p.Hosts)
	}
	var errSum float64
	var errN, writes, fallbacks int
	convergedSince := time.Duration(-1)
	ctx := context.Background()
	for t := time.Duration(0); t < p.Duration; t += p.Step {
		now = start.Add(t)
		ph := 0
		if t >= p.ShiftAt {
			ph = 1
		}
		for i, hs := range hosts {
			if hs.h.Due(now) {
				reps := hs.h.Reports()
				if rng.Float64() < p.Lost {
					hs.h.Fail(now)
				} else {
					rtt := time.Duration(0)
					if p.RTT > 0 {
						rtt = time.Duration(rng.Int64N(int64(p.RTT)))
					}
					storeDelay = rtt / 2
					ans, err := store.Exchange(ctx, hs.name, reps)
					storeDelay = 0
					if err != nil {
						return res, err
					}
					if err := hs.h.Apply(now, now.Add(rtt), reps, ans); err != nil {
						return res, err
					}
				}
			}
			if (t-hs.phase)%p.Tick != 0 || t < hs.phase {
				continue
			}
			dt := now.Sub(hs.lastTick)
			first := hs.lastTick.IsZero()
			hs.lastTick = now
			for r := range p.Rules {
				if !first {
					hs.h.Observe(rules[r].Name, offered[ph][r][i], dt)
				}
				c, _, until, _ := hs.h.Cap(rules[r].Name, now)
				if d := hs.deadline[r]; !d.IsZero() && now.After(d) {
					res.Gaps++
				}
				sumRate[r] += c - hs.rate[r]
				if leased[r][i] {
					leasedSum[r] -= hs.rate[r]
				}
				hs.rate[r], hs.deadline[r] = c, until
				leased[r][i] = hs.h.covered(rules[r].Name, now)
				if leased[r][i] {
					leasedSum[r] += c
				}
				if t >= coldEnd {
					writes++
					if until.IsZero() {
						fallbacks++
					}
				}
			}
		}
		for r := range p.Rules {
			if t < coldEnd {
				// A cold fleet: every host starts at a safe share
				// before any allocation exists.
				res.ColdOver = math.Max(res.ColdOver, sumRate[r]/p.Budget-1)
				continue
			}
			res.MaxOver = math.Max(res.MaxOver, sumRate[r]/p.Budget-1)
			res.MaxOverLeased = math.Max(res.MaxOverLeased, leasedSum[r]/p.Budget-1)
			if debugOver != nil && leasedSum[r] > p.Budget*(1+1e-9) {
				hs := []*Host{}
				rates := []float64{}
				for i, h := range hosts {
					hs = append(hs, h.h)
					if leased[r][i] {
						rates = append(rates, h.rate[r])
					} else {
						rates = append(rates, 0)
					}
				}
				debugOver(now, r, hs, rates)
			}
		}
		if t%p.Tick != 0 || t < checkFrom {
			continue
		}
		// The checks, once per tick: the admitted rate and the shares.
		worst, within, pairs := 0.0, 0, 0
		for r := range p.Rules {
			adm, off, idealAdm := 0.0, 0.0, 0.0
			for i, hs := range hosts {
				o := offered[ph][r][i]
				adm += math.Min(o, hs.rate[r])
				idealAdm += math.Min(o, ideal[ph][r][i])
				off += o
				pairs++
				id := ideal[ph][r][i]
				if math.Abs(hs.rate[r]-id) <= 0.1*id {
					within++
				}
			}
			e := math.Abs(adm-math.Min(p.Budget, off)) / p.Budget
			worst = math.Max(worst, math.Abs(adm-idealAdm)/p.Budget)
			if t < p.ShiftAt {
				errSum += e
				errN++
			}
		}
		if t >= p.ShiftAt {
			ok := worst <= 0.02 && float64(within) >= 0.99*float64(pairs)
			switch {
			case ok && convergedSince < 0:
				convergedSince = t - p.ShiftAt
			case !ok:
				convergedSince = -1
			}
		}
	}
	res.Converge = convergedSince
	if errN > 0 {
		res.AdmitErr = errSum / float64(errN)
	}
	if writes > 0 {
		res.Fallback = float64(fallbacks) / float64(writes)
	}
	secs := p.Duration.Seconds()
	res.CallsPerSec = float64(store.Calls) / secs
	res.CommandsPerSec = float64(store.Commands) / secs
	return res, nil
}
