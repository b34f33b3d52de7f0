//go:build linux

// Package lab builds a small, disposable network lab for end-to-end tests of
// the XDP rate limiter and for `xlimit demo`: two network namespaces joined
// by a veth pair, raw-frame floods, and simple UDP/TCP services. It needs
// root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and Linux. It serves tests: it is part
// of the test kit (tests/kit), which the release binary does not import
// (only the demo's build, tag xlimit_demo, does).
//
// # Topology
//
// New creates the named namespaces <prefix><6 hex>-c and -s (bind mounts
// under /run/netns, usable with `nsenter --net=/run/netns/NAME` and
// `ip netns`) and the veth pair <prefix><6 hex>c/s. The pair is created
// inside the client namespace with its peer placed directly in the server
// namespace, so neither end ever appears in the caller's namespace. Each lab
// gets a random /24 from 198.18.0.0/15 (client .1, server .2) and a random
// /64 from 2001:2::/48 (client ::1, server ::2, added with nodad), fixed
// locally administered MACs and permanent neighbour entries both ways, so no
// ARP or NDP is needed. New waits until both ends have carrier and all
// addresses are usable (IPv6 addresses have their local route: the kernel
// clears the tentative flag slightly before it installs the route, and
// packets arriving in between are dropped as Ip6InAddrErrors).
//
// Sysctls, inside the lab namespaces only: IPv6 on, accept_dad=0,
// router_solicitations=0 and accept_ra=0 on both veth ends; on the server
// rp_filter=0 (all, default and the veth) and accept_local=1 on the veth, so
// floods with random or spoofed sources (FloodSpec.RandomSources) are
// delivered.
//
// # Offloads and checksums
//
// Both veth ends get tx-checksumming, TSO, GSO, GRO and rx-checksumming
// switched off (legacy SIOCETHTOOL ioctls; netlink cannot do it and no
// ethtool binary is needed), except GRO on the client end: a veth accepts
// frames that its peer's XDP program sends back (XDP_TX, the resets that
// refuse connections) only on its NAPI receive path, which GRO turns on;
// GRO there touches only what the server sends, never what the server's
// XDP program counts. Reasons:
//
//   - tx-checksumming off: packets the kernel sends itself (TCPProbe, UDP
//     replies, ICMP) would otherwise cross the veth as CHECKSUM_PARTIAL with
//     only the pseudo-header sum in the L4 checksum field. The receiving stack
//     accepts them, but an XDP program, a packet socket or a frame bounced
//     elsewhere sees a wrong checksum. With it off every frame on the wire
//     carries a complete, valid checksum (TestStackChecksumsComplete).
//   - TSO/GSO/GRO off: every packet crosses the veth as itself instead of as
//     a 64 KiB super-packet, so packet counts (and an XDP packet-rate limit)
//     mean real packets.
//   - rx-checksumming off: raw frames injected through a packet socket arrive
//     with CHECKSUM_NONE and are verified in software by the receiving stack
//     either way on current kernels (veth kernels from before 2016 promoted
//     them to CHECKSUM_UNNECESSARY when the peer had rx-checksumming on, so
//     bad checksums passed); switching it off keeps verification on there
//     too. So frames with correct checksums (tests/kit/frame)
//     are accepted and frames with wrong ones are dropped
//     (TestChecksumsVerified).
//
// # Lifetime
//
// Lab.Close and NS.Close remove the namespace names. The kernel destroys a
// namespace, and with it the veth pair, once nothing references it: close
// UDPCounter, TCPEcho and other sockets opened inside, and stop processes
// started with NS.Command, before (or soon after) closing the lab.
//
// # Namespaces and goroutines
//
// NS.Do runs a function on a fresh OS thread switched into the namespace.
// Sockets opened there belong to the namespace for good and can then be used
// from any goroutine; this is how ListenUDPCounter, ListenTCPEcho, TCPProbe
// and Flood work.
package lab
