//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/xlimit/xlimit/userspace/demo"
)

func cmdDemo(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "demo", "[flags]",
		"Build two network namespaces joined by a veth pair, start a UDP service and a TCP\n"+
			"service in one, attach xlimit to its veth, flood the UDP service from the other\n"+
			"while a client keeps using the TCP service, print live figures, then remove\n"+
			"everything it created. Needs root; touches nothing it did not create.")
	dur := fs.Duration("duration", 8*time.Second, "how long to flood")
	rate := fs.Int("rate", 1000, "the UDP service's limit, packets/s")
	offered := fs.Float64("flood", 0, "packets/s the flood offers (0: as fast as the generator goes)")
	ipv6 := fs.Bool("ipv6", false, "flood over IPv6 instead of IPv4")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("demo needs root: it creates network namespaces and attaches XDP")
	}
	if *rate <= 0 || *dur <= 0 {
		return fmt.Errorf("%w: --rate and --duration must be positive", errUsage)
	}
	return demo.Run(ctx, e.stdout, demo.Options{Duration: *dur, Rate: *rate, Offered: *offered, IPv6: *ipv6})
}
