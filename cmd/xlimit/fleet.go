//go:build linux

package main

import (
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/xlimit/xlimit/daemon"
	"github.com/xlimit/xlimit/userspace/api"
)

func init() {
	runFlagHooks = append(runFlagHooks, func(fs *pflag.FlagSet, o *daemon.Options) func() {
		fs.StringVar(&o.Fleet, "fleet", "", "share the budgets of rules with a fleet section through Redis: the URL forms of --rules-source\n(redis://, rediss://, unix://) with ?interval=200ms&prefix=xlimit:fleet (see docs/fleet.md)")
		fs.StringVar(&o.NodeName, "node-name", "", "this host's name in the fleet store (default: the hostname)")
		return func() {}
	})
}

// printFleet prints the fleet part of a status report.
func printFleet(w io.Writer, f *api.FleetStatus) {
	if f == nil {
		return
	}
	up := "up"
	if !f.Up {
		up = "DOWN"
	}
	fmt.Fprintf(w, "fleet: node %s, store %s (%s)\n", f.Node, f.Store, up)
	if f.MemberConflicts > 0 {
		fmt.Fprintf(w, "  ANOTHER DAEMON REPORTS AS THIS MEMBER (%d checks): give each host its own --node-name and state directory\n", f.MemberConflicts)
	}
	for _, r := range f.Rules {
		fmt.Fprintf(w, "  %-20s key %-16s share %9.1f/s  demand %9.1f/s  %-13s lease age %5.2fs  hosts %d\n",
			r.Rule, r.Key, r.Share, r.Demand, r.State, r.LeaseAgeSeconds, r.Hosts)
	}
	if f.BudgetMismatches > 0 {
		fmt.Fprintf(w, "  BUDGET MISMATCH: the hosts of a fleet key carry other budgets (%d allocations)\n", f.BudgetMismatches)
	}
}
