package main

import (
	"context"
	"fmt"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
)

func cmdApply(ctx context.Context, e *env, args []string) error {
	var (
		within time.Duration
		socket string
	)
	fs := newFlags(e, "apply", "[--confirm DURATION] FILE",
		"Validate FILE exactly like 'xlimit check' and send it to the running daemon through its\n"+
			"API socket. With --confirm, the daemon goes back to the rules in force now unless\n"+
			"'xlimit confirm' comes within DURATION (5s to 1h), as a router's \"commit confirmed\":\n"+
			"rules that cut you off undo themselves. Unconfirmed rules are not kept for a restart.")
	fs.DurationVar(&within, "confirm", 0, "revert unless 'xlimit confirm' comes within this long (0: apply for good)")
	fs.StringVar(&socket, "api-socket", "/run/xlimit/api.sock", "the daemon's API socket")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: want exactly one FILE", errUsage)
	}
	if within != 0 && (within < api.MinConfirm || within > api.MaxConfirm) {
		return fmt.Errorf("%w: --confirm %v: want %v to %v", errUsage, within, api.MinConfirm, api.MaxConfirm)
	}
	file := fs.Arg(0)
	text, err := checkedText(ctx, e, file, "applied")
	if err != nil {
		return err
	}
	c := api.NewClient(socket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if within == 0 {
		res, err := c.PutRules(ctx, text, "")
		if err != nil {
			return fmt.Errorf("not applied: %w", err)
		}
		fmt.Fprintf(e.stdout, "applied %s: %d rules, sha256 %s\n", file, len(res.Rules), res.SHA256[:12])
		return nil
	}
	res, err := c.PutRulesConfirm(ctx, text, within)
	if err != nil {
		return fmt.Errorf("not applied: %w", err)
	}
	fmt.Fprintf(e.stdout, "applied %s: %d rules, sha256 %s; the previous rules return at %s unless 'xlimit confirm' comes first\n",
		file, len(res.Rules), res.SHA256[:12], res.RevertAt.Local().Format(time.TimeOnly))
	return nil
}

func cmdConfirm(ctx context.Context, e *env, args []string) error {
	var socket string
	fs := newFlags(e, "confirm", "", "Confirm the rules applied with 'xlimit apply --confirm': they stay, and are kept for a restart.")
	fs.StringVar(&socket, "api-socket", "/run/xlimit/api.sock", "the daemon's API socket")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	c := api.NewClient(socket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Confirm(ctx); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "confirmed: the rules in force stay")
	return nil
}
