//go:build linux

// Package xdppass serves tests: it attaches an XDP program that passes
// every frame (or drops those to a sink prefix), for the labs of the kernel and end-to-end tests. No part of
// xlimit's product uses it.
package xdppass

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
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

// AttachSink is Attach, but the program drops the untagged IPv4 frames to
// the addresses of sink (an IPv4 prefix) and passes the rest: the answers
// a host sends to a flood's spoofed sources leave it and are the
// network's to carry, and a lab whose client end took them up its own
// stack would charge the host's CPU with what no real host pays.
func AttachSink(iface string, sink netip.Prefix) (io.Closer, error) {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, fmt.Errorf("attach XDP sink to %s: %w", iface, err)
	}
	prog, err := sinkProgram(sink)
	if err != nil {
		return nil, err
	}
	defer prog.Close() // the link holds it
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index, Flags: link.XDPDriverMode})
	if err != nil {
		return nil, fmt.Errorf("attach XDP sink to %s: %w", iface, err)
	}
	return l, nil
}

// sinkProgram loads AttachSink's program.
func sinkProgram(sink netip.Prefix) (*ebpf.Program, error) {
	if !sink.Addr().Is4() {
		return nil, fmt.Errorf("load XDP sink: %s is not an IPv4 prefix", sink)
	}
	// The destination as the program loads it: the packet's bytes in the
	// machine's order (little-endian), the mask likewise.
	net4 := sink.Masked().Addr().As4()
	var mask [4]byte
	for i := range sink.Bits() {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	want := int32(binary.LittleEndian.Uint32(net4[:]))
	m := int32(binary.LittleEndian.Uint32(mask[:]))
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "xlimit_sink", Type: ebpf.XDP, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{
			asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
			asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, 34), // Ethernet and IPv4 headers
			asm.JGT.Reg(asm.R4, asm.R3, "pass"),
			asm.LoadMem(asm.R5, asm.R2, 12, asm.Half), // the EtherType
			asm.JNE.Imm32(asm.R5, 0x0008, "pass"),     // 0x0800, as loaded
			asm.LoadMem(asm.R5, asm.R2, 30, asm.Word), // the IPv4 destination
			asm.And.Imm32(asm.R5, m),
			asm.JNE.Imm32(asm.R5, want, "pass"),
			asm.Mov.Imm(asm.R0, 1 /* XDP_DROP */),
			asm.Return(),
			asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */).WithSymbol("pass"),
			asm.Return(),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("load XDP sink: %w", err)
	}
	return prog, nil
}

// AttachNetlink attaches a program named name that passes every frame to
// iface in native mode through netlink, with no bpf_link and no libxdp
// dispatcher (as `ip link set dev IFACE xdp obj ...` does), in the calling
// thread's network namespace. It returns the program's id and what
// removes it.
func AttachNetlink(iface, name string) (uint32, func() error, error) {
	l, err := netlink.LinkByName(iface)
	if err != nil {
		return 0, nil, fmt.Errorf("attach XDP %s to %s: %w", name, iface, err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: name, Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()},
	})
	if err != nil {
		return 0, nil, fmt.Errorf("load XDP %s: %w", name, err)
	}
	defer prog.Close()     // the interface holds it
	const drvMode = 1 << 2 // XDP_FLAGS_DRV_MODE
	if err := netlink.LinkSetXdpFdWithFlags(l, prog.FD(), drvMode); err != nil {
		return 0, nil, fmt.Errorf("attach XDP %s to %s: %w", name, iface, err)
	}
	info, err := prog.Info()
	if err != nil {
		return 0, nil, fmt.Errorf("read XDP %s info: %w", name, err)
	}
	id, _ := info.ID()
	index := l.Attrs().Index
	detach := func() error {
		l, err := netlink.LinkByIndex(index)
		if err != nil {
			return nil // the interface is gone, and its XDP with it
		}
		return netlink.LinkSetXdpFdWithFlags(l, -1, drvMode)
	}
	return uint32(id), detach, nil
}
