//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/spf13/pflag"

	"github.com/xlimit/xlimit/daemon"
	"github.com/xlimit/xlimit/loader"
)

// runFlagHooks add flags of test builds (faults.go) to `run`.
var runFlagHooks []func(fs *pflag.FlagSet, o *daemon.Options) (apply func())

func cmdRun(ctx context.Context, e *env, args []string) error {
	var (
		o                 daemon.Options
		xdpMode, logLevel string
		xdpShare          string
		probeAllow        []net.IPNet
	)
	fs := newFlags(e, "run", "(--config FILE | --rules-source URL [--config FILE]) [flags]",
		"Attach xlimit to the interfaces and enforce the rules file. SIGHUP reloads the file\n"+
			"atomically: a file that fails validation is logged and the running rules stay.\n"+
			"Stopping the daemon leaves the program attached and enforcing (see 'xlimit detach').")
	fs.StringVar(&o.Config, "config", "", "rules file (YAML)")
	fs.StringArrayVar(&o.Interfaces, "iface", nil, "interface to protect (repeatable; overrides 'interfaces' in the file)")
	fs.StringVar(&xdpMode, "xdp-mode", "auto", "attach mode: auto (native, else generic), native or generic")
	fs.StringVar(&xdpShare, "xdp-share", "auto", "share the interface with other XDP programs through libxdp's dispatcher (xdp-loader's):\nauto (join the dispatcher if one is attached, else attach alone), always (attach through one, so that\nxdp-loader can add programs later) or never (attach alone). Joining needs CAP_SYS_ADMIN (docs/operations.md)")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", "127.0.0.1:9542", "Prometheus metrics listen address (empty: off)")
	fs.StringVar(&o.APISocket, "api-socket", "/run/xlimit/api.sock", "local API unix socket, mode 0600 (empty: off)")
	fs.StringVar(&o.BPFFS, "bpffs", loader.DefaultBPFFS, "bpffs mount point (mounted if missing)")
	fs.StringVar(&o.StateDir, "state-dir", "/var/lib/xlimit", "directory for the last good rules file")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&o.Period, "control-period", 50*time.Millisecond, "control loop period (10ms to 500ms)")
	fs.DurationVar(&o.FailStatic, "fail-static-after", time.Second, "how long a rate from the control loop stays in force without a refresh; then the static rate applies (at most 1m)")
	fs.IntVar(&o.SourceTableSize, "source-table-size", 0, "per-source table size in sources (overrides source_table_size in the file)")
	fs.StringVar(&o.RulesSource, "rules-source", "", "follow the rules in Redis: redis://HOST:PORT/DB or unix:///PATH?key=xlimit:rules&channel=xlimit:rules&resync=30s;\n--config is then optional bootstrap rules (see docs/fleet.md)")
	fs.StringVar(&o.RulesSourcePasswordFile, "rules-source-password-file", "", "file holding the rules source's password (default: $XLIMIT_RULES_SOURCE_PASSWORD; never in the URL)")
	fs.IPNetSliceVar(&probeAllow, "probe-allow", nil, "prefix that adaptive rules' probes may reach besides loopback and this host's addresses (repeatable)")
	fs.BoolVar(&o.DetachOnExit, "detach-on-exit", false, "detach from the interfaces when the daemon stops (default: protection outlives the daemon)")
	var hooks []func()
	for _, h := range runFlagHooks {
		hooks = append(hooks, h(fs, &o))
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	for _, apply := range hooks {
		apply()
	}
	if o.Config == "" && o.RulesSource == "" {
		return fmt.Errorf("%w: --config or --rules-source is required", errUsage)
	}
	mode, err := loader.ParseMode(xdpMode)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	o.Mode = mode
	if o.Share, err = loader.ParseShare(xdpShare); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	for _, n := range probeAllow {
		ip, _ := netip.AddrFromSlice(n.IP)
		bits, _ := n.Mask.Size()
		o.ProbeAllow = append(o.ProbeAllow, netip.PrefixFrom(ip.Unmap(), bits).Masked())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("%w: --log-level: %v", errUsage, err)
	}
	o.Logger = slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))
	return daemon.Run(ctx, o)
}
