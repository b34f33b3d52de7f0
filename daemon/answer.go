package daemon

import (
	"errors"
	"log/slog"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// warnXDPTx warns, for every attached interface that is a veth whose peer
// runs no XDP program, that the rules of s which answer from XDP
// (syn_cookies, refuse: reset) will not be heard (loader.CheckXDPTxPeer),
// and for every virtio_net interface whose XDP_TX shares the stack's
// queue pairs, that the driver's shared mode has panicked a kernel
// (loader.CheckXDPTxQueues).
func warnXDPTx(log *slog.Logger, ifaces []string, spec *dataplane.Spec) {
	names := dataplane.XDPTxRules(spec)
	if len(names) == 0 {
		return
	}
	for _, iface := range ifaces {
		if err := loader.CheckXDPTxPeer(iface); errors.Is(err, loader.ErrVethPeerNoXDP) {
			log.Warn("answers from XDP will not arrive: "+err.Error(), "iface", iface, "rules", names)
		} else if err != nil {
			log.Debug("cannot tell whether answers from XDP arrive", "iface", iface, "err", err)
		}
		if err := loader.CheckXDPTxQueues(iface); errors.Is(err, loader.ErrVirtioSharedXDPTx) {
			log.Warn("answers from XDP in virtio_net's shared mode: "+err.Error(), "iface", iface, "rules", names)
		} else if err != nil {
			log.Debug("cannot tell virtio_net's XDP_TX mode", "iface", iface, "err", err)
		}
	}
}
