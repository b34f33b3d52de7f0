//go:build linux

package lab

import (
	"errors"
	"fmt"

	"github.com/xlimit/xlimit/tests/kit/frame"
)

// Protocols of FloodSpec.Proto.
const (
	ProtoUDP    = "udp"     // UDP datagram
	ProtoTCPSYN = "tcp-syn" // TCP segment with only SYN set
)

// synWindow is the window of a SYN from Linux (44 segments of 1460 bytes).
const synWindow = 64240

// floodFrame builds the frame Flood sends for s, from s.Src and s.SrcPort
// as given, with the header values of a host's stack: DF set and
// identification 0 (an atomic datagram), TCP sequence number 0 and Linux's
// window. The builder's defaults are off (frame.Spec.Literal): nil MACs are
// all zeros. The layout lets Flood rewrite the source per packet.
func floodFrame(s FloodSpec) ([]byte, frame.Layout, error) {
	src, dst := s.Src.Unmap(), s.Dst.Unmap()
	if !src.IsValid() || !dst.IsValid() {
		return nil, frame.Layout{}, errors.New("build frame: source and destination address are required")
	}
	spec := frame.Spec{
		SrcMAC: s.SrcMAC, DstMAC: s.DstMAC, VLANs: s.VLANs,
		Src: src, Dst: dst, DontFragment: true,
		SrcPort: s.SrcPort, DstPort: s.DstPort, PayloadLen: s.PayloadLen,
		IPv4OptionWords: s.IPv4OptionWords,
		Literal:         true,
	}
	switch s.Proto {
	case "", ProtoUDP:
		spec.Proto = frame.ProtoUDP
	case ProtoTCPSYN:
		spec.Proto, spec.TCPFlags, spec.TCPWindow = frame.ProtoTCP, frame.TCPSyn, synWindow
	default:
		return nil, frame.Layout{}, fmt.Errorf("build frame: unknown protocol %q", s.Proto)
	}
	b, lay, err := frame.BuildLayout(spec)
	if err == nil && s.TCPDataOffset != 0 {
		if s.Proto != ProtoTCPSYN || s.TCPDataOffset > 15 {
			return nil, frame.Layout{}, fmt.Errorf("build frame: TCP data offset %d: a SYN's, 0-15", s.TCPDataOffset)
		}
		b[lay.L4+12] = s.TCPDataOffset<<4 | b[lay.L4+12]&0x0f
	}
	return b, lay, err
}
