//go:build linux

package daemon

import (
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/durable"
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

// guardFile, in the state directory, is the last rules file whose guard
// was taken: its guard stays when the rules file no longer parses.
const guardFile = "guard.yaml"

// readGuard reads the guard of the rules file at path at start; nil
// without one. A rules file that does not parse keeps the guard of its
// last usable version (guardFile in stateDir), said loudly: lock-out
// protection must not vanish because of a typo. Only without one do
// documents from elsewhere run as they are.
func readGuard(path, stateDir string, log *slog.Logger) *guard {
	if path == "" {
		return nil
	}
	data, err := config.ReadFile(path)
	var cfg *config.Config
	if err == nil {
		cfg, err = config.Parse(path, data)
	}
	if err == nil {
		saveGuard(stateDir, data, log)
		return guardOf(cfg)
	}
	saved := filepath.Join(stateDir, guardFile)
	if text, serr := config.ReadFile(saved); serr == nil {
		if old, perr := config.Parse(saved, text); perr == nil {
			log.Error("the rules file is unusable: KEEPING THE ALLOW LIST AND MANAGEMENT SECTION of its last usable version",
				"file", path, "err", err, "last_usable", saved)
			return guardOf(old)
		}
	}
	log.Error("the rules file is unusable and no usable version of it was seen: its allow list and management section are NOT kept over other documents", "file", path, "err", err)
	return nil
}

// saveGuard keeps text, a rules file whose guard is taken, as guardFile.
func saveGuard(stateDir string, text []byte, log *slog.Logger) {
	if stateDir == "" {
		return
	}
	err := os.MkdirAll(stateDir, 0o700)
	if err == nil {
		err = durable.WriteFile(filepath.Join(stateDir, guardFile), text, 0o600)
	}
	if err != nil {
		log.Warn("cannot keep the rules file's guard in the state directory", "err", err)
	}
}
