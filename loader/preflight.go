//go:build linux

package loader

import (
	"fmt"

	"github.com/xlimit/xlimit/loader/preflight"
)

// Preflight is what XDP may do on iface attached in mode (loader/preflight):
// read from the host, then decided. Generic mode sends XDP_TX frames
// through the stack's own transmit path (generic_xdp_tx), not the driver's
// XDP transmit, so the driver's XDP_TX rules do not apply to it. Facts
// that cannot be read leave XDP_TX avoided, with the error.
func Preflight(iface string, mode Mode) (preflight.Decision, error) {
	f, err := preflight.Host.Read(iface)
	if err != nil {
		return preflight.Decision{Findings: []preflight.Finding{{Rule: "facts", Level: preflight.Avoid,
			What: fmt.Sprintf("the driver's facts cannot be read (%v): XDP_TX is not used (SYN cookies are the kernel's, refusals are dropped without a reset)", err)}}}, err
	}
	d := preflight.Decide(f)
	if mode == ModeGeneric && !d.XDPTx {
		d.XDPTx = true
		d.Findings = append(d.Findings, preflight.Finding{Rule: "generic-mode", Level: preflight.Info,
			What: "generic mode: XDP_TX frames leave through the stack's transmit path, not the driver's, so XDP_TX is used"})
	}
	return d, nil
}
