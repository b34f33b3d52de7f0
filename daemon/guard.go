//go:build linux

package daemon

import (
	"log/slog"
	"net/netip"
	"slices"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// guard is what the local rules file (--config) keeps in force whatever
// document runs, from the API, the rules source or the state directory:
// its allow list and its management section (docs/operations.md). A
// document may add to them; it cannot take anything away. It is read at
// start and each time the rules file is applied.
type guard struct {
	allow []netip.Prefix
	mgmt  *config.Management
}

func guardOf(cfg *config.Config) *guard {
	return &guard{allow: slices.Clone(cfg.Allow), mgmt: cfg.Management}
}

// guardSpec adds allow and m to a data plane spec: m's sources are
// allowed, its ports exempt. The spec's slices are replaced, never
// written through.
func guardSpec(dp *dataplane.Spec, allow []netip.Prefix, m *config.Management) {
	add := slices.Clone(allow)
	if m != nil {
		add = append(add, m.Sources...)
		dp.ExemptTCP = slices.Concat(dp.ExemptTCP, m.TCPPorts)
		dp.ExemptUDP = slices.Concat(dp.ExemptUDP, m.UDPPorts)
	}
	for _, pfx := range add {
		if !slices.Contains(dp.Allow, pfx) {
			dp.Allow = append(slices.Clip(dp.Allow), pfx)
		}
	}
}

// readGuard reads the guard of the rules file at path at start; nil
// without one. A rules file that does not parse keeps none, said loudly:
// documents from elsewhere then run as they are.
func readGuard(path string, log *slog.Logger) *guard {
	if path == "" {
		return nil
	}
	data, err := config.ReadFile(path)
	var cfg *config.Config
	if err == nil {
		cfg, err = config.Parse(path, data)
	}
	if err != nil {
		log.Error("the rules file is unusable: its allow list and management section are NOT kept over other documents", "file", path, "err", err)
		return nil
	}
	return guardOf(cfg)
}
