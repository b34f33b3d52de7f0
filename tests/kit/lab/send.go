//go:build linux

package lab

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Sender sends arbitrary raw frames, one at a time, on an interface through
// an AF_PACKET socket (PACKET_QDISC_BYPASS): malformed and truncated frames
// reach the peer exactly as given. A frame must hold at least an Ethernet
// header (14 bytes); the kernel refuses shorter ones.
type Sender struct {
	fd     int
	ifname string
}

// NewSender opens a Sender on ifname inside ns. Close it when done.
func NewSender(ns *NS, ifname string) (*Sender, error) {
	fd, err := openPacketSocket(ns, ifname)
	if err != nil {
		return nil, err
	}
	return &Sender{fd: fd, ifname: ifname}, nil
}

// Send sends one frame.
func (s *Sender) Send(frame []byte) error {
	n, err := unix.Write(s.fd, frame)
	if err != nil {
		return fmt.Errorf("send %d-byte frame on %s: %w", len(frame), s.ifname, err)
	}
	if n != len(frame) {
		return fmt.Errorf("send %d-byte frame on %s: sent %d bytes", len(frame), s.ifname, n)
	}
	return nil
}

// Close closes the socket.
func (s *Sender) Close() error {
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}
