package signal

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/xlimit/xlimit/userspace/config"
)

// MinProbeInterval is the shortest interval between two probes of a rule
// (config.MinProbeInterval): a probe is a connection to a service that
// must not itself become load on it.
const MinProbeInterval = config.MinProbeInterval

// ProbePolicy is where probes may go. A rules document may come from the
// API or a fleet's rules source; its probes must not make every host
// connect to a third party. A probe's target is allowed when it is
// loopback, one of the host's own addresses, or in Allow (the operator's
// --probe-allow on the host's command line, never from a document).
type ProbePolicy struct {
	Allow []netip.Prefix
	// HostAddrs returns the host's own addresses (nil: the addresses of
	// every interface of the daemon's network namespace).
	HostAddrs func() ([]netip.Addr, error)
}

// Check reports the first probe whose target or interval is not allowed.
func (pp ProbePolicy) Check(want map[string]config.Probe) error {
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	slices.Sort(names)
	var own []netip.Addr
	for _, name := range names {
		spec := want[name]
		if spec.Interval < MinProbeInterval {
			return fmt.Errorf("probe for rule %s: interval %v is shorter than the minimum of %v", name, spec.Interval, MinProbeInterval)
		}
		host, _, err := net.SplitHostPort(spec.Address)
		if err != nil {
			return fmt.Errorf("probe for rule %s: %w", name, err)
		}
		if strings.EqualFold(host, "localhost") {
			continue
		}
		addr, err := netip.ParseAddr(host)
		if err != nil {
			return fmt.Errorf("probe for rule %s: host %q: %w", name, host, err)
		}
		addr = addr.Unmap()
		if addr.IsLoopback() || slices.ContainsFunc(pp.Allow, func(p netip.Prefix) bool { return p.Contains(addr) }) {
			continue
		}
		if own == nil {
			if own, err = pp.hostAddrs(); err != nil {
				return fmt.Errorf("probe for rule %s: read the host's addresses: %w", name, err)
			}
		}
		if !slices.Contains(own, addr) {
			return fmt.Errorf("probe for rule %s: target %s is not loopback, not an address of this host, and not in --probe-allow: probes go only to the protected host's own services", name, addr)
		}
	}
	return nil
}

func (pp ProbePolicy) hostAddrs() ([]netip.Addr, error) {
	if pp.HostAddrs != nil {
		return pp.HostAddrs()
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := []netip.Addr{}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
