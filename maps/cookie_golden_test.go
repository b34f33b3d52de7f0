//go:build linux

package maps

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// cookieGoldenSYNs is a corpus of SYNs that the cookie path answers, one
// per shape of what the answer carries: both families, tagged or not;
// option lists of every layout the parser meets (none, Linux's, the
// other stacks' orders, no SACK, no window scale, timestamps alone, a
// window scale over 14, MSS of each cookie value, EOL and padding, a
// malformed length, a 60-byte header); ECN asked with and without
// timestamps; a SYN with data (the frame shrinks).
func cookieGoldenSYNs(tb testing.TB) []struct {
	name string
	in   []byte
} {
	tb.Helper()
	ts := func(o []byte, at int, v uint32) []byte {
		o = append([]byte{}, o...)
		o[at], o[at+1], o[at+2], o[at+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		return o
	}
	linux := linuxSYNOptions(99999)
	mss := func(m uint16) []byte {
		o := append([]byte{}, linux...)
		o[2], o[3] = byte(m>>8), byte(m)
		return o
	}
	opts := []struct {
		name string
		o    []byte
	}{
		{"none", nil},
		{"linux", linux},
		{"linux mss 536", mss(536)},
		{"linux mss 1300", mss(1300)},
		{"linux mss 1440", mss(1440)},
		{"linux mss 9000", mss(9000)},
		{"linux wscale 15", append(append([]byte{}, linux[:19]...), 15)},
		{"linux wscale 0", append(append([]byte{}, linux[:19]...), 0)},
		{"mss only", []byte{2, 4, 5, 0xb4}},
		{"no sack", ts([]byte{2, 4, 5, 0xb4, 1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 3, 7}, 8, 12345)},
		{"no wscale", ts([]byte{2, 4, 5, 0xb4, 4, 2, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 8, 777)},
		{"ts only", ts([]byte{1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0}, 4, 0xfedcba98)},
		{"windows", []byte{2, 4, 5, 0xb4, 1, 3, 3, 8, 1, 1, 4, 2}},
		{"bsd", ts([]byte{2, 4, 5, 0xb4, 1, 3, 3, 6, 4, 2, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0}, 12, 42)},
		{"ts with tsecr", ts(ts(linux, 8, 5), 12, 0x01020304)},
		{"eol first", append([]byte{0}, linux[:19]...)},
		{"bad length", []byte{2, 4, 5, 0xb4, 8, 40, 0, 0}},
		{"zero length", []byte{2, 0, 5, 0xb4}},
		{"40 bytes", append(append([]byte{}, linux...), 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0)},
		{"linux layout, 24 bytes", append(append([]byte{}, linux...), 1, 1, 1, 0)},
	}
	var out []struct {
		name string
		in   []byte
	}
	for _, src := range []string{"198.51.100.7", "2001:db8:1::7"} {
		for _, vlans := range [][]uint16{nil, {frame.EtherType8021Q}, {frame.EtherType8021AD, frame.EtherType8021Q}} {
			for _, o := range opts {
				for _, fl := range []uint8{frame.TCPSyn, frame.TCPSyn | 0x40 | 0x80} {
					for _, payload := range []int{0, 9} {
						if payload > 0 && (o.name != "linux" || len(vlans) > 0) {
							continue
						}
						s := frame.Spec{Src: netip.MustParseAddr(src), Proto: frame.ProtoTCP, SrcPort: 40000, DstPort: 80,
							TCPFlags: fl, TCPSeq: 777000, PayloadLen: payload}
						s.VLANs = frame.Tags(vlans...)
						l3 := 14 + 4*len(vlans)
						in := frame.MustBuild(s)
						if o.o != nil {
							in = withTCPOptions(tb, in, l3, o.o)
						}
						out = append(out, struct {
							name string
							in   []byte
						}{fmt.Sprintf("%s vlans=%d %s flags=%#x data=%d", src, len(vlans), o.name, fl, payload), in})
					}
				}
			}
		}
	}
	return out
}

// TestCookieAnswerGolden answers every SYN of cookieGoldenSYNs at one
// fake time with one cookie offset and checks each answer's checksums.
// With XLIMIT_COOKIE_GOLDEN_OUT it writes the answers, one hex line per
// SYN, to that file; with XLIMIT_COOKIE_GOLDEN_IN it compares them byte
// for byte with such a file written by another build of the program (the
// proof that a rewrite of the answer answers exactly as before). The
// cookie is the kernel's, which changes every minute (its counter,
// tcp_cookie_time): write and compare within the same minute.
func TestCookieAnswerGolden(t *testing.T) {
	h := newHarness(t)
	spec := &dataplane.Spec{CookieRate: 1e6, MSS4: 1400, MSS6: 1380, Rules: []dataplane.RuleSpec{{
		Name: "web", Protocol: "tcp", Ports: ports(80, 80), SynOnly: true, Rate: 10, Burst: 3, SynCookies: "always",
	}}}
	h.apply(t, compile(t, spec, nil))
	if err := h.obj.Tables().setCookieLink(CookieLink{Offset: 0x7a000000}); err != nil {
		t.Fatal(err)
	}
	now := uint64(4321*second + 123456789)
	var lines []string
	for _, c := range cookieGoldenSYNs(t) {
		ret, out := h.kernelRunOut(t, c.in, now, 1)
		if ret != xdpTx {
			t.Errorf("%s: XDP return code %d, want XDP_TX", c.name, ret)
			continue
		}
		// The IP header: after the EtherType, past the VLAN tags.
		l3 := 12
		for out[l3] == 0x81 || out[l3] == 0x88 {
			l3 += 4
		}
		l3 += 2
		l4 := l3 + 20
		if out[l3]>>4 == 6 {
			l4 = l3 + 40
		} else if frame.OnesSum(0, out[l3:l4]) != 0xffff {
			t.Errorf("%s: IPv4 header checksum wrong: %x", c.name, out[l3:l4])
		}
		// 40 bytes of TCP header with timestamps, 24 (the MSS alone)
		// without.
		want := l4 + 24
		if _, _, ts := tcpTimestamps(out[l4:]); ts {
			want = l4 + 40
		}
		if len(out) != want || int(out[l4+12]>>4)*4 != want-l4 {
			t.Errorf("%s: answer is %d bytes, data offset %d, want %d", c.name, len(out), out[l4+12]>>4, want)
			continue
		}
		if frame.OnesSum(pseudoSum(out, l3, l4), out[l4:]) != 0xffff {
			t.Errorf("%s: TCP checksum wrong: %x", c.name, out[l4:])
		}
		lines = append(lines, c.name+" "+hex.EncodeToString(out))
	}
	if p := os.Getenv("XLIMIT_COOKIE_GOLDEN_OUT"); p != "" {
		if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := os.Getenv("XLIMIT_COOKIE_GOLDEN_IN")
	if p == "" {
		return
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var want []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		want = append(want, sc.Text())
	}
	if len(want) != len(lines) {
		t.Fatalf("%s has %d answers, this build %d", p, len(want), len(lines))
	}
	for i := range lines {
		if lines[i] != want[i] {
			t.Errorf("answer differs:\n got  %s\n want %s", lines[i], want[i])
		}
	}
	t.Logf("%d answers identical to %s", len(lines), p)
}
