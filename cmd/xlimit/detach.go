//go:build linux

package main

import (
	"context"
	"fmt"

	"github.com/xlimit/xlimit/loader"
)

func cmdDetach(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "detach", "--iface IF [flags]",
		"Detach xlimit from an interface and remove its pins: the only command that\n"+
			"removes protection. Works whether or not a daemon is running.")
	iface := fs.String("iface", "", "interface to detach from (required)")
	bpffs := fs.String("bpffs", loader.DefaultBPFFS, "bpffs mount point")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *iface == "" {
		return fmt.Errorf("%w: --iface is required", errUsage)
	}
	if err := loader.EnsureBPFFS(*bpffs); err != nil {
		return err
	}
	if err := loader.Detach(*bpffs, *iface); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "detached from %s\n", *iface)
	return nil
}
