//go:build linux

// Package daemon is xlimit's daemon (`xlimit run`): it attaches the XDP
// program to the interfaces, applies every rules document through one path
// (the pipeline: pipeline.go), steers the kernel's rates with the control
// loop every period, and serves the local API and the Prometheus metrics.
// It is made of parts with their own state, wired here. Its dependencies
// on the process (clocks, systemd's notify socket, the host's signals) are
// Options, so that it runs in-process in tests.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
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
	opts Options
	log  *slog.Logger
	dog  watchdog
	parts

	kernel    *attached             // the attachments and the plans in force (plans.go)
	links     *links                // attaching and re-attaching to the interfaces (links.go)
	guard     atomic.Pointer[guard] // the rules file's allow and management (guard.go)
	hostAddrs hostAddrs             // the host's addresses in the kernel (hostaddrs.go)
	rules     *pipeline             // every rules document's path (pipeline.go)

	api       *api.Server
	confirmCh chan chan error // the API's confirmations, to the loop
	loopDone  chan struct{}   // closed when the loop ends
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
	d := &daemon{opts: o, log: o.Logger, kernel: newAttached(), parts: parts{loop: loop, feedback: xsignal.NewFeedback(),
		queues: kernelQueues{log: o.Logger, detach: o.DetachOnExit}}}
	d.hostAddrs = hostAddrs{log: o.Logger, attached: d.kernel.with}
	d.rules = &pipeline{opts: &d.opts, log: d.log, kernel: d.kernel, guard: &d.guard, prep: newPreparer(),
		record: &rulesRecord{}, tick: d.afterTick, parts: &d.parts}
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
	if g := readGuard(d.opts.Config, d.opts.StateDir, d.log); g != nil { // guard.go
		d.guard.Store(g)
	}
	// The startup document may be large: SIGTERM must not wait for it.
	start, err := untilDone(ctx, func() (*prepared, error) { return d.rules.startupRules(ctx) })
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
	defer func() {
		err = errors.Join(err, d.close())
	}()

	// The API socket first: a second daemon refused there must fail
	// before it touches any interface.
	d.loopDone, d.confirmCh = make(chan struct{}), make(chan chan error)
	defer close(d.loopDone)
	if d.opts.APISocket != "" {
		front := &apiFront{bpffs: d.opts.BPFFS, kernel: d.kernel, record: d.rules.record, feedback: d.feedback,
			prep: d.rules.prep, src: d.src, fleet: func() *api.FleetStatus { return d.fleet.status() },
			confirm: d.confirmCh, loopDone: d.loopDone}
		srv, err := api.Start(d.opts.APISocket, front, d.log)
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
			km := &kernelMeasures{attached: d.kernel.with}
			s.SetSources(xsignal.KernelSources{Handshakes: km, Responses: km, InFlight: km, Requests: km})
		}
		d.hostCPU = func() (float64, bool) {
			// Overload is CPU usage, or CPU pressure where asked for and
			// reported, whichever is the higher fraction of its threshold.
			load := xsignal.SystemLoad{CPU: host.CPU, Pressure: host.CPUPressure}
			if s := d.rules.specs; s != nil && s.System != nil {
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

	f, err := openFleet(d.opts.Fleet, d.opts.NodeName, d.opts.StateDir, d.loop.Period(), d.opts.Clock, d.log) // fleet.go
	if err != nil {
		return err
	}
	if f != nil {
		d.fleet = f
		d.loop.SetCap(f.host)
	}
	d.links = d.newLinks(ifaces, start)
	if err := d.links.attachAll(func(iface string) func(*maps.Tables) error { return d.rules.fill(iface, start.specs) }); err != nil {
		return err
	}
	defer d.hostAddrs.watch(ctx)() // hostaddrs.go: what the program may answer
	if err := d.rules.applyDocument(start.doc, start); err != nil {
		return err
	}

	if d.opts.MetricsAddr != "" {
		m, err := startMetrics(d.opts.MetricsAddr, d.metricTargets, d.opts.Monotonic, d.links.status, d.log) // metrics.go
		if err != nil {
			return err
		}
		d.metrics = m
		m.startReverts(d.rules.startReverts)
		m.collector.SetQueues(d.queues.stats)
		m.collector.SetFleet(d.fleet.metrics)
		if d.fleet != nil {
			m.collector.SetFleetHealth(d.fleet.health)
		}
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
	go d.rules.prep.run(prepCtx, d.rules.prepareDoc)
	// The kernel's requests in flight, corrected for the LRU's evictions
	// (reconcile.go).
	go reconcileRequests(prepCtx, d.kernel.with, d.log)
	// One goroutine owns the loop: ticks and reloads never interleave, and a
	// stuck tick stops the watchdog pings.
	tick := time.NewTicker(d.loop.Period())
	defer tick.Stop()
	stall := d.opts.faults.stall() // nil but in the test build (faults.go)
	for {
		select {
		case <-ctx.Done():
			d.opts.Notify("STOPPING=1")
			d.log.Info("stopping; protection stays attached", "detach_on_exit", d.opts.DetachOnExit)
			return nil
		case <-hup:
			d.rules.onHUP()
		case c := <-changes:
			switch {
			case !c.Exists:
				d.log.Warn("the rules file is gone; the running rules stay in force", "file", c.Path)
			case c.Err != nil:
				d.log.Error("cannot read the changed rules file; the running rules stay in force", "err", c.Err)
			default:
				d.log.Info("the rules file changed; reloading", "file", c.Path)
				d.rules.reloadFile(FromWatch)
			}
		case r := <-d.rules.prep.out:
			d.rules.finish(r)
		case doc := <-d.src.updates():
			d.rules.applySource(doc)
		case <-tick.C:
			d.afterTick(d.loop.Tick())
		case done := <-d.confirmCh:
			done <- d.rules.confirm()
		case <-d.rules.confirmC():
			d.rules.revert()
		case ev := <-links:
			d.links.onEvent(ev)
		case <-recheck.C:
			d.links.check()
		case <-stall:
			d.opts.faults.hang(ctx, d.log)
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
		opts:        loader.Options{BPFFS: d.opts.BPFFS, Mode: d.opts.Mode, Share: d.opts.Share, SourceTableSize: sources},
		attachments: d.kernel.edit,
		fill:        func(iface string) func(*maps.Tables) error { return d.rules.fill(iface, d.rules.specs) },
		back: func(iface string) {
			if err := d.rules.apply(&prepared{specs: d.rules.specs}); err != nil {
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
	d.queues.rates(d.kernel.names(), rep)
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

func (d *daemon) close() error {
	var errs []error
	if d.api != nil {
		errs = append(errs, d.api.Close())
	}
	if d.metrics != nil {
		errs = append(errs, d.metrics.close())
	}
	errs = append(errs, d.queues.close(d.kernel.names()))
	for _, a := range d.kernel.all() {
		errs = append(errs, a.Close())
		if d.opts.DetachOnExit {
			errs = append(errs, loader.Detach(d.opts.BPFFS, a.Iface))
		}
	}
	return errors.Join(errs...)
}

// metricTargets are the metrics collector's view of the kernel: every
// attachment with a plan in force, and its host addresses.
func (d *daemon) metricTargets() []metrics.Target {
	var ts []metrics.Target
	d.kernel.with(func(attach []*loader.Attachment, plans map[string]*dataplane.Plan) {
		for _, a := range attach {
			if p := plans[a.Iface]; p != nil {
				tx := a.Preflight.XDPTx
				ts = append(ts, metrics.Target{Iface: a.Iface, Plan: p, Table: a.Tables(), HostAddrs: d.hostAddrs.metrics(a), XDPTx: &tx})
			}
		}
	})
	return ts
}
