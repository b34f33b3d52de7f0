//go:build linux

package daemon

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/fleet"
	"github.com/xlimit/xlimit/userspace/metrics"
)

// fleetShare is the daemon's side of --fleet (docs/fleet.md): the control
// loop bounds every fleet rule by the Host's Cap and feeds it the offered
// rates; a goroutine of its own exchanges with the store once per epoch,
// so that the loop never waits for Redis.
type fleetShare struct {
	opts     fleet.Options
	node     string
	host     *fleet.Host
	store    *fleet.RedisStore
	lastTick time.Time // the loop goroutine's
}

// openFleet parses --fleet and --node-name and hands the loop its cap.
func (d *daemon) openFleet() error {
	if d.opts.Fleet == "" {
		return nil
	}
	o, err := fleet.ParseURL(d.opts.Fleet)
	if err != nil {
		return fmt.Errorf("%w: --fleet: %v", ErrUsage, err)
	}
	node := d.opts.NodeName
	if node == "" {
		if node, err = os.Hostname(); err != nil {
			return fmt.Errorf("%w: --node-name not given and no hostname: %v", ErrUsage, err)
		}
	}
	// The loop writes every period; a lease must not end between two
	// writes (half a period of margin for a late tick).
	guard := d.loop.Period() * 3 / 2
	h, err := fleet.NewHost(node, fleet.Config{Interval: o.Interval, Guard: guard})
	if err != nil {
		return fmt.Errorf("%w: --fleet: %v", ErrUsage, err)
	}
	d.fleet = &fleetShare{opts: o, node: node, host: h, store: fleet.OpenRedis(o)}
	d.loop.SetCap(h)
	d.log.Info("sharing fleet budgets", "store", o.URL, "node", node, "interval", o.Interval)
	return nil
}

// fleetRules gives the Host the fleet rules of the specs in force.
func (d *daemon) fleetRules(s *Specs) {
	if d.fleet != nil {
		d.fleet.host.SetRules(s.Fleet)
	}
}

// fleetObserve feeds the Host each fleet rule's offered rate of a tick.
func (d *daemon) fleetObserve(start time.Time, rules []ruleDemand) {
	f := d.fleet
	if f == nil {
		return
	}
	dt := start.Sub(f.lastTick)
	f.lastTick = start
	if dt <= 0 || dt > time.Minute {
		return
	}
	for _, r := range rules {
		f.host.Observe(r.name, r.demand, dt)
	}
}

type ruleDemand struct {
	name   string
	demand float64
}

// runFleet exchanges with the store once per epoch until ctx ends or
// stop is called.
func (d *daemon) runFleet(parent context.Context) (stop func()) {
	f := d.fleet
	if f == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		up := true
		var steps uint64
		intervals := map[string]time.Duration{} // the key's epoch last logged, per rule
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			now := d.opts.Clock.Now()
			if f.host.Due(now) {
				reps := f.host.Reports()
				cctx, cancel := context.WithTimeout(ctx, f.opts.Interval)
				ans, err := f.store.Exchange(cctx, f.node, reps)
				cancel()
				switch {
				case err != nil:
					f.host.Fail(d.opts.Clock.Now())
					if up {
						d.log.Error("FLEET STORE LOST: fleet rules fall back to their safe share when their leases end", "store", f.opts.URL, "err", err)
					}
					up = false
				default:
					if err := f.host.Apply(now, d.opts.Clock.Now(), reps, ans); err != nil {
						d.log.Error("fleet store", "err", err)
					}
					if !up {
						d.log.Info("fleet store back", "store", f.opts.URL)
					}
					up = true
					if n := f.host.ClockSteps(); n != steps {
						steps = n
						d.log.Warn("fleet store's clock stepped, or another server answers (a restart or a failover): shares rise only once every earlier lease has ended",
							"store", f.opts.URL, "discontinuities", n)
					}
					for _, r := range f.host.Status(d.opts.Clock.Now()) {
						if r.Interval != 0 && r.Interval != intervals[r.Rule] {
							if r.Interval != f.opts.Interval || intervals[r.Rule] != 0 {
								d.log.Info("fleet key's epoch: the shortest interval its hosts ask for", "rule", r.Rule, "key", r.Key,
									"epoch", r.Interval, "interval", f.opts.Interval)
							}
							intervals[r.Rule] = r.Interval
						}
					}
				}
			}
			wait := min(max(f.host.Next().Sub(d.opts.Clock.Now()), time.Millisecond), f.opts.Interval)
			timer.Reset(wait)
		}
	}()
	return func() {
		cancel()
		<-done
		f.store.Close()
	}
}

// fleetStatus is the fleet part of GET /v1/status; nil without --fleet.
func (d *daemon) fleetStatus() *api.FleetStatus {
	f := d.fleet
	if f == nil {
		return nil
	}
	st := &api.FleetStatus{Node: f.node, Store: f.opts.URL, Up: f.host.Up(), Rules: []api.FleetRuleStatus{}}
	for _, r := range f.host.Status(d.opts.Clock.Now()) {
		st.Rules = append(st.Rules, api.FleetRuleStatus{Rule: r.Rule, Key: r.Key, Share: r.Share, Demand: r.Demand,
			State: r.State, LeaseAgeSeconds: r.LeaseAge.Seconds(), Hosts: r.Hosts})
	}
	return st
}

// fleetMetrics is the collector's view of the fleet rules.
func (d *daemon) fleetMetrics() []metrics.FleetRule {
	st := d.fleetStatus()
	if st == nil {
		return nil
	}
	out := make([]metrics.FleetRule, 0, len(st.Rules))
	for _, r := range st.Rules {
		out = append(out, metrics.FleetRule{Rule: r.Rule, Key: r.Key, Share: r.Share, Demand: r.Demand,
			LeaseAgeSeconds: r.LeaseAgeSeconds, State: r.State, Hosts: r.Hosts})
	}
	return out
}
