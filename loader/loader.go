//go:build linux

// Package loader attaches xlimit's XDP program to interfaces and keeps it
// there: it loads the program, pins maps and the bpf_link under
// <bpffs>/xlimit/<iface>/, adopts what an earlier daemon pinned (bucket
// state and counters included), replaces the program atomically on
// upgrade, and detaches only when asked.
package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/loader/preflight"
	"github.com/xlimit/xlimit/maps"
)

// Mode is how the program is attached.
type Mode string

const (
	ModeAuto    Mode = "auto"    // native, falling back to generic
	ModeNative  Mode = "native"  // in the driver (XDP_FLAGS_DRV_MODE)
	ModeGeneric Mode = "generic" // in the stack, any driver (XDP_FLAGS_SKB_MODE)
)

// ParseMode parses a --xdp-mode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeAuto, ModeNative, ModeGeneric:
		return m, nil
	}
	return "", fmt.Errorf("parse xdp mode %q: want auto, native or generic", s)
}

// DefaultBPFFS is where bpffs is normally mounted.
const DefaultBPFFS = "/sys/fs/bpf"

// ErrLocked is returned when another process holds an interface's pins.
var ErrLocked = errors.New("another xlimit process manages this interface")

const linkPin = "link"

// PinDir is the directory of an interface's pins.
func PinDir(bpffs, iface string) string {
	return filepath.Join(bpffs, "xlimit", iface)
}

// Options for Attach.
type Options struct {
	BPFFS string // default DefaultBPFFS
	Mode  Mode   // default ModeAuto
	// SourceTableSize is the per-source LRU size (0: the default 65536).
	SourceTableSize int
	// Cgroup is the cgroup v2 directory whose sockets the connection
	// counter sees (default: the root of the cgroup2 mount, CgroupRoot).
	Cgroup string
	// Fill, when not nil, runs once the maps are loaded (new or adopted)
	// and before the program is attached to the interface or replaces
	// the one attached: it writes the rules, so that a fresh attach
	// enforces them from its first packet, never an empty program.
	Fill func(t *maps.Tables) error
	// NoXDPTx loads the program with XDP_TX compiled out whatever the
	// preflight says (maps.Options.NoXDPTx).
	NoXDPTx bool
	// Share says whether to attach through libxdp's multi-program
	// dispatcher, beside other XDP programs (share.go; default ShareAuto).
	Share Share
}

// Attachment is the program attached to one interface, with its pinned
// maps and link. Close releases this process's handles; the pins keep the
// program attached and enforcing.
type Attachment struct {
	Iface   string
	Ifindex int
	Dir     string
	// Mode is the attach mode in force (native or generic).
	Mode Mode
	// Adopted reports that a pinned link from an earlier daemon was found
	// and its program replaced in place, with no gap and no reset.
	Adopted bool
	// SourcesReset reports that the per-source table was re-created at a
	// new size (its buckets start afresh; nothing else does).
	SourcesReset bool
	// ConnCountErr, when not nil, says why connections in flight are not
	// counted (the sock_ops program is not attached): concurrency limits
	// then never refuse a connection. Everything else works.
	ConnCountErr error
	// Migrated, when not nil, says what became of each pinned map: the
	// pins were of an xlimit whose map layouts differ, and were carried
	// into this one's (migrate.go). Resumed: a migration that a daemon
	// left half-done was completed first.
	Migrated []maps.MapReport
	Resumed  bool
	// RespTimeErr, when not nil, says why responses are not timed (the TC
	// egress program is not attached, resptime.go): rules with signal
	// response_time are then refused. Everything else works.
	RespTimeErr error
	// Shared reports that the program runs in a slot of libxdp's
	// dispatcher on the interface, beside other XDP programs (share.go).
	Shared bool

	// HostAddrs is what the last refresh of xl_host_addrs did (Attach's,
	// then RefreshHostAddrs'): how many addresses are listed, how many did
	// not fit, and why it failed if it did. Attach does not fail for it.
	HostAddrs HostAddrsState

	// CookieErr, when not nil, says why rules with syn_cookies cannot run
	// here (the TC program of their ACK side is not attached; cookie.go).
	CookieErr error

	// Preflight is what the driver's preflight decided for the interface
	// (preflight.go): with Preflight.XDPTx false the program was loaded
	// with XDP_TX compiled out. PreflightErr says why the facts could not
	// be read (XDP_TX is then avoided).
	Preflight    preflight.Decision
	PreflightErr error

	noTx     bool        // the program was loaded with XDP_TX compiled out
	cookies  *tcxProgram // the SYN cookies' ACK check (cookie.go)
	respTime *tcxProgram // the response timer (resptime.go)
	requests *tcxProgram // the request refusal (resptime.go)
	objs     *maps.Objects
	link     link.Link
	sockOps  link.Link
	lock     *os.File
}

// Attach loads the program for iface, adopting pinned maps, and attaches it
// through a pinned bpf_link, or updates the pinned link in place.
func Attach(iface string, opts Options) (_ *Attachment, err error) {
	if opts.BPFFS == "" {
		opts.BPFFS = DefaultBPFFS
	}
	if opts.Mode == "" {
		opts.Mode = ModeAuto
	}
	if opts.Share == "" {
		opts.Share = ShareAuto
	}
	nl, err := netlink.LinkByName(iface)
	if err != nil {
		return nil, fmt.Errorf("find interface %s: %w", iface, err)
	}
	a := &Attachment{Iface: iface, Ifindex: nl.Attrs().Index, Dir: PinDir(opts.BPFFS, iface)}
	defer func() {
		if err != nil {
			a.Close()
		}
	}()

	if err := EnsureBPFFS(opts.BPFFS); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(a.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("create pin directory: %w", err)
	}
	if a.lock, err = lockDir(a.Dir); err != nil {
		return nil, err
	}
	if a.Resumed, err = resumeMigration(a.Dir); err != nil {
		return nil, err
	}
	// Alone, or in a slot of libxdp's dispatcher (share.go): decided
	// before the load, since a slot's program is loaded for its slot.
	tx, err := startShare(iface, a.Ifindex, a.Dir, opts)
	if err != nil {
		return nil, err
	}
	var ext *maps.Extension
	if tx != nil {
		defer tx.close()
		ext = tx.extension()
	}
	// Maps pinned by an earlier daemon are adopted as they are, state and
	// all; pins of an xlimit whose layouts differ are migrated (the
	// program attached keeps enforcing until the swap).
	var mig *maps.Migration
	// preflight.go: whether the program may send frames back (XDP_TX) on
	// this driver, decided before it is loaded, as the attach itself may
	// run it (virtio_net re-enables NAPI inside the attach).
	a.Preflight, a.PreflightErr = Preflight(iface, opts.Mode)
	mopts := maps.Options{PinDir: a.Dir, SourceTableSize: opts.SourceTableSize, NoXDPTx: opts.NoXDPTx || !a.Preflight.XDPTx, Extend: ext}
	a.noTx = mopts.NoXDPTx
	a.objs, err = maps.Load(mopts)
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		mig, err = maps.LoadMigrating(mopts, filepath.Join(a.Dir, migratingDir))
		if err != nil {
			return nil, fmt.Errorf("migrate the maps pinned in %s to this version's layouts (the program attached keeps enforcing): %w", a.Dir, err)
		}
		a.objs = mig.Objects()
		defer func() {
			if mig != nil && err != nil && !errors.Is(err, errTestCrash) {
				// Before the swap: the old program and its pins stay.
				_ = mig.Abort()
			}
		}()
		mig.ConvertConfig()
		if err := crashAt("loaded"); err != nil {
			return nil, err
		}
	} else if err != nil {
		if tx != nil && errors.Is(err, unix.EPERM) {
			err = fmt.Errorf("%w: this kernel refuses freplace programs, which libxdp's dispatcher needs to run xlimit beside other XDP programs "+
				"(BPF trampolines; the same kernels refuse fentry); libxdp itself then attaches one program alone (docs/operations.md)", err)
		}
		return nil, err
	}
	a.SourcesReset = a.objs.SourcesReset
	prog := a.objs.Program()
	// hostaddrs.go: what the program may answer. A failure is no reason
	// not to enforce (a.HostAddrs.Err says it; the map is then marked
	// incomplete, hostaddrs.go).
	_, _ = a.RefreshHostAddrs()
	if err := a.RefreshCookieLink(); err != nil { // cookie.go: the cookies' offset and MSS
		return nil, err
	}
	if opts.Fill != nil {
		if err := opts.Fill(a.objs.Tables()); err != nil {
			return nil, fmt.Errorf("write the rules before attaching to %s: %w", iface, err)
		}
	}

	if mig != nil {
		// The state last, just before the swap: what the old program
		// changes after its copy is lost.
		mig.ConvertState()
		if err := crashAt("converted"); err != nil {
			return nil, err
		}
		if err := mig.PinProgram(); err != nil {
			return nil, err
		}
		if err := crashAt("pinned"); err != nil {
			return nil, err
		}
	}

	pin := filepath.Join(a.Dir, linkPin)
	if tx != nil {
		// One netlink call swaps the dispatcher with xlimit's slot for
		// the one on the interface: the other programs stay, and an
		// earlier xlimit's slot is replaced with no gap.
		for _, c := range tx.on.comps {
			a.Adopted = a.Adopted || c.xlimit
		}
		if a.link, err = tx.commit(prog); err != nil {
			return nil, fmt.Errorf("attach to %s through libxdp's dispatcher: %w", iface, err)
		}
		a.Shared = true
	} else if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		if sameInterface(l, a.Ifindex) {
			if err := l.Update(prog); err != nil {
				l.Close()
				return nil, fmt.Errorf("replace program on %s: %w", iface, err)
			}
			a.link, a.Adopted = l, true
		} else {
			// The interface was deleted (and maybe re-created): the
			// pinned link protects nothing any more.
			_ = l.Unpin()
			l.Close()
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("load pinned link %s: %w", pin, err)
	}

	if a.link == nil {
		if a.link, err = attach(prog, a.Ifindex, opts.Mode); err != nil {
			if on, rerr := readIface(opts.BPFFS, a.Ifindex); rerr == nil {
				if on.prog != nil && !on.isDispatcher {
					err = foreignError(iface, on)
				} else if on.prog != nil {
					err = fmt.Errorf("%s runs libxdp's dispatcher (program %d) and --xdp-share is never: run with --xdp-share auto to join it", iface, on.id)
				}
				on.close()
			}
			return nil, fmt.Errorf("attach to %s: %w", iface, err)
		}
		if err := a.link.Pin(pin); err != nil {
			return nil, fmt.Errorf("pin link: %w", err)
		}
	}
	a.Mode = currentMode(a.Ifindex)
	if mig != nil {
		// Swapped: from here on the staged maps are in use; a failure
		// leaves them for the next start to complete (resumeMigration).
		m := mig
		mig = nil
		if err := crashAt("swapped"); err != nil {
			return nil, err
		}
		if err := m.Commit(); err != nil {
			return nil, err
		}
		a.Migrated = m.Reports()
	}

	cgroup := opts.Cgroup
	if cgroup == "" {
		cgroup, a.ConnCountErr = CgroupRoot()
	}
	if a.ConnCountErr == nil {
		a.ConnCountErr = a.attachSockOps(a.objs.SockOps(), cgroup)
	}
	a.cookies, a.respTime = a.cookieCheck(), a.respTimer()
	a.CookieErr = a.cookies.attach(a.Ifindex)
	a.RespTimeErr = a.respTime.attach(a.Ifindex)
	if a.RespTimeErr == nil {
		a.requests = a.requestRefusal()
		a.RespTimeErr = a.requests.attach(a.Ifindex)
	}
	return a, nil
}

func attach(prog *ebpf.Program, ifindex int, mode Mode) (link.Link, error) {
	try := func(flags link.XDPAttachFlags) (link.Link, error) {
		return link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: flags})
	}
	switch mode {
	case ModeNative:
		return try(link.XDPDriverMode)
	case ModeGeneric:
		return try(link.XDPGenericMode)
	}
	l, err := try(link.XDPDriverMode)
	if err == nil {
		return l, nil
	}
	l, gerr := try(link.XDPGenericMode)
	if gerr != nil {
		return nil, errors.Join(fmt.Errorf("native: %w", err), fmt.Errorf("generic: %w", gerr))
	}
	return l, nil
}

func sameInterface(l link.Link, ifindex int) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	x := info.XDP()
	return x != nil && int(x.Ifindex) == ifindex
}

func currentMode(ifindex int) Mode {
	nl, err := netlink.LinkByIndex(ifindex)
	if err != nil || nl.Attrs().Xdp == nil {
		return ""
	}
	// IFLA_XDP_ATTACHED: 1 driver, 2 generic, 3 offloaded.
	switch nl.Attrs().Xdp.AttachMode {
	case 1:
		return ModeNative
	case 2:
		return ModeGeneric
	}
	return Mode(fmt.Sprintf("mode-%d", nl.Attrs().Xdp.AttachMode))
}

// Tables gives typed access to the attachment's maps.
func (a *Attachment) Tables() *maps.Tables { return a.objs.Tables() }

// ProgramID is the kernel's id of the attached program.
func (a *Attachment) ProgramID() (uint32, error) {
	info, err := a.objs.Program().Info()
	if err != nil {
		return 0, fmt.Errorf("read program info: %w", err)
	}
	id, _ := info.ID()
	return uint32(id), nil
}

// Close releases this process's handles and the lock. The pinned link
// keeps the program attached.
func (a *Attachment) Close() error {
	var errs []error
	if a.link != nil {
		errs = append(errs, a.link.Close())
		a.link = nil
	}
	if a.sockOps != nil {
		errs = append(errs, a.sockOps.Close())
		a.sockOps = nil
	}
	errs = append(errs, a.respTime.close())
	errs = append(errs, a.requests.close())
	errs = append(errs, a.cookies.close())
	if a.objs != nil {
		errs = append(errs, a.objs.Close())
		a.objs = nil
	}
	if a.lock != nil {
		errs = append(errs, a.lock.Close())
		a.lock = nil
	}
	return errors.Join(errs...)
}

// Detach removes xlimit from iface: it detaches the pinned link (even if a
// daemon still holds it), and removes every pin and the directory. It is
// the only way protection goes away. Interfaces that no longer exist are
// cleaned up too.
func Detach(bpffs, iface string) error {
	if bpffs == "" {
		bpffs = DefaultBPFFS
	}
	dir := PinDir(bpffs, iface)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("detach %s: nothing pinned in %s: %w", iface, dir, err)
	}
	var errs []error
	// In a slot of libxdp's dispatcher: the slot goes, the other programs
	// stay (share.go).
	errs = append(errs, leaveDispatcher(bpffs, iface))
	for _, pin := range []string{linkPin, sockOpsPin, respTimePin, requestsPin, cookiePin} {
		errs = append(errs, detachPinnedLink(filepath.Join(dir, pin)))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		errs = append(errs, fmt.Errorf("read %s: %w", dir, err))
	}
	for _, e := range entries {
		remove := os.Remove
		if e.IsDir() {
			remove = os.RemoveAll // a migration's staging directory
		}
		if err := remove(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("remove pin: %w", err))
		}
	}
	if err := os.Remove(dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", dir, err))
	}
	// Leave <bpffs>/xlimit when it is empty; other interfaces may remain.
	_ = os.Remove(filepath.Dir(dir))
	return errors.Join(errs...)
}

// Pinned lists the interfaces with pins under bpffs.
func Pinned(bpffs string) ([]string, error) {
	if bpffs == "" {
		bpffs = DefaultBPFFS
	}
	entries, err := os.ReadDir(filepath.Join(bpffs, "xlimit"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pinned interfaces: %w", err)
	}
	var ifaces []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ifaces = append(ifaces, e.Name())
		}
	}
	return ifaces, nil
}

// EnsureBPFFS mounts a bpffs at path unless one is mounted there already
// (inside `ip netns exec`, /sys has none).
func EnsureBPFFS(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return fmt.Errorf("create bpffs mount point %s: %w", path, err)
	}
	if err := unix.Mount("bpf", path, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", path, err)
	}
	return nil
}

// lockDir takes an exclusive, non-blocking lock on the pin directory so
// two daemons never manage one interface.
func lockDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("lock %s: %w", dir, ErrLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}

// LinkState describes the pinned link of an interface.
type LinkState struct {
	Pinned    bool
	Attached  bool // the link still holds an interface
	Ifindex   int
	ProgramID uint32
	LinkID    uint32
	// Dispatcher is the id of libxdp's dispatcher on the interface when
	// xlimit runs in one of its slots, and Shared lists its slots.
	Dispatcher uint32
	Shared     []SharedProgram
}

// Inspect reads the pinned link of iface without changing anything.
func Inspect(bpffs, iface string) (LinkState, error) {
	if bpffs == "" {
		bpffs = DefaultBPFFS
	}
	l, err := link.LoadPinnedLink(filepath.Join(PinDir(bpffs, iface), linkPin), nil)
	if errors.Is(err, os.ErrNotExist) {
		return inspectShared(bpffs, iface)
	}
	if err != nil {
		return LinkState{}, fmt.Errorf("load pinned link: %w", err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return LinkState{Pinned: true}, fmt.Errorf("read link info: %w", err)
	}
	st := LinkState{Pinned: true, ProgramID: uint32(info.Program), LinkID: uint32(info.ID)}
	if x := info.XDP(); x != nil && x.Ifindex != 0 {
		st.Attached, st.Ifindex = true, int(x.Ifindex)
	}
	return st, nil
}
