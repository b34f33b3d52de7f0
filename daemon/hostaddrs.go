package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/userspace/dataplane"
	"github.com/xlimit/xlimit/userspace/metrics"
)

// The host's own addresses in the kernel (xl_host_addrs, bpf/maps.h): the
// XDP program answers a frame (a reset of a refused SYN, a SYN cookie)
// only when it is addressed to the attached interface's MAC and to one of
// the namespace's IPs, and not from one of them (loader.HostAddrs,
// bpf/answer.h); and the MSS its SYN cookies announce, from the
// interface's MTU (loader.RefreshCookieLink). loader.Attach writes both
// before the first packet; the daemon again on every netlink address or
// link event (an MTU change is one), and every hostAddrsResync in case an
// event was lost (netlink drops them when its socket buffer is full).
//
// Only the daemon follows the addresses, while the program enforces
// without it: so the map carries the daemon's lease (maps.Tables.
// LeaseHostAddrs, dataplane.HostLeaseSeconds ahead), written after each
// refresh, renewed every hostAddrsRenew while the watch runs and removed
// when it stops (the daemon exits). A daemon killed without its exit hook
// stops renewing: the lease runs out within HostLeaseSeconds, and the
// program leaves the SYNs it would have answered by the map to the kernel
// (bpf/answer.h, docs/robustness.md).

const (
	hostAddrsResync = 30 * time.Second
	hostAddrsRenew  = time.Second
)

// hostAddrs keeps the host's addresses in the kernel maps of the
// attachments it is given, and what it knows of each interface's.
type hostAddrs struct {
	log *slog.Logger
	// attached runs f with the attachments, under the lock that guards
	// them against re-attaching (the daemon's mu).
	attached func(f func(attach []*loader.Attachment, plans map[string]*dataplane.Plan))

	mu    sync.Mutex // guards state against the metrics collector
	state map[string]*hostAddrsState
}

// hostAddrsState is what the daemon knows of an interface's xl_host_addrs:
// the last refresh, the refreshes that failed, and
// whether the addresses that did not fit were reported (once, until all
// fit again).
type hostAddrsState struct {
	last     loader.HostAddrsState
	failures uint64
	warned   bool
	// lastErr and mssErr are the last refresh's errors, logged when they
	// change: an interface being deleted sends a burst of events, each
	// refresh failing the same way until it is back.
	lastErr, mssErr string
	// leaseErr is the last renewal's error (renewAll).
	leaseErr string
}

// refreshHostAddrs writes the host's addresses into the maps of every
// attached interface: each lists its own interface's first, then those of
// the other attached interfaces (loader.RefreshHostAddrs). Nothing here
// stops enforcement: a refresh that fails is logged and counted
// (xlimit_host_addrs_refresh_errors_total), the map keeps what it held,
// marked incomplete, and the next event or resync tries again.
func (h *hostAddrs) refresh() {
	h.attached(h.refreshAll)
}

func (h *hostAddrs) refreshAll(attach []*loader.Attachment, _ map[string]*dataplane.Plan) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state == nil {
		h.state = map[string]*hostAddrsState{}
	}
	for _, a := range attach {
		var others []int
		for _, o := range attach {
			if o != a {
				others = append(others, o.Ifindex)
			}
		}
		hs := h.state[a.Iface]
		if hs == nil {
			hs = &hostAddrsState{}
			h.state[a.Iface] = hs
		}
		st, err := a.RefreshHostAddrs(others...)
		hs.last = st
		if err != nil {
			hs.failures++
		}
		if logChange(&hs.lastErr, err) {
			if err != nil {
				h.log.Warn("cannot write the host's addresses: rules are enforced, answers (resets, SYN cookies) go by the addresses last written", "iface", a.Iface, "err", err)
			} else {
				h.log.Info("host addresses written again", "iface", a.Iface, "listed", st.Listed)
			}
		}
		switch {
		case st.Unlisted > 0 && !hs.warned:
			hs.warned = true
			h.log.Warn("host addresses unlisted: the host has more than xl_host_addrs holds; those of the attached interfaces are listed first (docs/dataplane.md)",
				"iface", a.Iface, "listed", st.Listed, "unlisted", st.Unlisted, "capacity", dataplane.HostAddrsMax-1)
		case st.Unlisted == 0 && hs.warned && err == nil:
			hs.warned = false
			h.log.Info("host addresses: all listed again", "iface", a.Iface, "listed", st.Listed)
		}
		// The MTU, whose MSS SYN cookies announce, changes with the link.
		if err := a.RefreshCookieLink(); logChange(&hs.mssErr, err) {
			if err != nil {
				h.log.Warn("cannot write the SYN cookies' MSS", "iface", a.Iface, "err", err)
			} else {
				h.log.Info("SYN cookies' MSS written again", "iface", a.Iface)
			}
		}
	}
}

// renewAll renews the lease on every attached interface's map (the map is
// up to date: every change since the last refresh is an event not yet
// handled, or one the next resync finds). A failure is logged once.
func (h *hostAddrs) renewAll(attach []*loader.Attachment, _ map[string]*dataplane.Plan) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, a := range attach {
		hs := h.state[a.Iface]
		if hs == nil {
			continue // not refreshed yet: its refresh leases it
		}
		if err := a.Tables().LeaseHostAddrs(); logChange(&hs.leaseErr, err) {
			if err != nil {
				h.log.Warn("cannot renew the lease on the host addresses: within seconds the program leaves SYNs it would answer to the kernel", "iface", a.Iface, "err", err)
			} else {
				h.log.Info("host addresses: lease renewed again", "iface", a.Iface)
			}
		}
	}
}

// releaseAll ends the lease on every attached interface's map: the daemon
// stops following the addresses, the program at once stops trusting them.
func (h *hostAddrs) releaseAll(attach []*loader.Attachment, _ map[string]*dataplane.Plan) {
	for _, a := range attach {
		if err := a.Tables().ReleaseHostAddrs(); err != nil {
			h.log.Warn("cannot release the lease on the host addresses: it runs out on its own", "iface", a.Iface, "err", err,
				"within", time.Duration(dataplane.HostLeaseSeconds)*time.Second)
		}
	}
}

// logChange records err's text in last and reports whether it changed
// (a new error, another one, or none after one).
func logChange(last *string, err error) bool {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if msg == *last {
		return false
	}
	*last = msg
	return true
}

// metrics is the host-address state of an interface for the metrics (the
// attachment's own before the first refresh).
func (h *hostAddrs) metrics(a *loader.Attachment) *metrics.HostAddrs {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, failures := a.HostAddrs, uint64(0)
	if hs := h.state[a.Iface]; hs != nil {
		st, failures = hs.last, hs.failures
	}
	return &metrics.HostAddrs{Listed: st.Listed, Unlisted: st.Unlisted, RefreshErrors: failures}
}

// watch keeps the host's addresses in the kernel up to date until ctx
// ends or the returned stop is called.
func (h *hostAddrs) watch(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	addrCh, linkCh := make(chan netlink.AddrUpdate, 64), make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	errf := func(err error) { h.log.Debug("netlink address watch", "err", err) }
	if err := netlink.AddrSubscribeWithOptions(addrCh, done, netlink.AddrSubscribeOptions{ErrorCallback: errf}); err != nil {
		h.log.Warn("not watching address changes; the host's addresses are re-read every "+hostAddrsResync.String(), "err", err)
		addrCh = nil
	}
	if err := netlink.LinkSubscribeWithOptions(linkCh, done, netlink.LinkSubscribeOptions{ErrorCallback: errf}); err != nil {
		h.log.Warn("not watching link changes; MAC changes are seen every "+hostAddrsResync.String(), "err", err)
		linkCh = nil
	}
	h.refresh()
	finished := make(chan struct{})
	aCh, lCh := addrCh, linkCh
	go func() {
		defer close(finished)
		tick := time.NewTicker(hostAddrsResync)
		defer tick.Stop()
		renew := time.NewTicker(hostAddrsRenew)
		defer renew.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-renew.C:
				h.attached(h.renewAll)
				continue
			case _, ok := <-addrCh:
				if !ok {
					addrCh = nil
					continue
				}
			case _, ok := <-linkCh:
				if !ok {
					linkCh = nil
					continue
				}
			case <-tick.C:
			}
			// One refresh for a burst of events.
			for drained := false; !drained; {
				select {
				case <-addrCh:
				case <-linkCh:
				default:
					drained = true
				}
			}
			h.refresh()
		}
	}()
	return func() {
		cancel()
		close(done)
		<-finished
		h.attached(h.releaseAll)
		// netlink closes its channels once it sees done; until then it
		// must not block on a send nobody reads.
		if aCh != nil {
			go func() {
				for range aCh {
				}
			}()
		}
		if lCh != nil {
			go func() {
				for range lCh {
				}
			}()
		}
	}
}
