//go:build linux

package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"

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
	spec, err := loadTc()
	if err != nil {
		return nil, fmt.Errorf("load cookie spec: %w", err)
	}
	if fakeClock {
		if err := spec.Variables[tcVarXlCfgFakeClock].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("set fake clock: %w", err)
		}
	}
	repl := map[string]*ebpf.Map{}
	mv := reflect.ValueOf(&o.objs.xdpMaps).Elem()
	for i := range mv.NumField() {
		name := mv.Type().Field(i).Tag.Get("ebpf")
		if _, ok := spec.Maps[name]; ok && name != "" {
			repl[name] = mv.Field(i).Interface().(*ebpf.Map)
		}
	}
	for name := range spec.Maps {
		if _, ok := repl[name]; !ok && name[0] != '.' {
			return nil, fmt.Errorf("load cookie program: map %s is not the XDP object's", name)
		}
	}
	var objs struct {
		Prog *ebpf.Program `ebpf:"xlimit_tc_cookie"`
	}
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return nil, fmt.Errorf("%w: %v", ErrCookieKernel, err)
		}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load cookie program: %+v", ve)
		}
		return nil, fmt.Errorf("load cookie program: %w", err)
	}
	return &CookieProgram{prog: objs.Prog}, nil
}

// cookieMaps are the SYN cookies' maps of a Tables (nil in pins of an
// xlimit from before them).
type cookieMaps struct {
	cfg, state, stats *ebpf.Map
	// toSocket counts the SYNs left to a socket the host already had
	// (bpf/syncookie.h); nil in pins of an xlimit from before it.
	toSocket *ebpf.Map
}

func (o *Objects) cookieMaps() *cookieMaps {
	m := &o.objs.xdpMaps
	return &cookieMaps{cfg: m.XlCookieCfg, state: m.XlCookieState, stats: m.XlCookieStats, toSocket: m.XlCookieSock}
}

// openCookieMaps opens the pinned cookie maps of dir; nil when absent.
func openCookieMaps(dir string, opts *ebpf.LoadPinOptions) (*cookieMaps, error) {
	if _, err := os.Stat(filepath.Join(dir, xdpMapXlCookieCfg)); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	c := &cookieMaps{}
	for _, m := range []struct {
		name string
		dst  **ebpf.Map
	}{{xdpMapXlCookieCfg, &c.cfg}, {xdpMapXlCookieState, &c.state}, {xdpMapXlCookieStats, &c.stats}} {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(dir, m.name), opts)
		if err != nil {
			c.close()
			return nil, fmt.Errorf("open pinned map %s: %w", m.name, err)
		}
		*m.dst = mp
	}
	if mp, err := ebpf.LoadPinnedMap(filepath.Join(dir, xdpMapXlCookieSock), opts); err == nil {
		c.toSocket = mp
	} else if !errors.Is(err, os.ErrNotExist) {
		c.close()
		return nil, fmt.Errorf("open pinned map %s: %w", xdpMapXlCookieSock, err)
	}
	return c, nil
}

func (c *cookieMaps) close() error {
	if c == nil {
		return nil
	}
	var errs []error
	for _, m := range []*ebpf.Map{c.cfg, c.state, c.stats, c.toSocket} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// CookiePinNames are the pinned names of the cookie maps.
func CookiePinNames() []string {
	return []string{xdpMapXlCookieCfg, xdpMapXlCookieState, xdpMapXlCookieStats, xdpMapXlCookieSock}
}

func (t *Tables) writeCookies(gen uint32, p *dataplane.Plan) error {
	if t.cookie == nil {
		return nil
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
	if t.cookie.toSocket != nil {
		var n []uint64
		if err := t.cookie.toSocket.Lookup(uint32(slot), &n); err != nil {
			return sum, fmt.Errorf("read cookie counters %d: %w", slot, err)
		}
		for _, v := range n {
			sum.ToSocket += v
		}
	}
	return sum, nil
}
