//go:build linux

package tests

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/tests/kit/lab"
)

// IPv6 fragments as the veth carries them: 1448 bytes of fragmentable data
// after the 40-byte header and the 8-byte fragment header (MTU 1500).
const ipv6FragChunk = 1448

// TestFragmentIPv6OrphansLive is issue 41's H2 as the issue measured it,
// end to end: a host with a UDP byte rule, and raw IPv6 fragments sent
// from the client's veth. It reads the server namespace's
// /proc/net/snmp6 before and after each phase: Ip6ReasmReqds counts every
// fragment the kernel takes into reassembly, Ip6ReasmOKs every datagram
// it completes.
//   - 2000 orphan later fragments (no first fragment ever sent) with Next
//     Header 59: before the fix (keyed by their own Next Header, which no
//     rule follows) all 2000 reached the kernel's reassembly; now none may.
//   - The same with Next Header 17: none reached it before either.
//   - Datagrams of 4000 B at 100 a second whose first fragment is UDP to
//     the rule's port and whose later fragments say Next Header 59 (Linux
//     takes the protocol from the first fragment alone): the rule refuses
//     most of them; the later fragments of a refused datagram must not
//     reach reassembly (every fragment that does belongs to a datagram the
//     kernel completes), and the socket gets no more than the rule's rate,
//     burst and one datagram.
func TestFragmentIPv6OrphansLive(t *testing.T) {
	e := newEnv(t)
	udp, _ := e.services(true)
	const rate, burst = 20000, 10000
	e.startDaemon(e.writeRules("rules.yaml", fmt.Sprintf(`rules:
  - name: frag-udp
    protocol: udp
    ports: [%d]
    unit: bytes
    rate: %d
    burst: %d
`, udpPort, rate, burst)))
	snd, err := lab.NewSender(e.lab.Client, e.lab.ClientIf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close() })

	for _, nh := range []uint8{59, frame.ProtoUDP} {
		const n = 2000
		before := e.reasm(t)
		xdp0 := e.totalPackets(t)
		for i := range n {
			// A later fragment at offset 1448 with 512 bytes of data, each
			// of its own datagram (identification), Next Header nh.
			f := e.ipv6Fragment(t, uint32(int(nh)<<16|i), nh, ipv6FragChunk, false, make([]byte, 512))
			if err := snd.Send(f); err != nil {
				t.Fatal(err)
			}
			pace(i)
		}
		time.Sleep(300 * time.Millisecond)
		d := e.reasm(t).sub(before)
		seen := e.totalPackets(t) - xdp0
		t.Logf("e2e orphans NH %d: %d later fragments sent, %d seen by XDP; the server's reassembly: Ip6ReasmReqds +%d, Ip6ReasmOKs +%d, Ip6ReasmFails +%d",
			nh, n, seen, d.reqds, d.oks, d.fails)
		if seen < n {
			t.Errorf("NH %d: XDP saw %d of the %d fragments sent: the measurement does not hold", nh, seen, n)
		}
		if d.reqds != 0 {
			t.Errorf("NH %d: %d of %d orphan later fragments reached the kernel's reassembly (Ip6ReasmReqds), want 0", nh, d.reqds, n)
		}
	}

	// Datagrams whose later fragments say Next Header 59.
	const size, perSecond, dur = 4000, 100, 3 * time.Second
	frags := (8 + size + ipv6FragChunk - 1) / ipv6FragChunk
	before := e.reasm(t)
	udp.Reset()
	start := time.Now()
	sent := 0
	for id := uint32(1 << 24); time.Since(start) < dur; id++ {
		for _, f := range e.ipv6Datagram(t, id, size, 59) {
			if err := snd.Send(f); err != nil {
				t.Fatal(err)
			}
		}
		sent++
		time.Sleep(time.Until(start.Add(time.Duration(sent) * time.Second / perSecond)))
	}
	elapsed := time.Since(start)
	udp.Settle(300*time.Millisecond, 3*time.Second)
	d := e.reasm(t).sub(before)
	got := udp.Count()
	// What the rule charges a datagram: its frames, each as long as the
	// first but the last (frag.h, xl_frag_size).
	first := 14 + 40 + 8 + ipv6FragChunk
	last := 14 + 40 + 8 + (8 + size - (frags-1)*ipv6FragChunk)
	wire := (frags-1)*first + last
	limit := (rate*elapsed.Seconds() + burst + float64(wire)) * 1.1
	pass, drop, _, _ := e.status().rule("frag-udp")
	t.Logf("e2e datagrams (later fragments NH 59): %d of %d B (%d fragments, %d B on the wire) in %v, %.0f B/s offered; the socket received %d (%d B on the wire, at most %.0f through the rule); the server's reassembly: Ip6ReasmReqds +%d, Ip6ReasmOKs +%d, Ip6ReasmFails +%d; fragments of datagrams not completed %d; kernel rule pass %d drop %d frames",
		sent, size, frags, wire, elapsed.Round(time.Millisecond), float64(sent*wire)/elapsed.Seconds(),
		got, got*wire, limit, d.reqds, d.oks, d.fails, d.reqds-uint64(frags)*d.oks, pass, drop)
	if float64(sent*wire) < 10*rate*elapsed.Seconds() {
		t.Fatalf("offered only %d datagrams: not over the rule", sent)
	}
	if got == 0 {
		t.Errorf("no datagram reached the socket: the rule admits none")
	}
	if float64(got*wire) > limit {
		t.Errorf("the socket received %d B on the wire through a %d B/s rule in %v, want at most %.0f", got*wire, rate, elapsed.Round(time.Millisecond), limit)
	}
	if extra := int64(d.reqds) - int64(frags)*int64(d.oks); extra != 0 {
		t.Errorf("%d fragments reached the kernel's reassembly beyond the %d of the %d datagrams it completed, want 0: the later fragments of refused datagrams pass",
			extra, uint64(frags)*d.oks, d.oks)
	}
}

// pace sleeps a millisecond every 20 frames, so that the server's veth ring
// (256 frames with XDP) does not overflow.
func pace(i int) {
	if i%20 == 19 {
		time.Sleep(time.Millisecond)
	}
}

// ipv6Fragment builds a fragment from the client to the server's address:
// fragment header identification id and Next Header nh, at offset off
// bytes (a multiple of 8), with data after the fragment header.
func (e *env) ipv6Fragment(t *testing.T, id uint32, nh uint8, off int, more bool, data []byte) []byte {
	t.Helper()
	f, lay, err := frame.BuildLayout(frame.Spec{SrcMAC: e.lab.ClientMAC, DstMAC: e.lab.ServerMAC,
		Src: e.lab.ClientIP6, Dst: e.lab.ServerIP6, IPv6Ext: []uint8{frame.ExtFragment}, Proto: nh,
		FragOffset: uint16(off / 8), MoreFragments: more, Payload: data})
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint32(f[lay.L4-4:], id)
	if off == 0 {
		return f
	}
	// frame writes the fragment header's Next Header as Proto; a later
	// fragment's data carries no L4 header, whatever it says.
	if f[lay.L4-8] != nh {
		t.Fatalf("fragment header's Next Header %d, want %d", f[lay.L4-8], nh)
	}
	return f
}

// ipv6Datagram fragments a UDP datagram of size bytes of zeros to the
// server's udpPort, with a checksum over the whole datagram (so that the
// kernel delivers it once reassembled): the first fragment with Next
// Header 17 and the UDP header, the later ones with Next Header laterNH.
func (e *env) ipv6Datagram(t *testing.T, id uint32, size int, laterNH uint8) [][]byte {
	t.Helper()
	total := 8 + size
	dg := make([]byte, total)
	binary.BigEndian.PutUint16(dg[0:], 40000)
	binary.BigEndian.PutUint16(dg[2:], udpPort)
	binary.BigEndian.PutUint16(dg[4:], uint16(total))
	src, dst := e.lab.ClientIP6.As16(), e.lab.ServerIP6.As16()
	sum := frame.OnesSum(0, src[:])
	sum = frame.OnesSum(sum, dst[:])
	sum = frame.OnesSum(sum, binary.BigEndian.AppendUint32(nil, uint32(total)))
	sum = frame.OnesSum(sum, []byte{0, 0, 0, frame.ProtoUDP})
	sum = frame.OnesSum(sum, dg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	ck := ^uint16(sum)
	if ck == 0 {
		ck = 0xffff
	}
	binary.BigEndian.PutUint16(dg[6:], ck)
	var out [][]byte
	for off := 0; off < total; off += ipv6FragChunk {
		end := min(off+ipv6FragChunk, total)
		// The first fragment goes as another protocol's bytes (the UDP
		// header is in them), then says UDP: frame would write its own
		// UDP header and checksum.
		f := e.ipv6Fragment(t, id, 253, off, end < total, dg[off:end])
		nh := laterNH
		if off == 0 {
			nh = frame.ProtoUDP
		}
		f[14+40] = nh
		out = append(out, f)
	}
	return out
}

// reasmCounts are the IPv6 reassembly counters of /proc/net/snmp6.
type reasmCounts struct{ reqds, oks, fails uint64 }

func (a reasmCounts) sub(b reasmCounts) reasmCounts {
	return reasmCounts{a.reqds - b.reqds, a.oks - b.oks, a.fails - b.fails}
}

// reasm reads the server namespace's IPv6 reassembly counters (from a
// thread inside it: /proc/net follows the thread group leader's
// namespace, thread-self the thread's).
func (e *env) reasm(t *testing.T) reasmCounts {
	t.Helper()
	var data []byte
	err := e.lab.Server.Do(func() error {
		var err error
		data, err = os.ReadFile("/proc/thread-self/net/snmp6")
		return err
	})
	if err != nil {
		t.Fatalf("read snmp6: %v", err)
	}
	v := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err == nil {
				v[f[0]] = n
			}
		}
	}
	for _, k := range []string{"Ip6ReasmReqds", "Ip6ReasmOKs", "Ip6ReasmFails"} {
		if _, ok := v[k]; !ok {
			t.Fatalf("snmp6 has no %s:\n%s", k, data)
		}
	}
	return reasmCounts{v["Ip6ReasmReqds"], v["Ip6ReasmOKs"], v["Ip6ReasmFails"]}
}

// totalPackets is what the server's program saw, passed or dropped, from
// `xlimit status --json`.
func (e *env) totalPackets(t *testing.T) uint64 {
	t.Helper()
	out, err := e.xlimit("status", "--json", "--iface", e.lab.ServerIf)
	if err != nil {
		t.Fatalf("xlimit status: %v: %s", err, out)
	}
	var rep struct {
		Interfaces []struct {
			Total struct {
				Packets map[string]uint64 `json:"packets"`
			} `json:"total"`
		} `json:"interfaces"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Interfaces) != 1 {
		t.Fatalf("decode status: %v: %s", err, out)
	}
	p := rep.Interfaces[0].Total.Packets
	return p["pass"] + p["drop"]
}
