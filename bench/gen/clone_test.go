//go:build linux

package gen

import (
	"encoding/binary"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/tests/kit/lab"
)

// TestCloner: a Cloner on a veth of two queues sends runs × clones frames,
// every one on the queue of the sending CPU's number, and with random
// sources each frame carries a source within the prefix and a valid IPv4
// header checksum; the receiving end's XDP_PASS hands them to a packet
// socket, which reads them back.
func TestCloner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates namespaces and attaches XDP")
	}
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs: sends from the second to the second queue")
	}
	l, err := lab.New(lab.Options{Prefix: "xlg", Queues: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	var rcv *Attached
	var sock int
	if err := l.Server.Do(func() error {
		var err error
		if rcv, err = AttachReceiver(l.ServerIndex, ReceiverPass); err != nil {
			return err
		}
		proto := int(binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, unix.ETH_P_IP))) // htons
		if sock, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		tv := unix.Timeval{Usec: 200_000}
		if err := unix.SetsockoptTimeval(sock, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		return unix.Bind(sock, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: l.ServerIndex})
	}); err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	defer unix.Close(sock)

	f, err := frame.Build(frame.Spec{
		SrcMAC: l.ClientMAC, DstMAC: l.ServerMAC, Src: l.ClientIP4, Dst: l.ServerIP4,
		Proto: frame.ProtoUDP, SrcPort: 40000, DstPort: 9000, PayloadLen: 18, Literal: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	f[14+20+6], f[14+20+7] = 0, 0 // no UDP checksum
	sources := netip.MustParsePrefix("100.64.0.0/16")
	const runs, clones = 4, 8

	before, err := queueXDPPackets(l)
	if err != nil {
		t.Fatal(err)
	}
	var sent int
	if err := l.Client.Do(func() error {
		c, err := NewCloner(ClonerOptions{Ifindex: l.ClientIndex, Clones: clones, Queues: 2, Sources: sources})
		if err != nil {
			return err
		}
		defer c.Close()
		return OnCPU(1, func() error {
			sent, err = c.Send(f, runs)
			return err
		})
	}); err != nil {
		t.Fatal(err)
	}
	if sent != runs*clones {
		t.Fatalf("sent %d, want %d", sent, runs*clones)
	}

	// Read them back: every frame to port 9000, its source and checksum.
	seen := map[netip.Addr]bool{}
	got := 0
	buf := make([]byte, 256)
	deadline := time.Now().Add(2 * time.Second)
	for got < sent && time.Now().Before(deadline) {
		n, _, err := unix.Recvfrom(sock, buf, 0)
		if err != nil {
			continue // the timeout: look again until the deadline
		}
		if n < 14+28 {
			continue
		}
		ip := buf[14:n] // SOCK_RAW: after the Ethernet header
		if ip[9] != unix.IPPROTO_UDP || binary.BigEndian.Uint16(ip[22:24]) != 9000 {
			continue
		}
		got++
		src := netip.AddrFrom4([4]byte(ip[12:16]))
		if !sources.Contains(src) {
			t.Errorf("frame %d from %s, outside %s", got, src, sources)
		}
		if !ipv4ChecksumOK(ip[:20]) {
			t.Errorf("frame %d from %s: bad IPv4 header checksum %#04x", got, src, binary.BigEndian.Uint16(ip[10:12]))
		}
		seen[src] = true
	}
	if got != sent {
		t.Errorf("read back %d of %d frames", got, sent)
	}
	if len(seen) < sent/2 {
		t.Errorf("%d distinct sources in %d frames: the source is not random", len(seen), got)
	}

	after, err := queueXDPPackets(l)
	if err != nil {
		t.Fatal(err)
	}
	// Queue 0 may see the lab's own few frames (the client's IPv6
	// neighbour discovery), never the flood's.
	if d0, d1 := after[0]-before[0], after[1]-before[1]; d1 < uint64(sent) || d0 >= uint64(sent)/4 {
		t.Errorf("queue 0 received %d, queue 1 %d; want all %d of CPU 1's frames on queue 1", d0, d1, sent)
	}
}

// ipv4ChecksumOK checks an IPv4 header's checksum.
func ipv4ChecksumOK(h []byte) bool {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return sum == 0xffff
}

// queueXDPPackets reads the server end's frames on its two receive
// queues (the veth's rx_queue_N_xdp_packets).
func queueXDPPackets(l *lab.Lab) ([]uint64, error) {
	st, err := l.Server.Stats(l.ServerIf)
	if err != nil {
		return nil, err
	}
	return []uint64{st["rx_queue_0_xdp_packets"], st["rx_queue_1_xdp_packets"]}, nil
}
