//go:build linux

package maps

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// SYN cookies: the ACK side is the TC program of bpf/syncookie_tc.c, a
// separate object that uses the kfunc bpf_sk_assign_tcp_reqsk (Linux 6.9)
// and is loaded only where the kernel has it, over the XDP object's maps.

// CookieKfunc is the kernel function the ACK side of SYN cookies needs.
const CookieKfunc = "bpf_sk_assign_tcp_reqsk"

// ErrCookieKernel says why a kernel cannot run rules with syn_cookies.
var ErrCookieKernel = errors.New("syn_cookies needs the kernel function " + CookieKfunc + " (Linux 6.9 or newer), which this kernel lacks")

// CookieSupport reports whether the running kernel has what rules with
// syn_cookies need: nil, or an error wrapping ErrCookieKernel. It reads the
// kernel's BTF (/sys/kernel/btf/vmlinux) and needs no privilege.
func CookieSupport() error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("%w (cannot read the kernel's BTF: %v)", ErrCookieKernel, err)
	}
	var fn *btf.Func
	if err := spec.TypeByName(CookieKfunc, &fn); err != nil {
		return fmt.Errorf("%w (uname -r: %s)", ErrCookieKernel, kernelRelease())
	}
	return nil
}

// KernelMPTCP reports whether the running kernel has MPTCP (struct
// mptcp_sock in its BTF): the XDP program then leaves the SYNs of an MPTCP
// listener to the kernel rather than answering them with cookies that
// bpf_sk_assign_tcp_reqsk would refuse (syncookie.h, xl_cookie_mptcp).
// Where it has not, no listener is MPTCP, and the program's test, whose
// helper the verifier would refuse there, is compiled out.
func KernelMPTCP() bool {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false
	}
	var s *btf.Struct
	return spec.TypeByName("mptcp_sock", &s) == nil
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return string(b[:len(b)-1])
}

// CookieProgram is the loaded TC program of the SYN cookies' ACK side.
type CookieProgram struct{ prog *ebpf.Program }

// Program returns the TC program.
func (c *CookieProgram) Program() *ebpf.Program { return c.prog }

// Close releases the program.
func (c *CookieProgram) Close() error { return c.prog.Close() }

// LoadCookieProgram loads the TC program that checks returning ACKs
// against the XDP object's maps (so both share rules, buckets and
// counters). fakeClock as Options.FakeClock. On a kernel without the kfunc
// it returns an error wrapping ErrCookieKernel.
func (o *Objects) LoadCookieProgram(fakeClock bool) (*CookieProgram, error) {
	if err := CookieSupport(); err != nil {
		return nil, err
	}
	spec, err := loadSyncookie()
	if err != nil {
		return nil, fmt.Errorf("load cookie spec: %w", err)
	}
	prog, err := o.loadOverXDP(spec, "xlimit_tc_cookie", "cookie", fakeClock, func(err error) error {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("%w: %v", ErrCookieKernel, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &CookieProgram{prog: prog}, nil
}

// cookieMaps are the SYN cookies' maps of a Tables (nil in pins of an
// xlimit from before them).
type cookieMaps struct {
	cfg, state, stats *ebpf.Map
	// toSocket counts the SYNs left to a socket the host already had
	// (bpf/syncookie.h); nil in pins of an xlimit from before it.
	toSocket *ebpf.Map
	// refusedReset counts the valid cookie ACKs that a rule with
	// refuse: reset refused, answered with a reset (bpf/syncookie.h); nil
	// in pins of an xlimit from before it.
	refusedReset *ebpf.Map
	// link holds the attachment's cookie offset and MSS, answer the
	// answering classes (bpf/answer.h); nil in pins from before them.
	link, answer *ebpf.Map
}

func (o *Objects) cookieMaps() *cookieMaps {
	m := &o.objs.xdpMaps
	return &cookieMaps{cfg: m.XlCookieCfg, state: m.XlCookieState, stats: m.XlCookieStats, toSocket: m.XlCookieSock,
		refusedReset: m.XlCookieReset,
		link:         m.XlCookieLink, answer: m.XlAnswerStats}
}

// openCookieMaps opens the pinned cookie maps of dir; nil when absent.
func openCookieMaps(dir string, opts *ebpf.LoadPinOptions) (*cookieMaps, error) {
	if !pinned(dir, xdpMapXlCookieCfg) {
		return nil, nil
	}
	c := &cookieMaps{}
	if err := openPins(dir, opts,
		pin{name: xdpMapXlCookieCfg, dst: &c.cfg}, pin{name: xdpMapXlCookieState, dst: &c.state}, pin{name: xdpMapXlCookieStats, dst: &c.stats},
		pin{name: xdpMapXlCookieSock, dst: &c.toSocket, optional: true}, pin{name: xdpMapXlCookieReset, dst: &c.refusedReset, optional: true}, pin{name: xdpMapXlCookieLink, dst: &c.link, optional: true},
		pin{name: xdpMapXlAnswerStats, dst: &c.answer, optional: true},
	); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *cookieMaps) close() error {
	if c == nil {
		return nil
	}
	return closeMaps(c.cfg, c.state, c.stats, c.toSocket, c.refusedReset, c.link, c.answer)
}

// CookieOffsetMin and CookieOffsetMax bound the top byte of the cookie
// offset K (xl_cookie_link.offset): the kernel's cookie check accepts a
// cookie whose top byte, a minute counter, is the current minute or the
// one before; an offset whose top byte is in [64, 191] (plus the 4 * 63 of
// the highest slot, which can carry one into it) moves every cookie at
// least 62 minutes out of that window, in either direction, so neither
// side's cookie passes the other's check (bpf/syncookie.h,
// docs/dataplane.md "SYN cookies").
const (
	CookieOffsetMin = 64 << 24
	CookieOffsetMax = 192<<24 - 1
)

// newCookieOffset draws a random cookie offset in [CookieOffsetMin,
// CookieOffsetMax].
func newCookieOffset() (uint32, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("draw the cookie offset: %w", err)
	}
	return CookieOffsetMin + binary.LittleEndian.Uint32(b[:])%(CookieOffsetMax-CookieOffsetMin+1), nil
}

// CookieLink is the attachment's cookie settings (struct xl_cookie_link).
type CookieLink struct {
	Offset     uint32 // K, random per attachment (its pins)
	MSS4, MSS6 uint16 // what the SYN-ACKs announce: the interface's MTU - 40 and - 60
}

// CookieLink returns the attachment's cookie settings (zero in pins from
// before them).
func (t *Tables) CookieLink() (CookieLink, error) {
	if t.cookie == nil || t.cookie.link == nil {
		return CookieLink{}, nil
	}
	var v xdpXlCookieLink
	if err := t.cookie.link.Lookup(uint32(0), &v); err != nil {
		return CookieLink{}, fmt.Errorf("read cookie settings: %w", err)
	}
	return CookieLink{Offset: v.Offset, MSS4: v.Mss4, MSS6: v.Mss6}, nil
}

// MSSForMTU returns the MSS a SYN-ACK announces over IPv4 and IPv6 on an
// interface of the given MTU: the MTU less the IP and TCP headers (40 and
// 60 bytes), at least 88 and 1220 (IPv6's minimum MTU, 1280, less 60).
func MSSForMTU(mtu int) (mss4, mss6 uint16) {
	clamp := func(v, lo int) uint16 { return uint16(min(max(v, lo), 0xffff)) }
	return clamp(mtu-40, 88), clamp(mtu-60, 1220)
}

// SetCookieMTU makes the SYN-ACKs announce the MSS of an interface of MTU
// mtu (MSSForMTU), keeping the attachment's cookie offset (drawing it
// first when there is none). The daemon calls it at attach and on every
// link change (loader.Attachment.RefreshCookieLink).
func (t *Tables) SetCookieMTU(mtu int) error {
	l, err := t.CookieLink()
	if err != nil || t.cookie == nil || t.cookie.link == nil {
		return err
	}
	l.MSS4, l.MSS6 = MSSForMTU(mtu)
	return t.setCookieLink(l)
}

// setCookieLink writes l, with an offset drawn when it has none.
func (t *Tables) setCookieLink(l CookieLink) error {
	if l.Offset == 0 {
		var err error
		if l.Offset, err = newCookieOffset(); err != nil {
			return err
		}
	}
	v := xdpXlCookieLink{Offset: l.Offset, Mss4: l.MSS4, Mss6: l.MSS6}
	if err := t.cookie.link.Update(uint32(0), &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write cookie settings: %w", err)
	}
	return nil
}

func (t *Tables) writeCookies(gen uint32, p *dataplane.Plan) error {
	if t.cookie == nil {
		return nil
	}
	// Every attachment gets its cookie offset before a rule can answer
	// with a cookie; once drawn it stays (the pin keeps it).
	if t.cookie.link != nil {
		l, err := t.CookieLink()
		if err != nil {
			return err
		}
		if l.Offset == 0 {
			if err := t.setCookieLink(l); err != nil {
				return err
			}
		}
	}
	c := p.Cookies
	v := xdpXlCookieCfg{Rules: c.Rules, Mss4: c.MSS4, Mss6: c.MSS6}
	v.Budget.Mult, v.Budget.Tol = c.Budget.Mult, c.Budget.Tol
	if err := t.cookie.cfg.Update(gen, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write cookie settings: %w", err)
	}
	return nil
}

func (t *Tables) readCookies(gen uint32) (dataplane.Cookies, error) {
	if t.cookie == nil {
		return dataplane.Cookies{}, nil
	}
	var v xdpXlCookieCfg
	if err := t.cookie.cfg.Lookup(gen, &v); err != nil {
		return dataplane.Cookies{}, fmt.Errorf("read cookie settings: %w", err)
	}
	return dataplane.Cookies{
		Budget: dataplane.Bucket{Mult: v.Budget.Mult, Tol: v.Budget.Tol},
		Rules:  v.Rules, MSS4: v.Mss4, MSS6: v.Mss6,
	}, nil
}

// CookieCounters returns a slot's SYN cookie counters summed over CPUs
// (zero when the pins predate SYN cookies).
func (t *Tables) CookieCounters(slot int) (dataplane.CookieCounters, error) {
	var sum dataplane.CookieCounters
	if t.cookie == nil {
		return sum, nil
	}
	var per []xdpXlCookieCounters
	if err := t.cookie.stats.Lookup(uint32(slot), &per); err != nil {
		return sum, fmt.Errorf("read cookie counters %d: %w", slot, err)
	}
	for _, c := range per {
		sum.Add(dataplane.CookieCounters{
			Sent: c.Sent, OverBudget: c.OverBudget, NotLocal: c.NotLocal, Unanswerable: c.Unanswerable,
			Validated: c.Validated, Failed: c.Failed, Refused: c.Refused, AssignFailed: c.AssignFailed,
		})
	}
	for _, m := range []struct {
		m   *ebpf.Map
		dst *uint64
	}{{t.cookie.toSocket, &sum.ToSocket}, {t.cookie.refusedReset, &sum.RefusedReset}} {
		if m.m == nil {
			continue
		}
		var n []uint64
		if err := m.m.Lookup(uint32(slot), &n); err != nil {
			return sum, fmt.Errorf("read cookie counters %d: %w", slot, err)
		}
		for _, v := range n {
			*m.dst += v
		}
	}
	return sum, nil
}

// AnswerCounters returns a slot's answering classes (bpf/answer.h) summed
// over CPUs (zero when the pins predate them).
func (t *Tables) AnswerCounters(slot int) (dataplane.AnswerCounters, error) {
	var sum dataplane.AnswerCounters
	if t.cookie == nil || t.cookie.answer == nil {
		return sum, nil
	}
	var per []xdpXlAnswerCounters
	if err := t.cookie.answer.Lookup(uint32(slot), &per); err != nil {
		return sum, fmt.Errorf("read answer counters %d: %w", slot, err)
	}
	for _, c := range per {
		for i := range sum.Cookie {
			sum.Cookie[i] += c.Cookie[i]
			sum.Reset[i] += c.Reset[i]
		}
		sum.KernelCookie += c.KernelCookie
	}
	return sum, nil
}
