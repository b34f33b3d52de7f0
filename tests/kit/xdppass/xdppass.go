//go:build linux

// Package xdppass serves tests: it attaches an XDP program that passes
// every frame, for the labs of the kernel and end-to-end tests. No part of
// xlimit's product uses it.
package xdppass

import (
	"fmt"
	"io"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// Attach attaches a native XDP program that passes every frame to iface,
// in the calling thread's network namespace, and returns what detaches
// it. A veth delivers the frames that its peer's XDP program sends back
// (XDP_TX: resets, SYN cookies) only once its own NAPI poll runs, and the
// peer schedules that poll for XDP_TX frames only when this end runs an
// XDP program (GRO alone gives it the NAPI path, but XDP_TX frames then
// wait in its ring for the next frame the peer's stack sends). Physical
// NICs transmit XDP_TX frames themselves.
func Attach(iface string) (io.Closer, error) {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, fmt.Errorf("attach XDP pass to %s: %w", iface, err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "xlimit_pass", Type: ebpf.XDP, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()},
	})
	if err != nil {
		return nil, fmt.Errorf("load XDP pass: %w", err)
	}
	defer prog.Close() // the link holds it
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index, Flags: link.XDPDriverMode})
	if err != nil {
		return nil, fmt.Errorf("attach XDP pass to %s: %w", iface, err)
	}
	return l, nil
}
