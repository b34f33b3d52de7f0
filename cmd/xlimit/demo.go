//go:build linux

package main

import (
	"context"
	"fmt"
	"time"
)

// demoOptions configure runDemo.
type demoOptions struct {
	Duration time.Duration // how long to flood
	Rate     int           // the UDP service's limit, packets/s
	Offered  float64       // packets/s the flood offers; 0: as fast as the generator goes
	IPv6     bool          // flood over IPv6
}

// cmdDemo is `xlimit demo`. Its flags are the same in every build, so that
// --help (and docs/design.md §10) do not depend on the build; what runs is
// runDemo: the demo itself with the tag xlimit_demo (demo_kit.go), a
// refusal in the release builds (demo_release.go).
func cmdDemo(ctx context.Context, e *env, args []string) error {
	fs := newFlags(e, "demo", "[flags]",
		"Build two network namespaces joined by a veth pair, start a UDP service and a TCP\n"+
			"service in one, attach xlimit to its veth, flood the UDP service from the other\n"+
			"while a client keeps using the TCP service, print live figures, then remove\n"+
			"everything it created. Needs root; touches nothing it did not create.\n"+
			"Only in builds with the tag xlimit_demo ('make build'): the release binary\n"+
			"(the .deb, the image) carries no test kit and refuses.")
	dur := fs.Duration("duration", 8*time.Second, "how long to flood")
	rate := fs.Int("rate", 1000, "the UDP service's limit, packets/s")
	offered := fs.Float64("flood", 0, "packets/s the flood offers (0: as fast as the generator goes)")
	ipv6 := fs.Bool("ipv6", false, "flood over IPv6 instead of IPv4")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *rate <= 0 || *dur <= 0 {
		return fmt.Errorf("%w: --rate and --duration must be positive", errUsage)
	}
	return runDemo(ctx, e.stdout, demoOptions{Duration: *dur, Rate: *rate, Offered: *offered, IPv6: *ipv6})
}
