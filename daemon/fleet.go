//go:build linux

package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/control"
	"github.com/xlimit/xlimit/userspace/durable"
	"github.com/xlimit/xlimit/userspace/fleet"
	"github.com/xlimit/xlimit/userspace/metrics"
	"github.com/xlimit/xlimit/userspace/rulesource"
)

// fleetShare is the daemon's side of --fleet (docs/fleet.md): the control
// loop bounds every fleet rule by the Host's Cap and feeds it the offered
// rates; a goroutine of its own exchanges with the store once per epoch,
// so that the loop never waits for Redis.
type fleetShare struct {
	log      *slog.Logger
	clock    control.Clock
	opts     fleet.Options
	node     string
	host     *fleet.Host
	store    *fleet.RedisStore
	presence *fleet.Presence
	lastTick time.Time // the loop goroutine's
}

// presenceEvery is how often the daemon claims its fleet member id; a
// claim lasts presenceTTL.
const (
	presenceEvery = time.Second
	presenceTTL   = 3 * presenceEvery
)

// openFleet parses --fleet (url) and --node-name (node) for a control
// loop of the given period; nil without --fleet. The loop takes its Host
// as its cap.
func openFleet(url, node, stateDir string, period time.Duration, clock control.Clock, log *slog.Logger) (*fleetShare, error) {
	if url == "" {
		return nil, nil
	}
	o, err := fleet.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("%w: --fleet: %v", ErrUsage, err)
	}
	for _, w := range rulesource.TrustWarnings(o.Redis, "--fleet") {
		log.Warn("FLEET STORE OPEN TO THE NETWORK: " + w)
	}
	if node, err = fleetIdentity(node, stateDir); err != nil {
		return nil, err
	}
	// The loop writes every period; a lease must not end between two
	// writes (half a period of margin for a late tick).
	guard := period * 3 / 2
	h, err := fleet.NewHost(node, fleet.Config{Interval: o.Interval, Guard: guard})
	if err != nil {
		return nil, fmt.Errorf("%w: --fleet: %v", ErrUsage, err)
	}
	log.Info("sharing fleet budgets", "store", o.URL, "node", node, "interval", o.Interval)
	return &fleetShare{log: log, clock: clock, opts: o, node: node, host: h, store: fleet.OpenRedis(o), presence: fleet.NewPresence(node)}, nil
}

// setRules gives the Host the fleet rules in force.
func (f *fleetShare) setRules(rules []fleet.Rule) {
	if f != nil {
		f.host.SetRules(rules)
	}
}

// observe feeds the Host each fleet rule's offered rate of a tick.
func (f *fleetShare) observe(rep control.TickReport) {
	if f == nil {
		return
	}
	dt := rep.Start.Sub(f.lastTick)
	f.lastTick = rep.Start
	if dt <= 0 || dt > time.Minute {
		return
	}
	for _, r := range rep.Rules {
		f.host.Observe(r.Name, r.Demand, dt)
	}
}

// run exchanges with the store once per epoch until ctx ends or stop is
// called.
func (f *fleetShare) run(parent context.Context) (stop func()) {
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
		budgets := map[string]float64{}         // the store's budget last logged, per rule
		var claimed, conflictLogged time.Time
		var mismatches uint64
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			now := f.clock.Now()
			if now.Sub(claimed) >= presenceEvery {
				claimed = now
				cctx, cancel := context.WithTimeout(ctx, f.opts.Interval)
				other, err := f.presence.Check(cctx, f.store, presenceTTL)
				cancel()
				if other && now.Sub(conflictLogged) >= time.Minute {
					conflictLogged = now
					f.log.Error("ANOTHER DAEMON REPORTS AS THIS FLEET MEMBER: their demands merge in the store and each takes a whole share; give each host its own --node-name and state directory (fleet-instance-id)",
						"member", f.node, "store", f.opts.URL, "conflicts", f.presence.Others())
				}
				if err != nil {
					f.log.Debug("fleet member claim", "err", err)
				}
			}
			if f.host.Due(now) {
				reps := f.host.Reports()
				cctx, cancel := context.WithTimeout(ctx, f.opts.Interval)
				ans, err := f.store.Exchange(cctx, f.node, reps)
				cancel()
				switch {
				case err != nil:
					f.host.Fail(f.clock.Now())
					if up {
						f.log.Error("FLEET STORE LOST: fleet rules fall back to their safe share when their leases end", "store", f.opts.URL, "err", err)
					}
					up = false
				default:
					if err := f.host.Apply(now, f.clock.Now(), reps, ans); err != nil {
						f.log.Error("fleet store", "err", err)
					}
					if !up {
						f.log.Info("fleet store back", "store", f.opts.URL)
					}
					up = true
					if n := f.host.ClockSteps(); n != steps {
						steps = n
						f.log.Warn("fleet store's clock stepped, or another server answers (a restart or a failover): shares rise only once every earlier lease has ended",
							"store", f.opts.URL, "discontinuities", n)
					}
					if n := f.host.BudgetMismatches(); n != mismatches {
						mismatches = n
						for _, r := range f.host.Status(f.clock.Now()) {
							if r.StoreBudget != 0 && r.StoreBudget != budgets[r.Rule] {
								budgets[r.Rule] = r.StoreBudget
								f.log.Warn("FLEET BUDGET MISMATCH: another host of this fleet key carries another budget; the store divides whichever started the epoch",
									"rule", r.Rule, "key", r.Key, "store_budget", r.StoreBudget, "mismatches", n)
							}
						}
					}
					for _, r := range f.host.Status(f.clock.Now()) {
						if r.Interval != 0 && r.Interval != intervals[r.Rule] {
							if r.Interval != f.opts.Interval || intervals[r.Rule] != 0 {
								f.log.Info("fleet key's epoch: the shortest interval its hosts ask for", "rule", r.Rule, "key", r.Key,
									"epoch", r.Interval, "interval", f.opts.Interval)
							}
							intervals[r.Rule] = r.Interval
						}
					}
				}
			}
			wait := min(max(f.host.Next().Sub(f.clock.Now()), time.Millisecond), f.opts.Interval)
			timer.Reset(wait)
		}
	}()
	return func() {
		cancel()
		<-done
		f.store.Close()
	}
}

// status is the fleet part of GET /v1/status; nil without --fleet.
func (f *fleetShare) status() *api.FleetStatus {
	if f == nil {
		return nil
	}
	st := &api.FleetStatus{Node: f.node, Store: f.opts.URL, Up: f.host.Up(), Rules: []api.FleetRuleStatus{},
		MemberConflicts: f.presence.Others(), BudgetMismatches: f.host.BudgetMismatches()}
	for _, r := range f.host.Status(f.clock.Now()) {
		st.Rules = append(st.Rules, api.FleetRuleStatus{Rule: r.Rule, Key: r.Key, Share: r.Share, Demand: r.Demand,
			State: r.State, LeaseAgeSeconds: r.LeaseAge.Seconds(), Hosts: r.Hosts, StoreBudget: r.StoreBudget})
	}
	return st
}

// metrics is the collector's view of the fleet rules.
func (f *fleetShare) metrics() []metrics.FleetRule {
	st := f.status()
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

// instanceFile holds this host's fleet instance id, in the state directory.
const instanceFile = "fleet-instance-id"

// fleetIdentity is this host's identity in the fleet store: node (the
// hostname when "") and an instance id, "NODE/ID". The id is random,
// made once and kept in the state directory, so that two hosts of one
// name (cloned images, "localhost", two daemons with their own state
// directories) are two members of the fleet by construction, and a
// restart is the same member (issue 41, M4). A state directory copied
// with an image keeps its id: a second reporter of one identity is
// detected (fleet.Presence) and alarmed.
func fleetIdentity(node, stateDir string) (string, error) {
	if node == "" {
		var err error
		if node, err = os.Hostname(); err != nil {
			return "", fmt.Errorf("%w: --node-name not given and no hostname: %v", ErrUsage, err)
		}
	}
	path := filepath.Join(stateDir, instanceFile)
	data, err := os.ReadFile(path)
	id := strings.TrimSpace(string(data))
	switch {
	case err == nil && validInstance(id):
	case err == nil || errors.Is(err, fs.ErrNotExist):
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("make a fleet instance id: %w", err)
		}
		id = hex.EncodeToString(b[:])
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return "", fmt.Errorf("write the fleet instance id: %w", err)
		}
		if err := durable.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
			return "", fmt.Errorf("write the fleet instance id: %w", err)
		}
	default:
		return "", fmt.Errorf("read the fleet instance id: %w", err)
	}
	return node + "/" + id, nil
}

// validInstance reports whether id is an instance id as fleetIdentity
// makes them: 16 lower-case hex digits.
func validInstance(id string) bool {
	if len(id) != 16 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil && strings.ToLower(id) == id
}

// health is the collector's view of the fleet's counters.
func (f *fleetShare) health() metrics.FleetHealth {
	return metrics.FleetHealth{MemberConflicts: f.presence.Others(), BudgetMismatches: f.host.BudgetMismatches()}
}
