// Command xlimit protects a Linux host's ports at the NIC: an XDP program
// admits or drops every incoming packet against token buckets that this
// daemon configures from a YAML rules file.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"github.com/xlimit/xlimit/daemon"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

// errUsage marks errors in how a command was called (exit status 2); the
// daemon's option errors are such errors.
var errUsage = daemon.ErrUsage

// command is one subcommand.
type command struct {
	name, summary string
	run           func(ctx context.Context, env *env, args []string) error
}

// env is what commands get from the process, so tests can run them
// in-process with their own streams.
type env struct {
	stdout, stderr io.Writer
}

func commands() []command {
	return []command{
		{"run", "attach to interfaces and enforce a rules file (the daemon)", cmdRun},
		{"check", "validate a rules file without touching the kernel", cmdCheck},
		{"apply", "check a rules file and send it to the running daemon (--confirm: reverted unless confirmed)", cmdApply},
		{"confirm", "confirm the rules applied with 'xlimit apply --confirm'", cmdConfirm},
		{"rules", "push a rules file to Redis for the fleet, or show the one there", cmdRules},
		{"status", "show rules, rates in force and counters from the pins", cmdStatus},
		{"top", "live per-rule pass, drop and would-drop rates from the pins", cmdTop},
		{"detach", "remove xlimit from an interface (the only way protection goes away)", cmdDetach},
		{"demo", "self-contained demo: namespaces, a service, a flood, live figures (not in release builds)", cmdDemo},
		{"version", "print the version", cmdVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := mainWithArgs(ctx, &env{stdout: os.Stdout, stderr: os.Stderr}, os.Args[1:])
	stop()
	os.Exit(code)
}

func mainWithArgs(ctx context.Context, e *env, args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(e.stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, e, args[1:])
		switch {
		case err == nil, errors.Is(err, pflag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			fmt.Fprintf(e.stderr, "xlimit %s: %v\n", c.name, err)
			return 2
		default:
			fmt.Fprintf(e.stderr, "xlimit %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(e.stderr, "xlimit: unknown command %q\n\n", args[0])
	usage(e.stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "xlimit: eBPF/XDP rate limiting for a host's ports.\n\nUsage: xlimit COMMAND [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'xlimit COMMAND --help' for a command's flags.")
}

// newFlags returns a flag set for a subcommand whose errors are usage
// errors and whose --help prints the summary and flags.
func newFlags(e *env, name, args, summary string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stdout, "Usage: xlimit %s %s\n\n%s\n\nFlags:\n%s  -h, --help   show this help\n", name, args, summary, fs.FlagUsages())
	}
	return fs
}

// parseFlags parses args and wraps parse errors as usage errors.
func parseFlags(fs *pflag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err // pflag has printed the usage
		}
		return fmt.Errorf("%w: %v (see --help)", errUsage, err)
	}
	return nil
}

func cmdVersion(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "version", "", "Print the version.")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "xlimit %s\n", version)
	return nil
}
