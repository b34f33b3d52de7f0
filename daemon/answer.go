package daemon

import (
	"context"
	"errors"
	"log/slog"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/loader/preflight"
	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// warnXDPTx warns, for every attached interface that is a veth whose peer
// runs no XDP program, that the rules of s which answer from XDP
// (syn_cookies, refuse: reset) will not be heard (loader.CheckXDPTxPeer),
// and says for every interface where the driver's preflight avoided XDP_TX
// (loader.Preflight: a driver path known to crash) what those rules do
// instead: their SYN cookies are the kernel's, their resets are not sent.
func warnXDPTx(log *slog.Logger, atts []*loader.Attachment, spec *dataplane.Spec) {
	names := dataplane.XDPTxRules(spec)
	if len(names) == 0 {
		return
	}
	for _, a := range atts {
		if err := loader.CheckXDPTxPeer(a.Iface); errors.Is(err, loader.ErrVethPeerNoXDP) {
			log.Warn("answers from XDP will not arrive: "+err.Error(), "iface", a.Iface, "rules", names)
		} else if err != nil {
			log.Debug("cannot tell whether answers from XDP arrive", "iface", a.Iface, "err", err)
		}
		if a.Preflight.XDPTx {
			continue
		}
		for _, f := range a.Preflight.Findings {
			if f.Level == preflight.Avoid {
				log.Warn("no answers from XDP on this interface: SYN cookies are the kernel's, refused SYNs are dropped without a reset",
					"iface", a.Iface, "rules", names, "preflight", f.What, "to_change", f.Fix)
			}
		}
	}
}

// logPreflight logs what the driver's preflight decided for a, once at
// attach.
func logPreflight(log *slog.Logger, a *loader.Attachment) {
	if a.PreflightErr != nil {
		log.Warn("driver preflight: facts not read", "iface", a.Iface, "err", a.PreflightErr)
	}
	for _, f := range a.Preflight.Findings {
		lvl := slog.LevelInfo
		if f.Level != preflight.Info {
			lvl = slog.LevelWarn
		}
		log.Log(context.Background(), lvl, "driver preflight: "+f.What, "iface", a.Iface, "rule", f.Rule, "level", f.Level.String(), "to_change", f.Fix)
	}
	log.Info("driver preflight", "iface", a.Iface, "xdp_tx", a.Preflight.XDPTx, "native", a.Preflight.Native)
}

// preflightStatus is a's preflight for the API's status.
func preflightStatus(a *loader.Attachment) *api.PreflightStatus {
	st := &api.PreflightStatus{XDPTx: a.Preflight.XDPTx, Native: a.Preflight.Native, Findings: []string{}}
	for _, f := range a.Preflight.Findings {
		st.Findings = append(st.Findings, f.String())
	}
	return st
}
