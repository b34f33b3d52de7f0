package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/xlimit/xlimit/daemon"
	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/loader/preflight"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/fleet"
	"github.com/xlimit/xlimit/userspace/lockout"
	"github.com/xlimit/xlimit/userspace/rulesource"
)

func cmdCheck(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "check", "[--iface IF]... [FILE]",
		"Validate a rules file without touching the kernel. Prints every problem as\n"+
			"FILE:LINE: field: problem and exits 1 when there is any. With --iface (or the\n"+
			"file's interfaces), prints the driver's preflight: what XDP would do there\n"+
			"(native mode, XDP_TX) and what to change (docs/kernels.md).")
	ifaces := fs.StringArray("iface", nil, "interface whose driver preflight to print (repeatable)")
	xdpMode := fs.String("xdp-mode", "auto", "the attach mode run would use: auto, native or generic")
	source := fs.String("rules-source", "", "also check the --rules-source URL the daemons follow: warn when Redis is open to the network")
	passwordFile := fs.String("rules-source-password-file", "", "the rules source's password file (default: $"+rulesource.PasswordEnv+")")
	fleetURL := fs.String("fleet", "", "also check the --fleet URL: warn when Redis is open to the network")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := checkStores(e, *source, *passwordFile, *fleetURL); err != nil {
		return err
	}
	if fs.NArg() == 0 && len(*ifaces) > 0 {
		return printPreflights(e, *ifaces, loader.Mode(*xdpMode), nil)
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: want exactly one FILE", errUsage)
	}
	file := fs.Arg(0)
	// A large document takes its time: SIGINT and SIGTERM stop it at once.
	type result struct {
		cfg   *config.Config
		specs *daemon.Specs
		err   error
	}
	ch := make(chan result, 1)
	go func() {
		cfg, err := config.Load(file)
		if err != nil {
			ch <- result{err: err}
			return
		}
		// The compiler is the last judge: what it refuses, run would refuse.
		specs := daemon.Translate(cfg)
		plan, err := dataplane.Compile(specs.Dataplane, nil)
		if err != nil {
			ch <- result{cfg: cfg, err: fmt.Errorf("%s: %w", file, err)}
			return
		}
		// syn_cookies needs a kernel feature: check this kernel's.
		if plan.HasCookies() {
			if err := loader.CookieSupport(); err != nil {
				ch <- result{cfg: cfg, err: fmt.Errorf("%s: %w", file, err)}
				return
			}
		}
		ch <- result{cfg: cfg, specs: specs}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		return fmt.Errorf("%s: interrupted: %w", file, context.Cause(ctx))
	}
	cfg, specs, err := r.cfg, r.specs, r.err
	if err != nil && cfg == nil {
		if errs := config.Errors(err); len(errs) > 0 {
			for _, fe := range errs {
				fmt.Fprintln(e.stderr, fe.Error())
			}
			return fmt.Errorf("%s: %d problem(s)", file, len(errs))
		}
		return err
	}
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintf(e.stderr, "warning: %s\n", w.Error())
	}
	for _, w := range specs.NotEnforced {
		fmt.Fprintf(e.stderr, "warning: not enforced by this version: %s\n", w)
	}
	// What would cut the operator off on this host (its listening sshd).
	if ls, err := lockout.TCPListeners("/proc"); err == nil {
		if plan, err := dataplane.Compile(specs.Dataplane, nil); err == nil {
			for _, w := range lockout.Warnings(plan, specs.Dataplane, ls) {
				fmt.Fprintf(e.stderr, "warning: %s\n", w)
			}
		}
	}
	// Answers from XDP on a veth reach its peer only if it runs XDP.
	if names := dataplane.XDPTxRules(specs.Dataplane); len(names) > 0 {
		for _, iface := range cfg.Interfaces {
			if err := loader.CheckXDPTxPeer(iface); errors.Is(err, loader.ErrVethPeerNoXDP) {
				fmt.Fprintf(e.stderr, "warning: %s: interfaces: %v (rules %s)\n", file, err, strings.Join(names, ", "))
			}
		}
	}
	fmt.Fprintf(e.stdout, "%s: ok (%d rules)\n", file, len(cfg.Rules))
	return printPreflights(e, append(slices.Clone(*ifaces), cfg.Interfaces...), loader.Mode(*xdpMode), dataplane.XDPTxRules(specs.Dataplane))
}

// printPreflights prints the driver's preflight of each interface (once
// each): the decision, the facts it came from and every finding; where
// XDP_TX is avoided, what the rules that answer from XDP (answering) do
// instead.
func printPreflights(e *env, ifaces []string, mode loader.Mode, answering []string) error {
	seen := map[string]bool{}
	for _, iface := range ifaces {
		if seen[iface] {
			continue
		}
		seen[iface] = true
		f, _ := preflight.Host.Read(iface)
		d, err := loader.Preflight(iface, mode)
		fmt.Fprintf(e.stdout, "%s: preflight: %s (driver %q, kernel %s, %d possible CPUs", iface, d.Summary(), f.Driver, f.Kernel, f.PossibleCPUs)
		if f.HasChannels {
			fmt.Fprintf(e.stdout, ", channels combined %d of %d, rx %d tx %d", f.Combined, f.MaxCombined, f.RxCount, f.TxCount)
		}
		fmt.Fprintf(e.stdout, ", real queues rx %d tx %d, mtu %d)\n", f.RxQueues, f.TxQueues, f.MTU)
		if err != nil {
			fmt.Fprintf(e.stderr, "warning: %s: preflight: %v\n", iface, err)
		}
		for _, fi := range d.Findings {
			fmt.Fprintf(e.stdout, "  %s\n", fi)
		}
		if !d.XDPTx && len(answering) > 0 {
			fmt.Fprintf(e.stderr, "warning: %s: XDP_TX avoided: rules %s answer nothing from XDP here: their SYN cookies are the kernel's own (net.ipv4.tcp_syncookies), their refused SYNs are dropped without a reset\n", iface, strings.Join(answering, ", "))
		}
	}
	return nil
}

// checkStores checks the URLs of the rules source and the fleet store, if
// given, and warns about a Redis open to the network (docs/fleet.md,
// "Trust").
func checkStores(e *env, source, passwordFile, fleetURL string) error {
	if source != "" {
		o, err := rulesource.ParseURL(source)
		if err != nil {
			return fmt.Errorf("%w: --rules-source: %v", errUsage, err)
		}
		if err := o.SetPassword(passwordFile); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		for _, w := range rulesource.TrustWarnings(o.Redis, "--rules-source") {
			fmt.Fprintf(e.stderr, "warning: %s\n", w)
		}
	}
	if fleetURL != "" {
		o, err := fleet.ParseURL(fleetURL)
		if err != nil {
			return fmt.Errorf("%w: --fleet: %v", errUsage, err)
		}
		for _, w := range rulesource.TrustWarnings(o.Redis, "--fleet") {
			fmt.Fprintf(e.stderr, "warning: %s\n", w)
		}
	}
	return nil
}
