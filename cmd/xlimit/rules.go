package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/xlimit/xlimit/userspace/rulesource"
)

// cmdRules is `xlimit rules push|show`: the fleet's rules in Redis.
func cmdRules(ctx context.Context, e *env, args []string) error {
	const summary = "Manage the rules that daemons started with --rules-source follow.\n\n" +
		"  push --redis URL FILE   validate FILE like 'xlimit check', then store it and announce it\n" +
		"                          (SET + INCR of KEY:version + PUBLISH, in one atomic script)\n" +
		"  show --redis URL        print the version and the document stored at the key\n\n" +
		"URL is the daemons' --rules-source URL, e.g. redis://10.0.0.5:6379/0?key=xlimit:rules"
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fs := newFlags(e, "rules", "push|show [flags]", summary)
		err := parseFlags(fs, args)
		if len(args) == 0 && err == nil {
			fs.Usage()
			return fmt.Errorf("%w: want a subcommand: push or show", errUsage)
		}
		return err
	}
	switch args[0] {
	case "push":
		return cmdRulesPush(ctx, e, args[1:])
	case "show":
		return cmdRulesShow(ctx, e, args[1:])
	}
	return fmt.Errorf("%w: unknown subcommand %q: want push or show", errUsage, args[0])
}

// rulesStore parses --redis and opens the store.
func rulesStore(url, passwordFile string) (*rulesource.Redis, rulesource.Options, error) {
	if url == "" {
		return nil, rulesource.Options{}, fmt.Errorf("%w: --redis URL is required", errUsage)
	}
	o, err := rulesource.ParseURL(url)
	if err != nil {
		return nil, o, fmt.Errorf("%w: --redis: %v", errUsage, err)
	}
	if err := o.SetPassword(passwordFile); err != nil {
		return nil, o, fmt.Errorf("%w: %v", errUsage, err)
	}
	rulesource.SetClientLogger(slog.New(slog.DiscardHandler))
	return rulesource.Open(o), o, nil
}

func cmdRulesPush(ctx context.Context, e *env, args []string) error {
	var url, passwordFile string
	var timeout time.Duration
	fs := newFlags(e, "rules push", "--redis URL FILE",
		"Validate FILE exactly like 'xlimit check' (exit 1 with FILE:LINE: field: problem) and, if it\n"+
			"is valid, store it at the key, increment KEY:version and publish the new version on the\n"+
			"channel, atomically. Daemons following the key apply it within moments; one that missed\n"+
			"the message finds it at its next resync.")
	fs.StringVar(&url, "redis", "", "rules source URL (as the daemons' --rules-source)")
	fs.StringVar(&passwordFile, "password-file", "", "file holding Redis's password (default: $XLIMIT_RULES_SOURCE_PASSWORD; never in the URL)")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "give up on Redis after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("%w: want exactly one FILE", errUsage)
	}
	store, o, err := rulesStore(url, passwordFile)
	if err != nil {
		return err
	}
	defer store.Close()
	file := fs.Arg(0)
	text, err := checkedText(ctx, e, file, "pushed")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	version, receivers, err := store.Push(ctx, text)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "pushed %s to %s key %s: version %d, announced to %d subscriber(s) on %s\n",
		file, o, o.Key, version, receivers, o.Channel)
	return nil
}

func cmdRulesShow(ctx context.Context, e *env, args []string) error {
	var url, passwordFile string
	var timeout time.Duration
	fs := newFlags(e, "rules show", "--redis URL",
		"Print the version (on stderr) and the rules document (on stdout) stored at the key.")
	fs.StringVar(&url, "redis", "", "rules source URL (as the daemons' --rules-source)")
	fs.StringVar(&passwordFile, "password-file", "", "file holding Redis's password (default: $XLIMIT_RULES_SOURCE_PASSWORD; never in the URL)")
	fs.DurationVar(&timeout, "timeout", 10*time.Second, "give up on Redis after this long")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	store, o, err := rulesStore(url, passwordFile)
	if err != nil {
		return err
	}
	defer store.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	doc, ok, err := store.Read(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s: no rules at key %s", o, o.Key)
	}
	fmt.Fprintf(e.stderr, "# %s key %s version %d sha256 %s\n", o, o.Key, doc.Version, doc.SHA256)
	_, err = e.stdout.Write(doc.Text)
	return err
}
