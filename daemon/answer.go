package daemon

import (
	"errors"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// warnXDPTx warns, for every attached interface that is a veth whose peer
// runs no XDP program, that the rules of s which answer from XDP
// (syn_cookies, refuse: reset) will not be heard (loader.CheckXDPTxPeer),
// and for every virtio_net interface whose XDP_TX shares the stack's
// queue pairs, that the driver's shared mode has panicked a kernel
// (loader.CheckXDPTxQueues).
func (d *daemon) warnXDPTx(s *Specs) {
	names := dataplane.XDPTxRules(s.Dataplane)
	if len(names) == 0 {
		return
	}
	for _, a := range d.attach {
		if err := loader.CheckXDPTxPeer(a.Iface); errors.Is(err, loader.ErrVethPeerNoXDP) {
			d.log.Warn("answers from XDP will not arrive: "+err.Error(), "iface", a.Iface, "rules", names)
		} else if err != nil {
			d.log.Debug("cannot tell whether answers from XDP arrive", "iface", a.Iface, "err", err)
		}
		if err := loader.CheckXDPTxQueues(a.Iface); errors.Is(err, loader.ErrVirtioSharedXDPTx) {
			d.log.Warn("answers from XDP in virtio_net's shared mode: "+err.Error(), "iface", a.Iface, "rules", names)
		} else if err != nil {
			d.log.Debug("cannot tell virtio_net's XDP_TX mode", "iface", a.Iface, "err", err)
		}
	}
}
