//go:build linux

package lab

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Options configure New.
type Options struct {
	// Prefix starts every name the lab creates (namespaces, interfaces);
	// a random suffix is appended. Lower-case letters and digits, at most 7
	// characters; default "xl".
	Prefix string
	// Queues is the number of RX and TX queues of both veth ends (default 1).
	Queues int
	// ExtraClientIP4 are more IPv4 source addresses on the client veth (as
	// /32; unicast, not loopback or link-local, not the lab's .1 or .2). The server gets static neighbour entries for them and, when they
	// lie outside the lab's /24, a link route.
	ExtraClientIP4 []netip.Addr
}

// Lab is two network namespaces joined by a veth pair.
type Lab struct {
	Client, Server       *NS
	ClientIf, ServerIf   string // veth names (client end in Client, server end in Server)
	ClientIndex          int    // ifindex of ClientIf inside Client
	ServerIndex          int    // ifindex of ServerIf inside Server
	ClientMAC, ServerMAC net.HardwareAddr
	ClientIP4, ServerIP4 netip.Addr
	ClientIP6, ServerIP6 netip.Addr
	Subnet4, Subnet6     netip.Prefix // the lab's /24 (in 198.18.0.0/15) and /64 (in 2001:2::/48)
	ExtraClientIP4       []netip.Addr
}

// validPrefix reports whether p is 1-7 lower-case letters or digits.
func validPrefix(p string) bool {
	if len(p) < 1 || len(p) > 7 {
		return false
	}
	for _, c := range p {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

const readyTimeout = 5 * time.Second

// New creates a lab: namespaces <prefix><rand>-c and <prefix><rand>-s (under
// /run/netns), a veth pair <prefix><rand>c / <prefix><rand>s between them,
// lo and the veths up, addresses, static neighbour entries both ways, and the
// veth offloads and sysctls described in the package documentation. On
// failure everything created so far is removed.
func New(opts Options) (*Lab, error) {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "xl"
	}
	if !validPrefix(prefix) {
		return nil, fmt.Errorf("new lab: prefix %q is not 1-7 lower-case letters or digits", prefix)
	}
	queues := opts.Queues
	if queues == 0 {
		queues = 1
	}
	if queues < 0 || queues > 256 {
		return nil, fmt.Errorf("new lab: invalid queue count %d", queues)
	}
	var rnd [12]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("new lab: read random: %w", err)
	}
	base := prefix + hex.EncodeToString(rnd[:3])

	// 198.18.0.0/15 holds 512 /24s; 2001:2::/48 holds 65536 /64s.
	sub := int(rnd[3])<<8 | int(rnd[4])
	net4 := [4]byte{198, 18 + byte(sub>>8&1), byte(sub), 0}
	net6 := [16]byte{0x20, 0x01, 0x00, 0x02, 0, 0, rnd[5], rnd[6]}
	l := &Lab{
		ClientIf:  base + "c",
		ServerIf:  base + "s",
		ClientMAC: net.HardwareAddr{0x02, rnd[7], rnd[8], rnd[9], rnd[10], 0x01},
		ServerMAC: net.HardwareAddr{0x02, rnd[7], rnd[8], rnd[9], rnd[10], 0x02},
		Subnet4:   netip.PrefixFrom(netip.AddrFrom4(net4), 24),
		Subnet6:   netip.PrefixFrom(netip.AddrFrom16(net6), 64),
	}
	net4[3] = 1
	l.ClientIP4 = netip.AddrFrom4(net4)
	net4[3] = 2
	l.ServerIP4 = netip.AddrFrom4(net4)
	net6[15] = 1
	l.ClientIP6 = netip.AddrFrom16(net6)
	net6[15] = 2
	l.ServerIP6 = netip.AddrFrom16(net6)
	for _, a := range opts.ExtraClientIP4 {
		a = a.Unmap()
		if !a.Is4() || !a.IsGlobalUnicast() || a == l.ClientIP4 || a == l.ServerIP4 {
			return nil, fmt.Errorf("new lab: invalid extra client address %s", a)
		}
		l.ExtraClientIP4 = append(l.ExtraClientIP4, a)
	}

	var err error
	if l.Client, err = newNamedNS(base + "-c"); err != nil {
		return nil, fmt.Errorf("new lab: %w", err)
	}
	if l.Server, err = newNamedNS(base + "-s"); err != nil {
		return nil, errors.Join(fmt.Errorf("new lab: %w", err), l.Close())
	}
	if err := l.setup(queues); err != nil {
		return nil, errors.Join(fmt.Errorf("new lab: %w", err), l.Close())
	}
	return l, nil
}

// handleAt opens a netlink handle inside ns.
func handleAt(ns *NS) (*netlink.Handle, error) {
	h, err := netns.GetFromPath(ns.Path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", ns.Path, err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink in %s: %w", ns.Name, err)
	}
	return nh, nil
}

func (l *Lab) setup(queues int) error {
	hc, err := handleAt(l.Client)
	if err != nil {
		return err
	}
	defer hc.Close()
	hs, err := handleAt(l.Server)
	if err != nil {
		return err
	}
	defer hs.Close()
	serverFd, err := netns.GetFromPath(l.Server.Path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", l.Server.Path, err)
	}
	defer serverFd.Close()

	// Create the pair inside the client namespace with the peer directly in
	// the server namespace: it never appears in the caller's namespace.
	attrs := netlink.NewLinkAttrs()
	attrs.Name = l.ClientIf
	attrs.HardwareAddr = l.ClientMAC
	attrs.NumTxQueues = queues
	attrs.NumRxQueues = queues
	veth := netlink.NewVeth(attrs)
	veth.PeerName = l.ServerIf
	veth.PeerHardwareAddr = l.ServerMAC
	veth.PeerNamespace = netlink.NsFd(serverFd)
	if err := hc.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s/%s: %w", l.ClientIf, l.ServerIf, err)
	}
	clink, err := hc.LinkByName(l.ClientIf)
	if err != nil {
		return fmt.Errorf("find %s: %w", l.ClientIf, err)
	}
	slink, err := hs.LinkByName(l.ServerIf)
	if err != nil {
		return fmt.Errorf("find %s: %w", l.ServerIf, err)
	}
	l.ClientIndex, l.ServerIndex = clink.Attrs().Index, slink.Attrs().Index

	// Sysctls and offloads, set while the links are still down.
	if err := l.Client.Do(func() error { return prepareIf(l.ClientIf, false) }); err != nil {
		return err
	}
	if err := l.Server.Do(func() error { return prepareIf(l.ServerIf, true) }); err != nil {
		return err
	}

	// Addresses.
	addrs := []struct {
		h    *netlink.Handle
		link netlink.Link
		p    netip.Prefix
	}{
		{hc, clink, netip.PrefixFrom(l.ClientIP4, 24)},
		{hs, slink, netip.PrefixFrom(l.ServerIP4, 24)},
		{hc, clink, netip.PrefixFrom(l.ClientIP6, 64)},
		{hs, slink, netip.PrefixFrom(l.ServerIP6, 64)},
	}
	for _, a := range l.ExtraClientIP4 {
		addrs = append(addrs, struct {
			h    *netlink.Handle
			link netlink.Link
			p    netip.Prefix
		}{hc, clink, netip.PrefixFrom(a, 32)})
	}
	for _, a := range addrs {
		na := &netlink.Addr{IPNet: prefixIPNet(a.p)}
		if a.p.Addr().Is6() {
			na.Flags = unix.IFA_F_NODAD
		}
		if err := a.h.AddrAdd(a.link, na); err != nil {
			return fmt.Errorf("add address %s to %s: %w", a.p, a.link.Attrs().Name, err)
		}
	}

	// Links up.
	for _, x := range []struct {
		h    *netlink.Handle
		name string
	}{{hc, "lo"}, {hs, "lo"}, {hc, l.ClientIf}, {hs, l.ServerIf}} {
		lk, err := x.h.LinkByName(x.name)
		if err != nil {
			return fmt.Errorf("find %s: %w", x.name, err)
		}
		if err := x.h.LinkSetUp(lk); err != nil {
			return fmt.Errorf("set %s up: %w", x.name, err)
		}
	}

	// Routes for extra client addresses outside the lab subnet.
	for _, a := range l.ExtraClientIP4 {
		if l.Subnet4.Contains(a) {
			continue
		}
		r := &netlink.Route{LinkIndex: l.ServerIndex, Dst: prefixIPNet(netip.PrefixFrom(a, 32)), Scope: netlink.SCOPE_LINK}
		if err := hs.RouteAdd(r); err != nil {
			return fmt.Errorf("add route %s dev %s: %w", a, l.ServerIf, err)
		}
	}

	// Static neighbours both ways: no ARP/NDP on the wire.
	neighs := []struct {
		h   *netlink.Handle
		idx int
		ip  netip.Addr
		mac net.HardwareAddr
	}{
		{hc, l.ClientIndex, l.ServerIP4, l.ServerMAC},
		{hc, l.ClientIndex, l.ServerIP6, l.ServerMAC},
		{hs, l.ServerIndex, l.ClientIP4, l.ClientMAC},
		{hs, l.ServerIndex, l.ClientIP6, l.ClientMAC},
	}
	for _, a := range l.ExtraClientIP4 {
		neighs = append(neighs, struct {
			h   *netlink.Handle
			idx int
			ip  netip.Addr
			mac net.HardwareAddr
		}{hs, l.ServerIndex, a, l.ClientMAC})
	}
	for _, n := range neighs {
		fam := netlink.FAMILY_V4
		if n.ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		ne := &netlink.Neigh{
			LinkIndex:    n.idx,
			Family:       fam,
			State:        netlink.NUD_PERMANENT,
			IP:           net.IP(n.ip.AsSlice()),
			HardwareAddr: n.mac,
		}
		if err := n.h.NeighSet(ne); err != nil {
			return fmt.Errorf("add neighbour %s: %w", n.ip, err)
		}
	}
	return l.waitReady(hc, hs)
}

// prepareIf sets the per-namespace sysctls and the offloads of one veth end.
// It runs inside the interface's namespace.
func prepareIf(ifname string, server bool) error {
	settings := [][2]string{
		{"ipv6/conf/" + ifname + "/disable_ipv6", "0"},
		{"ipv6/conf/" + ifname + "/accept_dad", "0"},
		{"ipv6/conf/" + ifname + "/router_solicitations", "0"},
		{"ipv6/conf/" + ifname + "/accept_ra", "0"},
	}
	if server {
		// Accept spoofed/random sources (Flood with RandomSources): no
		// reverse-path filter, and sources that are local addresses too.
		settings = append(settings,
			[2]string{"ipv4/conf/all/rp_filter", "0"},
			[2]string{"ipv4/conf/default/rp_filter", "0"},
			[2]string{"ipv4/conf/" + ifname + "/rp_filter", "0"},
			[2]string{"ipv4/conf/" + ifname + "/accept_local", "1"},
		)
	}
	for _, s := range settings {
		if err := writeSysctl(s[0], s[1]); err != nil {
			return err
		}
	}
	return setOffloads(ifname, vethOffloads(server))
}

// waitReady waits until both veth ends are operationally up and the IPv6
// addresses are usable (not tentative).
func (l *Lab) waitReady(hc, hs *netlink.Handle) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		err := l.ready(hc, hs)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("wait for lab: %w", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (l *Lab) ready(hc, hs *netlink.Handle) error {
	for _, x := range []struct {
		h    *netlink.Handle
		name string
		ip6  netip.Addr
	}{{hc, l.ClientIf, l.ClientIP6}, {hs, l.ServerIf, l.ServerIP6}} {
		lk, err := x.h.LinkByName(x.name)
		if err != nil {
			return fmt.Errorf("find %s: %w", x.name, err)
		}
		if st := lk.Attrs().OperState; st != netlink.OperUp {
			return fmt.Errorf("%s is %s", x.name, st)
		}
		addrs, err := x.h.AddrList(lk, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("list addresses of %s: %w", x.name, err)
		}
		found := false
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip == x.ip6 {
				if a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
					return fmt.Errorf("%s on %s is tentative", x.ip6, x.name)
				}
				found = true
			}
		}
		if !found {
			return fmt.Errorf("%s missing on %s", x.ip6, x.name)
		}
	}
	// An IPv6 address loses its tentative flag shortly before the kernel
	// installs its local route (from a workqueue); until then packets to it
	// are dropped (Ip6InAddrErrors). Wait for the local routes.
	for _, x := range []struct {
		h  *netlink.Handle
		ip netip.Addr
	}{{hc, l.ClientIP4}, {hc, l.ClientIP6}, {hs, l.ServerIP4}, {hs, l.ServerIP6}} {
		routes, err := x.h.RouteGet(net.IP(x.ip.AsSlice()))
		if err != nil {
			return fmt.Errorf("get route to %s: %w", x.ip, err)
		}
		if len(routes) == 0 || routes[0].Type != unix.RTN_LOCAL {
			return fmt.Errorf("%s is not local yet", x.ip)
		}
	}
	return nil
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}

// ClientFlood returns a FloodSpec for frames from the client veth to the
// server (IPv4 or IPv6 addresses), to be completed with ports, rate, etc.
func (l *Lab) ClientFlood(ipv6 bool) FloodSpec {
	s := FloodSpec{
		NS: l.Client, Ifname: l.ClientIf,
		SrcMAC: l.ClientMAC, DstMAC: l.ServerMAC,
		Src: l.ClientIP4, Dst: l.ServerIP4,
	}
	if ipv6 {
		s.Src, s.Dst = l.ClientIP6, l.ServerIP6
	}
	return s
}

// Close deletes both namespaces, which removes the veth pair once nothing
// else (sockets, processes) holds the namespaces. It is idempotent and joins
// the errors of both.
func (l *Lab) Close() error {
	var errs []error
	for _, ns := range []*NS{l.Server, l.Client} {
		if ns != nil {
			errs = append(errs, ns.Close())
		}
	}
	return errors.Join(errs...)
}
