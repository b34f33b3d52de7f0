//go:build linux

package signal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/xlimit/xlimit/userspace/dataplane"
	"golang.org/x/sys/unix"
)

// bcOp is struct inet_diag_bc_op.
type bcOp struct {
	code, yes uint8
	no        uint16
}

func opAt(bc []byte, off int) bcOp {
	return bcOp{bc[off], bc[off+1], binary.NativeEndian.Uint16(bc[off+2:])}
}

// auditBytecode mirrors the checks of inet_diag_bc_audit and valid_cc
// (net/ipv4/inet_diag.c) for the ops portFilter emits.
func auditBytecode(bc []byte) error {
	validCC := func(cc int) bool {
		l, off := len(bc), 0
		for l >= 0 {
			if cc > l {
				return false
			}
			if cc == l {
				return true
			}
			op := opAt(bc, off)
			if op.yes < 4 || op.yes&3 != 0 {
				return false
			}
			l -= int(op.yes)
			off += int(op.yes)
		}
		return false
	}
	l, off := len(bc), 0
	for l > 0 {
		op := opAt(bc, off)
		minLen := 4
		switch op.code {
		case inetDiagBcSGe, inetDiagBcSLe:
			minLen += 4
			if l < minLen {
				return fmt.Errorf("op at %d: port comparison truncated", off)
			}
		case inetDiagBcJmp:
		default:
			return fmt.Errorf("op at %d: code %d", off, op.code)
		}
		no := int(op.no)
		if no < minLen || no > l+4 || no&3 != 0 {
			return fmt.Errorf("op at %d: bad no %d (len %d)", off, no, l)
		}
		if no < l && !validCC(l-no) {
			return fmt.Errorf("op at %d: no %d does not land on an op", off, no)
		}
		yes := int(op.yes)
		if yes < minLen || yes > l+4 || yes&3 != 0 {
			return fmt.Errorf("op at %d: bad yes %d", off, yes)
		}
		off += yes
		l -= yes
	}
	if l != 0 {
		return errors.New("program does not end on an op")
	}
	return nil
}

// runBytecode mirrors inet_diag_bc_run for a socket with local port sport.
func runBytecode(bc []byte, sport uint16) bool {
	l, off := len(bc), 0
	for l > 0 {
		op := opAt(bc, off)
		yes := true
		switch op.code {
		case inetDiagBcJmp:
			yes = false
		case inetDiagBcSGe:
			yes = sport >= opAt(bc, off+4).no
		case inetDiagBcSLe:
			yes = sport <= opAt(bc, off+4).no
		}
		if yes {
			l -= int(op.yes)
			off += int(op.yes)
		} else {
			l -= int(op.no)
			off += int(op.no)
		}
	}
	return l == 0
}

func TestPortFilterGolden(t *testing.T) {
	bc, err := portFilter([]dataplane.PortRange{dataplane.Port(80)})
	if err != nil {
		t.Fatal(err)
	}
	// S_GE 80 (yes 8, no 20 = end+4), S_LE 80 (yes 8, no 12 = end+4).
	var want []byte
	for _, op := range []bcOp{{inetDiagBcSGe, 8, 20}, {0, 0, 80}, {inetDiagBcSLe, 8, 12}, {0, 0, 80}} {
		want = append(want, op.code, op.yes)
		want = binary.NativeEndian.AppendUint16(want, op.no)
	}
	if !bytes.Equal(bc, want) {
		t.Errorf("one port: % x, want % x", bc, want)
	}

	bc, err = portFilter([]dataplane.PortRange{{Lo: 8000, Hi: 8099}, dataplane.Port(443)})
	if err != nil {
		t.Fatal(err)
	}
	want = want[:0]
	for _, op := range []bcOp{
		{inetDiagBcSGe, 8, 20}, {0, 0, 8000}, // mismatch → second range at 20
		{inetDiagBcSLe, 8, 12}, {0, 0, 8099}, // mismatch → 20
		{inetDiagBcJmp, 4, 20}, // match → 16+20 = 36 = end: accept
		{inetDiagBcSGe, 8, 20}, {0, 0, 443},
		{inetDiagBcSLe, 8, 12}, {0, 0, 443},
	} {
		want = append(want, op.code, op.yes)
		want = binary.NativeEndian.AppendUint16(want, op.no)
	}
	if !bytes.Equal(bc, want) {
		t.Errorf("two ranges:\n% x, want\n% x", bc, want)
	}
}

func TestPortFilterSemantics(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		n := 1 + rng.IntN(8)
		if trial == 0 {
			n = MaxPortRanges
		}
		ranges := make([]dataplane.PortRange, n)
		for i := range ranges {
			a, b := uint16(rng.IntN(65536)), uint16(rng.IntN(65536))
			if rng.IntN(3) == 0 {
				b = a
			}
			ranges[i] = dataplane.PortRange{Lo: min(a, b), Hi: max(a, b)}
		}
		bc, err := portFilter(ranges)
		if err != nil {
			t.Fatal(err)
		}
		if err := auditBytecode(bc); err != nil {
			t.Fatalf("ranges %v: audit: %v", ranges, err)
		}
		probe := []uint16{0, 65535}
		for _, r := range ranges {
			probe = append(probe, r.Lo, r.Hi, r.Lo-1, r.Hi+1)
		}
		for range 50 {
			probe = append(probe, uint16(rng.IntN(65536)))
		}
		for _, p := range probe {
			want := false
			for _, r := range ranges {
				want = want || r.Contains(p)
			}
			if got := runBytecode(bc, p); got != want {
				t.Fatalf("ranges %v, port %d: filter says %v, want %v", ranges, p, got, want)
			}
		}
	}
	if _, err := portFilter(make([]dataplane.PortRange, MaxPortRanges+1)); err == nil {
		t.Error("portFilter accepted too many ranges")
	}
	if _, err := portFilter([]dataplane.PortRange{{Lo: 10, Hi: 9}}); err == nil {
		t.Error("portFilter accepted an empty range")
	}
}

// nlMsg builds one netlink message.
func nlMsg(typ, flags uint16, seq uint32, payload []byte) []byte {
	ne := binary.NativeEndian
	l := unix.SizeofNlMsghdr + len(payload)
	b := ne.AppendUint32(nil, uint32(l))
	b = ne.AppendUint16(b, typ)
	b = ne.AppendUint16(b, flags)
	b = ne.AppendUint32(b, seq)
	b = ne.AppendUint32(b, 0)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func diagMsg(state uint8, port uint16, rq, wq uint32) []byte {
	b := make([]byte, sizeofDiagMsg+8) // plus an attribute's worth
	b[0], b[diagMsgState] = unix.AF_INET, state
	binary.BigEndian.PutUint16(b[diagMsgSport:], port)
	binary.NativeEndian.PutUint32(b[diagMsgRqueue:], rq)
	binary.NativeEndian.PutUint32(b[diagMsgWqueue:], wq)
	return b
}

func TestParseDiagMessages(t *testing.T) {
	type sock struct {
		state  uint8
		port   uint16
		rq, wq uint32
	}
	var got []sock
	fn := func(state uint8, port uint16, rq, wq uint32) { got = append(got, sock{state, port, rq, wq}) }

	var b []byte
	b = append(b, nlMsg(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_MULTI, 7, diagMsg(tcpListen, 8080, 3, 128))...)
	b = append(b, nlMsg(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_MULTI, 6, diagMsg(tcpListen, 9999, 1, 1))...) // stale
	b = append(b, nlMsg(unix.SOCK_DIAG_BY_FAMILY, unix.NLM_F_MULTI, 7, diagMsg(tcpListen, 443, 0, 4096))...)
	done, intr, err := parseDiagMessages(b, 7, fn)
	if err != nil || done || intr {
		t.Fatalf("parse: done %v intr %v err %v", done, intr, err)
	}
	want := []sock{{tcpListen, 8080, 3, 128}, {tcpListen, 443, 0, 4096}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("sockets %v, want %v", got, want)
	}

	done, intr, err = parseDiagMessages(nlMsg(unix.NLMSG_DONE, unix.NLM_F_MULTI|unix.NLM_F_DUMP_INTR, 7, make([]byte, 4)), 7, fn)
	if err != nil || !done || !intr {
		t.Errorf("DONE with DUMP_INTR: done %v intr %v err %v", done, intr, err)
	}
	e := -int32(unix.EINVAL)
	errPayload := binary.NativeEndian.AppendUint32(nil, uint32(e))
	errPayload = append(errPayload, make([]byte, unix.SizeofNlMsghdr)...)
	done, _, err = parseDiagMessages(nlMsg(unix.NLMSG_ERROR, 0, 7, errPayload), 7, fn)
	if !done || !errors.Is(err, unix.EINVAL) {
		t.Errorf("NLMSG_ERROR: done %v err %v, want EINVAL", done, err)
	}
	if _, _, err := parseDiagMessages(nlMsg(unix.SOCK_DIAG_BY_FAMILY, 0, 7, make([]byte, 10)), 7, fn); err == nil {
		t.Error("no error on a short inet_diag_msg")
	}
	bad := nlMsg(unix.SOCK_DIAG_BY_FAMILY, 0, 7, diagMsg(tcpListen, 1, 0, 0))
	binary.NativeEndian.PutUint32(bad, uint32(len(bad)+4))
	if _, _, err := parseDiagMessages(bad, 7, fn); err == nil {
		t.Error("no error on a message longer than the datagram")
	}
}

func TestDiagNoRanges(t *testing.T) {
	d, err := NewDiag()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	q, err := d.AcceptQueue(context.Background(), nil)
	if err != nil || len(q) != 0 {
		t.Errorf("AcceptQueue(nil) = %v, %v", q, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.AcceptQueue(ctx, []dataplane.PortRange{dataplane.Port(1)}); !errors.Is(err, context.Canceled) {
		t.Errorf("AcceptQueue with a cancelled context: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AcceptQueue(context.Background(), []dataplane.PortRange{dataplane.Port(1)}); err == nil {
		t.Error("AcceptQueue after Close succeeded")
	}
}
