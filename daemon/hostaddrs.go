package daemon

import (
	"context"
	"time"

	"github.com/vishvananda/netlink"
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

const hostAddrsResync = 30 * time.Second

// refreshHostAddrs writes the host's addresses into the maps of every
// attached interface.
func (d *daemon) refreshHostAddrs() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, a := range d.attach {
		if err := a.RefreshHostAddrs(); err != nil {
			d.log.Warn("cannot write the host's addresses: refused connections may get no reset", "iface", a.Iface, "err", err)
		}
		// The MTU, whose MSS SYN cookies announce, changes with the link.
		if err := a.RefreshCookieLink(); err != nil {
			d.log.Warn("cannot write the SYN cookies' MSS", "iface", a.Iface, "err", err)
		}
	}
}

// watchHostAddrs keeps the host's addresses in the kernel up to date until
// ctx ends or the returned stop is called.
func (d *daemon) watchHostAddrs(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	addrCh, linkCh := make(chan netlink.AddrUpdate, 64), make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	errf := func(err error) { d.log.Debug("netlink address watch", "err", err) }
	if err := netlink.AddrSubscribeWithOptions(addrCh, done, netlink.AddrSubscribeOptions{ErrorCallback: errf}); err != nil {
		d.log.Warn("not watching address changes; the host's addresses are re-read every "+hostAddrsResync.String(), "err", err)
		addrCh = nil
	}
	if err := netlink.LinkSubscribeWithOptions(linkCh, done, netlink.LinkSubscribeOptions{ErrorCallback: errf}); err != nil {
		d.log.Warn("not watching link changes; MAC changes are seen every "+hostAddrsResync.String(), "err", err)
		linkCh = nil
	}
	d.refreshHostAddrs()
	finished := make(chan struct{})
	aCh, lCh := addrCh, linkCh
	go func() {
		defer close(finished)
		tick := time.NewTicker(hostAddrsResync)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
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
			d.refreshHostAddrs()
		}
	}()
	return func() {
		cancel()
		close(done)
		<-finished
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
