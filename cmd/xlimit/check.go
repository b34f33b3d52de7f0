package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/xlimit/xlimit/daemon"
	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/fleet"
	"github.com/xlimit/xlimit/userspace/lockout"
	"github.com/xlimit/xlimit/userspace/rulesource"
)

func cmdCheck(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "check", "FILE",
		"Validate a rules file without touching the kernel. Prints every problem as\n"+
			"FILE:LINE: field: problem and exits 1 when there is any.")
	source := fs.String("rules-source", "", "also check the --rules-source URL the daemons follow: warn when Redis is open to the network")
	passwordFile := fs.String("rules-source-password-file", "", "the rules source's password file (default: $"+rulesource.PasswordEnv+")")
	fleetURL := fs.String("fleet", "", "also check the --fleet URL: warn when Redis is open to the network")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: want exactly one FILE", errUsage)
	}
	if err := checkStores(e, *source, *passwordFile, *fleetURL); err != nil {
		return err
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
			if err := loader.CheckXDPTxQueues(iface); errors.Is(err, loader.ErrVirtioSharedXDPTx) {
				fmt.Fprintf(e.stderr, "warning: %s: interfaces: %v (rules %s)\n", file, err, strings.Join(names, ", "))
			}
		}
	}
	fmt.Fprintf(e.stdout, "%s: ok (%d rules)\n", file, len(cfg.Rules))
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
