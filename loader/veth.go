//go:build linux

package loader

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ErrVethPeerNoXDP says that an interface is a veth whose peer runs no XDP
// program. xlimit answers SYNs from XDP (SYN cookies' SYN-ACKs, the resets
// of refused SYNs) with XDP_TX, and a veth delivers XDP_TX frames to its
// peer only when the peer runs an XDP program of its own: otherwise they
// wait in its ring until the peer's stack happens to send, and a cookie's
// SYN-ACK usually never arrives (docs/dataplane.md, "SYN cookies").
var ErrVethPeerNoXDP = errors.New("a veth whose peer runs no XDP program: frames answered from XDP (syn_cookies SYN-ACKs, refuse: reset) reach the peer late or never; attach an XDP program to the peer (one that passes every frame will do)")

// CheckXDPTxPeer reports whether frames that the XDP program on iface sends
// back (XDP_TX) reach the other end: an error wrapping ErrVethPeerNoXDP
// when iface is a veth whose peer, in this namespace or another, has no
// XDP program; nil for a veth whose peer has one and for any other kind
// of interface; another error when it cannot tell (no such interface, the
// peer's namespace unreadable).
func CheckXDPTxPeer(iface string) error {
	l, err := netlink.LinkByName(iface)
	if err != nil {
		return fmt.Errorf("find interface %s: %w", iface, err)
	}
	if l.Type() != "veth" {
		return nil
	}
	a := l.Attrs()
	peer, err := linkByIndexAt(a.ParentIndex, a.NetNsID)
	if err != nil {
		return fmt.Errorf("read the peer of veth %s: %w", iface, err)
	}
	if x := peer.Attrs().Xdp; x == nil || !x.Attached {
		return fmt.Errorf("%s (peer %s, ifindex %d): %w", iface, peer.Attrs().Name, a.ParentIndex, ErrVethPeerNoXDP)
	}
	return nil
}

// linkByIndexAt reads the link of ifindex in the namespace of nsid (a
// namespace id as the caller's namespace knows it, IFLA_LINK_NETNSID; -1:
// the caller's own), through RTM_GETLINK with IFLA_TARGET_NETNSID (Linux
// 4.20).
func linkByIndexAt(ifindex, nsid int) (netlink.Link, error) {
	if nsid < 0 {
		return netlink.LinkByIndex(ifindex)
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_TARGET_NETNSID, nl.Uint32Attr(uint32(nsid))))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return nil, fmt.Errorf("get link %d of namespace id %d: %w", ifindex, nsid, err)
	}
	if len(msgs) != 1 {
		return nil, fmt.Errorf("get link %d of namespace id %d: %d answers", ifindex, nsid, len(msgs))
	}
	return netlink.LinkDeserialize(nil, msgs[0])
}
