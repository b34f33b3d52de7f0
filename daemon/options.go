//go:build linux

package daemon

import (
	"errors"
	"log/slog"
	"net/netip"
	"time"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/userspace/control"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
)

// Options configure a daemon. Config or RulesSource is required.
type Options struct {
	Config      string // rules file; with RulesSource, bootstrap rules only
	RulesSource string // URL of the rules in Redis (docs/fleet.md); "" for none
	Fleet       string // URL of the fleet store (docs/fleet.md); "" for none
	NodeName    string // this host in the fleet store; "": the hostname
	// RulesSourcePasswordFile holds the rules source's password; ""
	// takes $XLIMIT_RULES_SOURCE_PASSWORD, if set.
	RulesSourcePasswordFile string
	Interfaces              []string      // interfaces to protect; empty: the rules file's
	Mode                    loader.Mode   // XDP attach mode
	Share                   loader.Share  // alone or in libxdp's dispatcher (--xdp-share)
	MetricsAddr             string        // Prometheus listen address; "" for none
	APISocket               string        // local API unix socket; "" for none
	BPFFS                   string        // bpffs mount point
	StateDir                string        // the last good rules and the API's rules
	SourceTableSize         int           // per-source table size; 0: the rules file's
	Period                  time.Duration // control loop period
	FailStatic              time.Duration // how long a steered rate stays in force without a refresh
	DetachOnExit            bool          // detach when the daemon stops
	// ProbeAllow are the prefixes that adaptive rules' probes may reach
	// besides loopback and the host's own addresses (--probe-allow).
	ProbeAllow []netip.Prefix
	Logger     *slog.Logger // nil: discard

	// Dependencies; nil takes the real one.
	Clock       control.Clock      // the loop's clock
	Monotonic   func() uint64      // CLOCK_MONOTONIC, the clock of the kernel's deadlines
	Notify      func(state string) // systemd's notify socket (sd_notify)
	HostSignals func() (HostSignals, error)

	faults        faults       // fault injection of the test build (faults.go; empty otherwise: nofaults.go)
	beforePrepare func()       // tests (export_test.go): runs where a document is prepared
	revertFault   func() error // tests (export_test.go): a revert's attempt fails with its error
}

// HostSignals reads the host's signals for the control loop: per rule, and
// the host's CPU usage and pressure for system protection.
type HostSignals interface {
	xsignal.HostSampler
	CPU() (usage float64, fresh bool)
	CPUPressure() (pressure float64, available bool)
	Close() error
}

// ErrUsage marks errors in the options (the CLI's exit status 2).
var ErrUsage = errors.New("usage")

// MaxFailStatic bounds Options.FailStatic: a daemon that hangs leaves its
// last steered rates (an adaptive rule's may be its minimum) in force
// this long at most before the static rates take over again.
const MaxFailStatic = time.Minute
