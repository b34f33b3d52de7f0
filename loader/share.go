//go:build linux

package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/maps"
)

// Sharing an interface with other XDP programs through libxdp's
// multi-program dispatcher (xdp-tools' lib/libxdp/protocol.org, version 2;
// the dispatcher is bpf/dispatcher.c). The kernel runs one XDP program per
// interface: the dispatcher, attached through netlink, which calls up to
// ten component programs in turn, each an freplace program pinned with its
// link under <bpffs>/xdp/dispatch-IFINDEX-DID/prog<N>-{prog,link}. Adding,
// upgrading or removing a component builds a new dispatcher with the new
// set, links every component to it, pins it, and swaps it for the old one
// in one netlink call (XDP_FLAGS_REPLACE with the old one's fd): traffic
// never sees an interface without its programs. xdp-loader, xdp-filter and
// every libxdp user do the same, under the same lock (flock on
// <bpffs>/xdp), so they and xlimit add and remove programs beside each
// other.

// Share says whether xlimit attaches through libxdp's dispatcher.
type Share string

const (
	// ShareAuto joins the dispatcher on the interface if there is one,
	// and attaches alone (a pinned bpf_link, as before) if not.
	ShareAuto Share = "auto"
	// ShareAlways attaches through a dispatcher, creating one if needed,
	// so that libxdp programs can be added after xlimit.
	ShareAlways Share = "always"
	// ShareNever attaches alone, and fails if a program is attached.
	ShareNever Share = "never"
)

// ParseShare parses a --xdp-share value.
func ParseShare(s string) (Share, error) {
	switch v := Share(s); v {
	case ShareAuto, ShareAlways, ShareNever:
		return v, nil
	}
	return "", fmt.Errorf("parse xdp share %q: want auto, always or never", s)
}

// SharePriority is xlimit's run priority in a dispatcher: the lowest runs
// first, and libxdp's default is 50, so xlimit runs before programs that
// do not say otherwise and hands them only what it passes.
const SharePriority = 10

// xlimitProgName is the kernel's name of xlimit's XDP program (bpf/xlimit.c),
// which tells its slot from the others.
const xlimitProgName = "xlimit_xdp"

const (
	xdpFlagsUpdateIfNoExist = 1 << 0
	xdpFlagsSKBMode         = 1 << 1
	xdpFlagsDrvMode         = 1 << 2
	xdpFlagsReplace         = 1 << 4
	iflaXDPExpectedFD       = 8
	xdpPass                 = 2
)

// SharedProgram is one slot of the dispatcher on an interface.
type SharedProgram struct {
	Slot     int      `json:"slot"`
	ID       uint32   `json:"id"`
	Name     string   `json:"name"`
	Priority uint32   `json:"priority"`
	Chain    []string `json:"chain_actions"` // the verdicts that run the next slot
	Xlimit   bool     `json:"xlimit,omitempty"`
}

var xdpActions = []string{"XDP_ABORTED", "XDP_DROP", "XDP_PASS", "XDP_TX", "XDP_REDIRECT"}

// component is a slot's program.
type component struct {
	prog   *ebpf.Program // this process's handle
	id     ebpf.ProgramID
	name   string
	prio   uint32
	chain  uint32 // 1<<action for each verdict that runs the next slot, with DispatcherRetval's bit
	flags  uint32 // BPF_F_XDP_HAS_FRAGS or 0
	xlimit bool
	added  bool // the one a shareTx adds (its program is commit's argument)
}

// onIface is the XDP program on an interface, and if it is a dispatcher,
// its components.
type onIface struct {
	prog         *ebpf.Program // nil: nothing attached
	id           ebpf.ProgramID
	name         string
	mode         Mode
	isDispatcher bool
	conf         maps.DispatcherConfig
	comps        []component
	dir          string
}

func (o *onIface) close() {
	if o.prog != nil {
		o.prog.Close()
	}
	for _, c := range o.comps {
		c.prog.Close()
	}
}

// libxdpDir is where libxdp pins dispatchers, and the directory it locks.
func libxdpDir(bpffs string) string { return filepath.Join(bpffs, "xdp") }

func dispatcherDir(bpffs string, ifindex int, id ebpf.ProgramID) string {
	return filepath.Join(libxdpDir(bpffs), fmt.Sprintf("dispatch-%d-%d", ifindex, id))
}

// lockLibxdp takes libxdp's lock (blocking: libxdp holds it only while it
// changes a dispatcher).
func lockLibxdp(bpffs string) (*os.File, error) {
	dir := libxdpDir(bpffs)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

// readIface reads what runs in XDP on ifindex.
func readIface(bpffs string, ifindex int) (*onIface, error) {
	o := &onIface{}
	nl, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("find interface %d: %w", ifindex, err)
	}
	x := nl.Attrs().Xdp
	if x == nil || !x.Attached || x.ProgId == 0 {
		return o, nil
	}
	o.id, o.mode = ebpf.ProgramID(x.ProgId), currentMode(ifindex)
	if o.prog, err = ebpf.NewProgramFromID(o.id); err != nil {
		if errors.Is(err, unix.EPERM) {
			err = fmt.Errorf("%w (reading a program by its id, as sharing the interface through libxdp's dispatcher needs, takes CAP_SYS_ADMIN)", err)
		}
		return nil, fmt.Errorf("open XDP program %d on interface %d: %w", o.id, ifindex, err)
	}
	if info, err := o.prog.Info(); err == nil {
		o.name = info.Name
	}
	o.conf, err = maps.ReadDispatcherConfig(o.prog)
	if errors.Is(err, maps.ErrNotDispatcher) {
		return o, nil
	}
	if err != nil {
		o.close()
		return nil, fmt.Errorf("read the libxdp dispatcher %d on interface %d: %w", o.id, ifindex, err)
	}
	o.isDispatcher, o.dir = true, dispatcherDir(bpffs, ifindex, o.id)
	for i := range int(o.conf.NumProgsEnabled) {
		pin := filepath.Join(o.dir, fmt.Sprintf("prog%d-prog", i))
		p, err := ebpf.LoadPinnedProgram(pin, nil)
		if err != nil {
			o.close()
			return nil, fmt.Errorf("read slot %d of the dispatcher on interface %d: %w", i, ifindex, err)
		}
		c := component{prog: p, prio: o.conf.RunPrios[i], chain: o.conf.ChainCallActions[i], flags: o.conf.ProgramFlags[i]}
		if info, err := p.Info(); err == nil {
			c.name = info.Name
			c.id, _ = info.ID()
		}
		c.xlimit = c.name == xlimitProgName
		o.comps = append(o.comps, c)
	}
	return o, nil
}

// shared lists the slots of a dispatcher.
func (o *onIface) shared() []SharedProgram {
	var out []SharedProgram
	for i, c := range o.comps {
		s := SharedProgram{Slot: i, ID: uint32(c.id), Name: c.name, Priority: c.prio, Xlimit: c.xlimit}
		for a, n := range xdpActions {
			if c.chain&(1<<a) != 0 {
				s.Chain = append(s.Chain, n)
			}
		}
		out = append(out, s)
	}
	return out
}

// foreignError says that a program other than a dispatcher holds iface,
// and what to do.
func foreignError(iface string, o *onIface) error {
	return fmt.Errorf("%s already runs XDP program %d (%s), attached without libxdp's dispatcher, and XDP runs one program per interface: "+
		"either remove it (ip link set dev %s xdp off, or the tool that attached it) and run xlimit again, "+
		"or load it with xdp-loader (xdp-tools) so that xlimit joins libxdp's dispatcher beside it (--xdp-share auto or always)",
		iface, o.id, o.name, iface)
}

// shareTx is a change of the dispatcher on an interface, under libxdp's
// lock: the new set of components and the dispatcher that runs them.
type shareTx struct {
	bpffs   string
	ifindex int
	mode    Mode
	lock    *os.File
	on      *onIface
	comps   []component // in slot order
	slot    int         // xlimit's slot, -1 when it leaves
	disp    *ebpf.Program
}

// xlimitComponent is xlimit's slot: at SharePriority, chaining on XDP_PASS.
func xlimitComponent() *component {
	return &component{name: xlimitProgName, prio: SharePriority, chain: 1<<xdpPass | 1<<maps.DispatcherRetval, xlimit: true}
}

// beginShare plans the dispatcher of ifindex with add in a new slot
// (xlimitComponent, which replaces xlimit's slot if there is one, to join
// or upgrade; nil to take xlimit's slot out), and loads that dispatcher;
// tx.slot is add's slot.
func beginShare(bpffs string, ifindex int, mode Mode, add *component) (_ *shareTx, err error) {
	tx := &shareTx{bpffs: bpffs, ifindex: ifindex, mode: mode, slot: -1}
	defer func() {
		if err != nil {
			tx.close()
		}
	}()
	if tx.lock, err = lockLibxdp(bpffs); err != nil {
		return nil, err
	}
	if tx.on, err = readIface(bpffs, ifindex); err != nil {
		return nil, err
	}
	if tx.on.prog != nil && !tx.on.isDispatcher {
		return nil, errForeign // it changed since the caller looked
	}
	if tx.on.prog != nil {
		tx.mode = tx.on.mode
	}
	for _, c := range tx.on.comps {
		if !c.xlimit || (add != nil && !add.xlimit) {
			tx.comps = append(tx.comps, c)
		}
	}
	if add != nil {
		a := *add
		a.added = true
		tx.comps = append(tx.comps, a)
	}
	if len(tx.comps) > maps.DispatcherSlots {
		return nil, fmt.Errorf("the dispatcher on interface %d has no free slot (%d programs)", ifindex, maps.DispatcherSlots)
	}
	if len(tx.comps) == 0 {
		return tx, nil
	}
	var conf maps.DispatcherConfig
	tx.comps, conf = planSlots(tx.comps)
	for i, c := range tx.comps {
		if c.added {
			tx.slot = i
		}
	}
	if tx.disp, err = maps.LoadDispatcher(conf); err != nil {
		return nil, err
	}
	return tx, nil
}

// extension is where xlimit's program is to be loaded.
func (tx *shareTx) extension() *maps.Extension {
	return &maps.Extension{Target: tx.disp, Func: fmt.Sprintf("prog%d", tx.slot)}
}

// commit links each component to the new dispatcher (xl in the added
// slot), pins them, and swaps the new dispatcher for the old one on the
// interface, or removes the old one when no component is left. It returns
// xlimit's link to the dispatcher.
func (tx *shareTx) commit(xl *ebpf.Program) (_ link.Link, err error) {
	if len(tx.comps) == 0 {
		if tx.on.prog == nil {
			return nil, nil
		}
		if err := setXDP(tx.ifindex, -1, modeFlags(tx.mode), tx.on.prog); err != nil {
			return nil, fmt.Errorf("remove the dispatcher from interface %d: %w", tx.ifindex, err)
		}
		tx.removeOld()
		return nil, nil
	}
	info, err := tx.disp.Info()
	if err != nil {
		return nil, fmt.Errorf("read dispatcher info: %w", err)
	}
	did, _ := info.ID()
	dir := dispatcherDir(tx.bpffs, tx.ifindex, did)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	var links []link.Link
	defer func() {
		for _, l := range links {
			l.Close()
		}
		if err != nil {
			_ = os.RemoveAll(dir) // unpins
		}
	}()
	var mine link.Link
	for i, c := range tx.comps {
		p := c.prog
		if c.added {
			p = xl
		}
		l, err := link.AttachFreplace(tx.disp, fmt.Sprintf("prog%d", i), p)
		if err != nil {
			return nil, fmt.Errorf("link %s to slot %d of the new dispatcher: %w", c.name, i, err)
		}
		links = append(links, l)
		if err := l.Pin(filepath.Join(dir, fmt.Sprintf("prog%d-link", i))); err != nil {
			return nil, fmt.Errorf("pin slot %d's link: %w", i, err)
		}
		if err := pinProgram(p, filepath.Join(dir, fmt.Sprintf("prog%d-prog", i))); err != nil {
			return nil, err
		}
		if c.added {
			mine = l
		}
	}
	flags := modeFlags(tx.mode)
	if tx.on.prog != nil {
		err = setXDP(tx.ifindex, tx.disp.FD(), flags, tx.on.prog)
	} else if tx.mode == ModeAuto || tx.mode == "" {
		if err = setXDP(tx.ifindex, tx.disp.FD(), xdpFlagsDrvMode, nil); err != nil {
			if gerr := setXDP(tx.ifindex, tx.disp.FD(), xdpFlagsSKBMode, nil); gerr != nil {
				err = errors.Join(fmt.Errorf("native: %w", err), fmt.Errorf("generic: %w", gerr))
			} else {
				err = nil
			}
		}
	} else {
		err = setXDP(tx.ifindex, tx.disp.FD(), flags, nil)
	}
	if err != nil {
		return nil, fmt.Errorf("attach the dispatcher to interface %d: %w", tx.ifindex, err)
	}
	tx.removeOld()
	// The returned link is the added program's handle; the others close here.
	for i, l := range links {
		if l == mine {
			links = append(links[:i], links[i+1:]...)
			break
		}
	}
	return mine, nil
}

// removeOld unpins the dispatcher that was replaced: its links go, and
// with them the dispatcher.
func (tx *shareTx) removeOld() {
	if tx.on.isDispatcher {
		_ = os.RemoveAll(tx.on.dir)
	}
}

func (tx *shareTx) close() {
	if tx.on != nil {
		tx.on.close()
	}
	if tx.disp != nil {
		tx.disp.Close()
	}
	if tx.lock != nil {
		tx.lock.Close()
	}
}

// pinProgram pins p at path through a new handle (a handle that is pinned
// already would be moved, and its old pin is the old dispatcher's).
func pinProgram(p *ebpf.Program, path string) error {
	info, err := p.Info()
	if err != nil {
		return fmt.Errorf("read program info: %w", err)
	}
	id, _ := info.ID()
	fresh, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return fmt.Errorf("open program %d: %w", id, err)
	}
	defer fresh.Close()
	if err := fresh.Pin(path); err != nil {
		return fmt.Errorf("pin program %d: %w", id, err)
	}
	return nil
}

func modeFlags(m Mode) uint32 {
	switch m {
	case ModeNative:
		return xdpFlagsDrvMode
	case ModeGeneric:
		return xdpFlagsSKBMode
	}
	return 0
}

// setXDP attaches fd (-1: nothing) to ifindex through netlink; with
// expected, only if expected is the program attached (XDP_FLAGS_REPLACE),
// else only if none is (XDP_FLAGS_UPDATE_IF_NOEXIST).
func setXDP(ifindex, fd int, flags uint32, expected *ebpf.Program) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	attr := nl.NewRtAttr(unix.IFLA_XDP|unix.NLA_F_NESTED, nil)
	attr.AddRtAttr(nl.IFLA_XDP_FD, nl.Uint32Attr(uint32(int32(fd))))
	if expected != nil {
		flags |= xdpFlagsReplace
		attr.AddRtAttr(iflaXDPExpectedFD, nl.Uint32Attr(uint32(expected.FD())))
	} else if fd >= 0 {
		flags |= xdpFlagsUpdateIfNoExist
	}
	attr.AddRtAttr(nl.IFLA_XDP_FLAGS, nl.Uint32Attr(flags))
	req.AddData(attr)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("set XDP program: %w", err)
	}
	return nil
}

// startShare decides how Attach attaches: alone (nil) or in a slot of
// libxdp's dispatcher (a change begun, holding libxdp's lock).
func startShare(iface string, ifindex int, dir string, opts Options) (*shareTx, error) {
	if _, err := os.Stat(filepath.Join(dir, linkPin)); err == nil {
		if opts.Share == ShareAlways {
			return nil, fmt.Errorf("xlimit is attached to %s alone (a pinned bpf_link, which libxdp cannot replace): run `xlimit detach --iface %s`, then xlimit with --xdp-share always", iface, iface)
		}
		return nil, nil // the pinned link is updated in place, as ever
	}
	on, err := readIface(opts.BPFFS, ifindex)
	if err != nil {
		return nil, err
	}
	defer on.close()
	switch {
	case on.isDispatcher && opts.Share != ShareNever, on.prog == nil && opts.Share == ShareAlways:
		tx, err := beginShare(opts.BPFFS, ifindex, opts.Mode, xlimitComponent())
		if errors.Is(err, errForeign) {
			return nil, fmt.Errorf("%s: %w", iface, err)
		}
		return tx, err
	case on.isDispatcher:
		return nil, fmt.Errorf("%s runs libxdp's dispatcher (program %d) and --xdp-share is never: run with --xdp-share auto to join it", iface, on.id)
	case on.prog != nil:
		return nil, foreignError(iface, on)
	}
	return nil, nil
}

// errForeign: beginShare found a program other than a dispatcher.
var errForeign = errors.New("a program other than libxdp's dispatcher is attached")

// leaveDispatcher takes xlimit's slot out of the dispatcher on iface, if
// it is in one: the other programs stay, in a new dispatcher swapped in,
// or the dispatcher goes when xlimit was its only program.
func leaveDispatcher(bpffs, iface string) error {
	if _, err := os.Stat(filepath.Join(PinDir(bpffs, iface), linkPin)); err == nil {
		return nil // attached alone, through its pinned link
	}
	nl, err := netlink.LinkByName(iface)
	if err != nil {
		return nil // the interface is gone, and its XDP with it
	}
	on, err := readIface(bpffs, nl.Attrs().Index)
	if err != nil {
		return fmt.Errorf("leave the dispatcher on %s: %w", iface, err)
	}
	in := false
	for _, c := range on.comps {
		in = in || c.xlimit
	}
	on.close()
	if !in {
		return nil
	}
	tx, err := beginShare(bpffs, nl.Attrs().Index, "", nil)
	if err != nil {
		return fmt.Errorf("leave the dispatcher on %s: %w", iface, err)
	}
	defer tx.close()
	l, err := tx.commit(nil)
	if err != nil {
		return fmt.Errorf("leave the dispatcher on %s: %w", iface, err)
	}
	if l != nil {
		l.Close()
	}
	return nil
}

// inspectShared is Inspect for an interface where xlimit is in a slot of
// libxdp's dispatcher (or not attached at all).
func inspectShared(bpffs, iface string) (LinkState, error) {
	nl, err := netlink.LinkByName(iface)
	if err != nil {
		return LinkState{}, nil
	}
	on, err := readIface(bpffs, nl.Attrs().Index)
	if err != nil {
		return LinkState{}, fmt.Errorf("inspect %s: %w", iface, err)
	}
	defer on.close()
	if !on.isDispatcher {
		return LinkState{}, nil
	}
	st := LinkState{Dispatcher: uint32(on.id), Shared: on.shared()}
	for i, c := range on.comps {
		if !c.xlimit {
			continue
		}
		st.Pinned, st.Attached, st.Ifindex, st.ProgramID = true, true, nl.Attrs().Index, uint32(c.id)
		if l, err := link.LoadPinnedLink(filepath.Join(on.dir, fmt.Sprintf("prog%d-link", i)), nil); err == nil {
			if info, err := l.Info(); err == nil {
				st.LinkID = uint32(info.ID)
			}
			l.Close()
		}
	}
	return st, nil
}

// FreplaceSupported loads a one-slot dispatcher and xlimit's program as
// an freplace program for its slot (no pins), and says why not if the
// kernel refuses: libxdp's dispatcher needs freplace (BPF trampolines),
// which some kernels and hypervisors do not allow (EPERM) while plain XDP
// works. libxdp itself then falls back to attaching one program alone.
func FreplaceSupported() error {
	var conf maps.DispatcherConfig
	conf.NumProgsEnabled = 1
	conf.ChainCallActions[0] = 1<<xdpPass | 1<<maps.DispatcherRetval
	disp, err := maps.LoadDispatcher(conf)
	if err != nil {
		return err
	}
	defer disp.Close()
	o, err := maps.Load(maps.Options{Extend: &maps.Extension{Target: disp, Func: "prog0"}})
	if err != nil {
		return fmt.Errorf("load xlimit's program into a dispatcher slot: %w", err)
	}
	return o.Close()
}

// planSlots orders comps as libxdp does (by priority, then by name) and
// returns the dispatcher's configuration for them.
func planSlots(comps []component) ([]component, maps.DispatcherConfig) {
	sort.SliceStable(comps, func(i, j int) bool {
		if comps[i].prio != comps[j].prio {
			return comps[i].prio < comps[j].prio
		}
		return comps[i].name < comps[j].name
	})
	conf := maps.DispatcherConfig{NumProgsEnabled: uint8(len(comps))}
	for i, c := range comps {
		conf.ChainCallActions[i], conf.RunPrios[i], conf.ProgramFlags[i] = c.chain|1<<maps.DispatcherRetval, c.prio, c.flags
	}
	return comps, conf
}
