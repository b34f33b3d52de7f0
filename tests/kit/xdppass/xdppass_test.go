//go:build linux

package xdppass

import (
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/xlimit/xlimit/tests/kit/frame"
)

// TestSinkProgram runs AttachSink's program on frames to the sink and
// elsewhere (BPF_PROG_TEST_RUN): only untagged IPv4 frames to the sink's
// addresses are dropped.
func TestSinkProgram(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to load BPF programs")
	}
	prog, err := sinkProgram(netip.MustParsePrefix("10.212.0.0/16"))
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	to := func(dst string, vlans ...uint16) []byte {
		d := netip.MustParseAddr(dst)
		src := netip.MustParseAddr("10.0.0.1")
		if d.Is6() {
			src = netip.MustParseAddr("2001:db8::1")
		}
		s := frame.Spec{Src: src, Dst: d, Proto: frame.ProtoTCP, SrcPort: 80, DstPort: 40000,
			TCPFlags: frame.TCPSyn | frame.TCPAck}
		s.VLANs = frame.Tags(vlans...)
		return frame.MustBuild(s)
	}
	for _, c := range []struct {
		name string
		in   []byte
		want uint32
	}{
		{"to the sink", to("10.212.1.2"), 1},
		{"to the sink's last address", to("10.212.255.255"), 1},
		{"beside the sink", to("10.213.0.1"), 2},
		{"to the client", to("10.0.0.2"), 2},
		{"IPv6", to("2001:db8::2"), 2},
		{"tagged, to the sink", to("10.212.1.2", frame.EtherType8021Q), 2},
		{"cut short", to("10.212.1.2")[:30], 2},
	} {
		ret, err := prog.Run(&ebpf.RunOptions{Data: c.in})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if ret != c.want {
			t.Errorf("%s: XDP return code %d, want %d", c.name, ret, c.want)
		}
	}
}
