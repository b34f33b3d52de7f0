//go:build linux

// Package daemon is xlimit's daemon (`xlimit run`): it attaches the XDP
// program to the interfaces, applies every rules document through one path
// (rules.go), steers the kernel's rates with the control loop every period,
// and serves the local API and the Prometheus metrics. Its dependencies on
// the process (clocks, systemd's notify socket, the host's signals) are
// Options, so that it runs in-process in tests.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/control"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/metrics"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
	"github.com/xlimit/xlimit/userspace/watch"
)

type daemon struct {
	opts     Options
	log      *slog.Logger
	specs    *Specs // in force
	attach   []*loader.Attachment
	metrics  *metricsServer
	loop     *control.Loop
	dog      watchdog
	feedback *xsignal.Feedback
	probes   xsignal.Probes
	signals  loopSignals
	hostCPU  func() (float64, bool) // nil when the host's CPU cannot be read
	src      *ruleSource            // nil without a rules source
	fleet    *fleetShare            // nil without --fleet (fleet.go)
	queues   kernelQueues           // paced rules with queue: kernel (queue.go)

	mu    sync.Mutex // guards plans and attach against the metrics collector and the API
	plans map[string]*dataplane.Plan

	ifaces    []string              // the configured interfaces
	links     *links                // attaching and re-attaching to them (links.go)
	guard     atomic.Pointer[guard] // the rules file's allow and management (guard.go)
	hostAddrs hostAddrs             // the host's addresses in the kernel (hostaddrs.go)

	api     *api.Server
	prep    *preparer       // documents that arrive while running (prepare.go)
	inForce document        // the document in force (the loop goroutine's)
	pending *pendingConfirm // rules waiting for their confirmation (confirm.go)
	// confirm.go: the document in force as prepared; the deadline the
	// control loop's rates are capped at; the plans a pending change
	// returns to (guarded by mu, with bases); reverts done at the start.
	inForcePrep  *prepared
	capNS        uint64
	reserved     map[string]*dataplane.Plan
	bases        map[string]basePlan
	startReverts int
	confirmCh    chan chan error
	loopDone     chan struct{}

	rulesMu     sync.Mutex // guards the fields below against the API
	rulesText   []byte
	rulesSource string
	ruleNames   map[string]bool
}

// Run runs the daemon until ctx ends. Protection stays attached when it
// returns, unless DetachOnExit.
func Run(ctx context.Context, o Options) error {
	if o.Config == "" && o.RulesSource == "" {
		return fmt.Errorf("%w: --config or --rules-source is required", ErrUsage)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = control.RealClock{}
	}
	if o.Monotonic == nil {
		o.Monotonic = maps.MonotonicNS
	}
	if o.Notify == nil {
		o.Notify = sdNotify
	}
	if o.HostSignals == nil {
		o.HostSignals = func() (HostSignals, error) { return xsignal.NewSampler(250 * time.Millisecond) }
	}
	if o.FailStatic > MaxFailStatic {
		return fmt.Errorf("%w: --fail-static-after %v: at most %v", ErrUsage, o.FailStatic, MaxFailStatic)
	}
	loop, err := control.NewLoop(o.Clock, o.Monotonic, o.Period, o.FailStatic, nil)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	d := &daemon{opts: o, log: o.Logger, loop: loop, feedback: xsignal.NewFeedback(),
		queues: kernelQueues{log: o.Logger, detach: o.DetachOnExit}}
	d.hostAddrs = hostAddrs{log: o.Logger, attached: d.withAttached}
	return d.run(ctx)
}

func (d *daemon) run(ctx context.Context) (err error) {
	// SIGHUP is caught before anything else: its default action ends the
	// process, and systemd may send it (ExecReload) as soon as READY=1,
	// before the loop that reads it runs. One that comes during the start
	// waits in the channel and reloads once the loop runs.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if g := readGuard(d.opts.Config, d.log); g != nil { // guard.go
		d.guard.Store(g)
	}
	// The startup document may be large: SIGTERM must not wait for it.
	start, err := untilDone(ctx, func() (*prepared, error) { return d.startupRules(ctx) })
	if err != nil {
		if ctx.Err() != nil {
			d.log.Info("stopped while reading the rules; nothing was attached")
			return nil
		}
		return err
	}
	ifaces := d.opts.Interfaces
	if len(ifaces) == 0 {
		ifaces = start.cfg.Interfaces
	}
	if len(ifaces) == 0 {
		return fmt.Errorf("%w: no interfaces: give --iface or 'interfaces' in the rules file", ErrUsage)
	}
	d.plans, d.ifaces = make(map[string]*dataplane.Plan), ifaces
	defer func() {
		err = errors.Join(err, d.close())
	}()

	// The API socket first: a second daemon refused there must fail
	// before it touches any interface.
	d.prep, d.loopDone, d.confirmCh = newPreparer(), make(chan struct{}), make(chan chan error)
	defer close(d.loopDone)
	if d.opts.APISocket != "" {
		srv, err := api.Start(d.opts.APISocket, d, d.log)
		if err != nil {
			return err
		}
		d.api = srv
	}

	// Signals are read in the daemon's network namespace, the one of the
	// protected services.
	defer d.probes.Close()
	reader := &xsignal.Reader{Feedback: d.feedback, Probes: &d.probes, Now: time.Now}
	if host, err := d.opts.HostSignals(); err != nil {
		d.log.Warn("cannot read the host's signals; adaptive rules on them hold their rate", "err", err)
	} else {
		defer host.Close()
		reader.Host = host
		// The kernel's per-rule handshakes and response times (measures.go).
		if s, ok := host.(interface{ SetSources(xsignal.KernelSources) }); ok {
			km := &kernelMeasures{attached: d.withAttached}
			s.SetSources(xsignal.KernelSources{Handshakes: km, Responses: km, InFlight: km})
		}
		d.hostCPU = func() (float64, bool) {
			// Overload is CPU usage, or CPU pressure where asked for and
			// reported, whichever is the higher fraction of its threshold.
			load := xsignal.SystemLoad{CPU: host.CPU, Pressure: host.CPUPressure}
			if s := d.specs; s != nil && s.System != nil {
				load.CPUHigh, load.PressureHigh = s.System.CPUHigh, s.PressureHigh
			}
			return load.Load()
		}
	}
	outcomes := xsignal.NewOutcomeReader(&d.probes, d.log)
	defer outcomes.Close()
	d.signals = loopSignals{reader: reader, outcomes: outcomes}
	d.loop.SetSampler(&d.signals)
	d.loop.SetOutcomes(&d.signals)

	f, err := openFleet(d.opts.Fleet, d.opts.NodeName, d.loop.Period(), d.opts.Clock, d.log) // fleet.go
	if err != nil {
		return err
	}
	if f != nil {
		d.fleet = f
		d.loop.SetCap(f.host)
	}
	d.links = d.newLinks(ifaces, start)
	if err := d.links.attachAll(func(iface string) func(*maps.Tables) error { return d.fill(iface, start.specs) }); err != nil {
		return err
	}
	defer d.hostAddrs.watch(ctx)() // hostaddrs.go: what the program may answer
	if err := d.applyDocument(start.doc, start); err != nil {
		return err
	}

	if d.opts.MetricsAddr != "" {
		m, err := startMetrics(d.opts.MetricsAddr, d.metricTargets, d.opts.Monotonic, d.links.status, d.log) // metrics.go
		if err != nil {
			return err
		}
		d.metrics = m
		m.startReverts(d.startReverts)
		m.collector.SetQueues(d.queues.stats)
		m.collector.SetFleet(d.fleet.metrics)
	}
	defer d.fleet.run(ctx)()
	defer d.src.start(ctx, d.metrics)() // rulesource.go
	var changes <-chan watch.Change
	if d.src != nil || d.opts.Config == "" {
		// With a rules source, --config is bootstrap rules only.
	} else if w, err := watch.New(d.opts.Config, watch.Options{Logger: d.log}); err != nil {
		d.log.Warn("not watching the rules file; reload with SIGHUP", "err", err)
	} else {
		defer w.Close()
		changes = w.Changes()
	}
	d.opts.Notify("READY=1")
	d.dog = newWatchdog(d.opts.Notify)
	d.log.Info("enforcing", "rules", len(start.cfg.Rules), "interfaces", ifaces, "control_period", d.loop.Period())

	links, stopLinks := d.links.watch()
	defer stopLinks()
	recheck := time.NewTicker(linkRecheck)
	defer recheck.Stop()
	prepCtx, stopPrep := context.WithCancel(ctx)
	defer stopPrep()
	go d.prep.run(prepCtx, d.prepareDoc)
	// One goroutine owns the loop: ticks and reloads never interleave, and a
	// stuck tick stops the watchdog pings.
	tick := time.NewTicker(d.loop.Period())
	defer tick.Stop()
	var stall <-chan time.Time
	if d.opts.stallAfter > 0 {
		stall = time.After(d.opts.stallAfter)
	}
	for {
		select {
		case <-ctx.Done():
			d.opts.Notify("STOPPING=1")
			d.log.Info("stopping; protection stays attached", "detach_on_exit", d.opts.DetachOnExit)
			return nil
		case <-hup:
			d.onHUP()
		case c := <-changes:
			switch {
			case !c.Exists:
				d.log.Warn("the rules file is gone; the running rules stay in force", "file", c.Path)
			case c.Err != nil:
				d.log.Error("cannot read the changed rules file; the running rules stay in force", "err", c.Err)
			default:
				d.log.Info("the rules file changed; reloading", "file", c.Path)
				d.reloadFile(FromWatch)
			}
		case r := <-d.prep.out:
			d.finish(r)
		case doc := <-d.src.updates():
			d.applySource(doc)
		case <-tick.C:
			d.afterTick(d.loop.Tick())
		case done := <-d.confirmCh:
			done <- d.confirm()
		case <-d.confirmC():
			d.revert()
		case ev := <-links:
			d.links.onEvent(ev)
		case <-recheck.C:
			d.links.check()
		case <-stall:
			d.log.Warn("test fault injection: the control loop hangs now")
			<-ctx.Done()
		}
	}
}

// newLinks is the part that attaches to ifaces and keeps them attached
// (links.go), over the daemon's attachments, writing the rules in force.
func (d *daemon) newLinks(ifaces []string, start *prepared) *links {
	sources := start.cfg.SourceTableSize
	if d.opts.SourceTableSize > 0 {
		sources = d.opts.SourceTableSize
	}
	return &links{
		log: d.log, ifaces: ifaces,
		opts: loader.Options{BPFFS: d.opts.BPFFS, Mode: d.opts.Mode, SourceTableSize: sources},
		attachments: func(f func(list *[]*loader.Attachment)) {
			d.mu.Lock()
			defer d.mu.Unlock()
			f(&d.attach)
		},
		fill: func(iface string) func(*maps.Tables) error { return d.fill(iface, d.specs) },
		back: func(iface string) {
			if err := d.apply(&prepared{specs: d.specs}); err != nil {
				d.log.Error("after attaching again: the rules in force could not be committed again (the kernel has them; queues and steering may lag)", "iface", iface, "err", err)
			}
		},
	}
}

// afterTick exports a tick's outcome, logs what went wrong, and tells
// systemd the loop is alive.
func (d *daemon) afterTick(rep control.TickReport) {
	d.metrics.tick(rep, d.loop.Period())
	d.fleet.observe(rep)
	d.logBreakers(rep)
	for _, r := range rep.Rules {
		if r.Err != nil {
			d.log.Warn("control tick", "rule", r.Name, "err", r.Err)
		}
		d.log.Debug("control tick", "rule", r.Name, "rate", r.Rate, "burst", r.Burst, "state", r.State, "latency", r.Latency, "stale", r.Stale,
			"demand", r.Demand, "in_flight_cap", r.InFlightCap)
	}
	d.queues.rates(d.ifaceNames(), rep)
	d.dog.ping(rep.Start)
}

// logBreakers logs every breaker's change of state.
func (d *daemon) logBreakers(rep control.TickReport) {
	for _, r := range rep.Rules {
		if t := r.Transition; t != nil {
			level := slog.LevelWarn
			if t.To == control.BreakerClosed {
				level = slog.LevelInfo
			}
			d.log.Log(context.Background(), level, "circuit breaker", "rule", r.Name, "from", t.From.String(), "to", t.To.String(), "reason", t.Reason)
		}
	}
}

// loopSignals hands the control loop the signal readers' view of each
// steered rule.
type loopSignals struct {
	reader   *xsignal.Reader
	outcomes *xsignal.OutcomeReader
	rules    map[string]*xsignal.Rule // of the specs in force; the loop goroutine's
}

func (s *loopSignals) rule(r *control.RuleSpec) *xsignal.Rule {
	if sr := s.rules[r.Name]; sr != nil {
		return sr
	}
	return &xsignal.Rule{Name: r.Name, SynOnly: r.SynOnly, Bytes: r.Bytes}
}

// Sample implements control.Sampler.
func (s *loopSignals) Sample(r *control.RuleSpec, used float64) control.Signals {
	return s.reader.Sample(s.rule(r), used)
}

// Outcomes implements control.OutcomeSource.
func (s *loopSignals) Outcomes(r *control.RuleSpec, admitted uint64, now time.Time) (control.Outcomes, bool) {
	return s.outcomes.Outcomes(s.rule(r), admitted, now)
}

func (d *daemon) close() error {
	var errs []error
	if d.api != nil {
		errs = append(errs, d.api.Close())
	}
	if d.metrics != nil {
		errs = append(errs, d.metrics.close())
	}
	errs = append(errs, d.queues.close(d.ifaceNames()))
	for _, a := range d.attach {
		errs = append(errs, a.Close())
		if d.opts.DetachOnExit {
			errs = append(errs, loader.Detach(d.opts.BPFFS, a.Iface))
		}
	}
	return errors.Join(errs...)
}

// ifaceNames are the interfaces the program is attached to, for the parts
// that act on each (the kernel queues, the XDP_TX warnings). The loop
// goroutine's, like d.attach.
func (d *daemon) ifaceNames() []string {
	names := make([]string, len(d.attach))
	for i, a := range d.attach {
		names[i] = a.Iface
	}
	return names
}

// withAttached runs f with the attachments and the plans in force, under
// d.mu: the parts that read the kernel from other goroutines (the
// measures, the host's addresses) see them whole.
func (d *daemon) withAttached(f func(attach []*loader.Attachment, plans map[string]*dataplane.Plan)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d.attach, d.plans)
}

// metricTargets are the metrics collector's view of the kernel: every
// attachment with a plan in force, and its host addresses.
func (d *daemon) metricTargets() []metrics.Target {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ts []metrics.Target
	for _, a := range d.attach {
		if p := d.plans[a.Iface]; p != nil {
			ts = append(ts, metrics.Target{Iface: a.Iface, Plan: p, Table: a.Tables(), HostAddrs: d.hostAddrs.metrics(a)})
		}
	}
	return ts
}
