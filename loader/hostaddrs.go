//go:build linux

package loader

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// HostAddrs returns what xl_host_addrs (bpf/maps.h) of the interface
// ifindex must hold: its MAC, and every address of every interface of the
// caller's network namespace but the loopback ones (a frame from the wire
// to 127.0.0.1 is martian: the kernel drops it, so it is never answered).
// The program answers a frame (a reset of a refused SYN) only when it is
// addressed to them.
func HostAddrs(ifindex int) (dataplane.HostAddrs, error) {
	link, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("read interface %d: %w", ifindex, err)
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
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

// RefreshHostAddrs writes the host's addresses (HostAddrs) into the
// attachment's xl_host_addrs. Attach does it before the program sees a
// packet; the daemon again whenever the addresses change.
func (a *Attachment) RefreshHostAddrs() error {
	h, err := HostAddrs(a.Ifindex)
	if err != nil {
		return fmt.Errorf("host addresses of %s: %w", a.Iface, err)
	}
	if err := a.Tables().SetHostAddrs(h); err != nil {
		return fmt.Errorf("host addresses of %s: %w", a.Iface, err)
	}
	return nil
}
