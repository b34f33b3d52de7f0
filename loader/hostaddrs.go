//go:build linux

package loader

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// listAddrs lists the namespace's addresses (a variable: the tests make it
// fail).
var listAddrs = func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) }

// HostAddrs returns every address the host owns as xl_host_addrs (bpf/maps.h)
// of the interface ifindex lists them: its MAC, and every address of every
// interface of the caller's network namespace but the loopback ones (a
// frame from the wire to 127.0.0.1 is martian: the kernel drops it, so it
// is never answered). The program answers a frame (a reset of a refused
// SYN, a SYN cookie) only when it is addressed to them. There may be more
// than the map holds: RefreshHostAddrs selects.
func HostAddrs(ifindex int) (dataplane.HostAddrs, error) {
	link, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("read interface %d: %w", ifindex, err)
	}
	addrs, err := listAddrs()
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	h := dataplane.HostAddrs{}
	if mac := link.Attrs().HardwareAddr; len(mac) == 6 {
		h[dataplane.MACKey(mac)] = uint32(ifindex)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.Unmap().IsLoopback() || ip.IsMulticast() || ip.IsUnspecified() {
			continue
		}
		h[dataplane.IPKey(ip)] = uint32(a.LinkIndex)
	}
	return h, nil
}

// HostAddrsState is what the last refresh of an attachment's xl_host_addrs
// did.
type HostAddrsState struct {
	// Listed is how many of the host's addresses the map holds (the MAC
	// included), Unlisted how many did not fit (0: all are listed). With
	// Unlisted > 0 the map holds the mark that it is incomplete.
	Listed, Unlisted int
	// Err, when not nil, says why the map could not be made to hold them
	// (the addresses could not be read, an entry could not be written): it
	// holds what it held, marked incomplete. Rules are enforced all the
	// same; only what the program answers depends on it.
	Err error
}

// RefreshHostAddrs writes the host's addresses (HostAddrs) into the
// attachment's xl_host_addrs, and says what it did (also in
// a.HostAddrs). With more addresses than the map holds, it lists those
// of the attached interface first, then those of prefer (the other
// interfaces the daemon is attached to), then the others
// (dataplane.SelectHostAddrs), and marks the map incomplete. Attach does
// it before the program sees a packet; the daemon again whenever the
// addresses change. An error (in the state's Err too) never removes or
// stops anything: the program keeps enforcing, with the map as it was,
// marked incomplete. Each refresh ends with the lease that the map is
// maintained (maps.Tables.LeaseHostAddrs): dataplane.HostLeaseSeconds,
// which a daemon renews every second; without it the program trusts the
// map no more.
func (a *Attachment) RefreshHostAddrs(prefer ...int) (HostAddrsState, error) {
	st := a.refreshHostAddrs(prefer)
	a.HostAddrs = st
	return st, st.Err
}

func (a *Attachment) refreshHostAddrs(prefer []int) HostAddrsState {
	h, err := HostAddrs(a.Ifindex)
	if err != nil {
		err = fmt.Errorf("host addresses of %s: %w", a.Iface, err)
		return HostAddrsState{Listed: a.HostAddrs.Listed, Unlisted: a.HostAddrs.Unlisted,
			Err: errors.Join(err, a.Tables().MarkHostAddrsIncomplete(), a.Tables().LeaseHostAddrs())}
	}
	first := []uint32{uint32(a.Ifindex)}
	for _, p := range prefer {
		first = append(first, uint32(p))
	}
	// One entry stays free for the daemon's lease (dataplane.LeaseKey).
	listed, unlisted := dataplane.SelectHostAddrs(h, dataplane.HostAddrsMax-1, first...)
	st := HostAddrsState{Listed: len(listed), Unlisted: unlisted}
	if listed.Incomplete() {
		st.Listed-- // the mark is no address
	}
	if err := a.Tables().SetHostAddrs(listed); err != nil {
		st.Err = fmt.Errorf("host addresses of %s: %w", a.Iface, err)
	}
	if err := a.Tables().LeaseHostAddrs(); err != nil {
		st.Err = errors.Join(st.Err, fmt.Errorf("host addresses of %s: %w", a.Iface, err))
	}
	return st
}
