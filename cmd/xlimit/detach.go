//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/xlimit/xlimit/daemon"
	"github.com/xlimit/xlimit/loader"
)

func cmdDetach(_ context.Context, e *env, args []string) error {
	fs := newFlags(e, "detach", "--iface IF [flags]",
		"Detach xlimit from an interface and remove its pins and kernel queues (IFB\n"+
			"devices, TC filters): the only command that\n"+
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
	// The queues go whether or not a program was attached.
	if err := errors.Join(loader.Detach(*bpffs, *iface), daemon.RemoveQueues(*iface)); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "detached from %s\n", *iface)
	return nil
}
