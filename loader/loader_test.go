//go:build linux

package loader

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

func setup(t *testing.T) (*lab.Lab, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates namespaces and attaches XDP (CI runs it as root)")
	}
	l, err := lab.New(lab.Options{Prefix: "xll"})
	if err != nil {
		t.Fatal(err)
	}
	bpffs := filepath.Join(t.TempDir(), "bpffs")
	if err := EnsureBPFFS(bpffs); err != nil {
		l.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = Detach(bpffs, l.ServerIf)
		if err := unix.Unmount(bpffs, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount: %v", err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	return l, bpffs
}

// attachIn attaches inside the lab's server namespace.
func attachIn(t *testing.T, l *lab.Lab, bpffs string, mode Mode) (*Attachment, error) {
	t.Helper()
	var a *Attachment
	err := l.Server.Do(func() error {
		var err error
		a, err = Attach(l.ServerIf, Options{BPFFS: bpffs, Mode: mode})
		return err
	})
	return a, err
}

// recreateIf deletes the interface name and creates it again under the
// same name (a new veth pair, up), in the namespace it runs in; it returns
// the new index.
func recreateIf(name string) (int, error) {
	nl, err := netlink.LinkByName(name)
	if err != nil {
		return 0, err
	}
	if err := netlink.LinkDel(nl); err != nil {
		return 0, err
	}
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(v); err != nil {
		return 0, err
	}
	if err := netlink.LinkSetUp(v); err != nil {
		return 0, err
	}
	if nl, err = netlink.LinkByName(name); err != nil {
		return 0, err
	}
	return nl.Attrs().Index, nil
}

func TestEnsureBPFFSIsIdempotent(t *testing.T) {
	_, bpffs := setup(t)
	if err := EnsureBPFFS(bpffs); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(bpffs, &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Fatalf("not a bpffs: %v %x", err, st.Type)
	}
}

func TestAttachLockAdoptDetach(t *testing.T) {
	l, bpffs := setup(t)
	a, err := attachIn(t, l, bpffs, ModeNative)
	if err != nil {
		t.Fatal(err)
	}
	if a.Adopted || a.Mode != ModeNative {
		t.Fatalf("first attach: adopted=%v mode=%q", a.Adopted, a.Mode)
	}
	// The driver's preflight reads the veth in the lab's namespace (through
	// the ethtool ioctl: this process's sysfs is the host's) and allows
	// XDP_TX there; the program is loaded with it.
	if a.PreflightErr != nil || !a.Preflight.XDPTx || a.noTx {
		t.Errorf("preflight on a veth: %s, err %v, loaded without XDP_TX %v; findings %v", a.Preflight.Summary(), a.PreflightErr, a.noTx, a.Preflight.Findings)
	}
	plan, err := dataplane.Compile(&dataplane.Spec{Rules: []dataplane.RuleSpec{{Name: "r", Protocol: "udp", Rate: 10, Burst: 1}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Tables().Apply(plan); err != nil {
		t.Fatal(err)
	}
	// Some state: run the attached program on a frame twice.
	pkt := frame.MustBuild(frame.Spec{Src: l.ClientIP4, Dst: l.ServerIP4, Proto: 17, DstPort: 53})
	for range 2 {
		if _, err := a.objs.Program().Run(&ebpf.RunOptions{Data: pkt}); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := a.Tables().Counters(0)
	first, _ := Inspect(bpffs, l.ServerIf)

	// A second process (here: attachment) is refused while the first lives.
	if _, err := attachIn(t, l, bpffs, ModeAuto); !errors.Is(err, ErrLocked) {
		t.Fatalf("second attach while the first holds the lock: %v, want ErrLocked", err)
	}
	oldProg, _ := a.ProgramID()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := Inspect(bpffs, l.ServerIf)
	if err != nil || !st.Attached {
		t.Fatalf("after Close the program must stay attached: %+v %v", st, err)
	}

	b, err := attachIn(t, l, bpffs, ModeAuto)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	newProg, _ := b.ProgramID()
	after, _ := b.Tables().Counters(0)
	st2, _ := Inspect(bpffs, l.ServerIf)
	if !b.Adopted || st2.LinkID != first.LinkID || newProg == oldProg || st2.ProgramID != newProg {
		t.Errorf("adopt: adopted=%v link %d->%d program %d->%d (link shows %d)", b.Adopted, first.LinkID, st2.LinkID, oldProg, newProg, st2.ProgramID)
	}
	if after != before || before.Packets[dataplane.VerdictPass]+before.Packets[dataplane.VerdictDrop] != 2 {
		t.Errorf("counters changed across adoption: %+v -> %+v", before.Packets, after.Packets)
	}
	p2, err := b.Tables().ReadPlan()
	if err != nil || p2.Slot("r") != 0 {
		t.Errorf("rules did not survive adoption: %v", err)
	}

	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Detach(bpffs, l.ServerIf); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(PinDir(bpffs, l.ServerIf)); !os.IsNotExist(err) {
		t.Errorf("pin directory left: %v", err)
	}
	err = l.Server.Do(func() error {
		nl, err := netlink.LinkByName(l.ServerIf)
		if err != nil {
			return err
		}
		if nl.Attrs().Xdp != nil && nl.Attrs().Xdp.Attached {
			t.Errorf("XDP program %d still attached after Detach", nl.Attrs().Xdp.ProgId)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A pinned link whose interface was deleted protects nothing: Attach to a
// new interface of the same name attaches afresh.
func TestAttachReplacesStaleLink(t *testing.T) {
	l, bpffs := setup(t)
	a, err := attachIn(t, l, bpffs, ModeAuto)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	old, _ := Inspect(bpffs, l.ServerIf)

	// Re-create the server's interface under the same name (a new veth
	// pair inside the server's namespace).
	err = l.Server.Do(func() error {
		_, err := recreateIf(l.ServerIf)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	stale, _ := Inspect(bpffs, l.ServerIf)
	if stale.Attached {
		t.Fatalf("link still attached after its interface was deleted: %+v", stale)
	}
	b, err := attachIn(t, l, bpffs, ModeGeneric)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	st, _ := Inspect(bpffs, l.ServerIf)
	if b.Adopted || !st.Attached || st.LinkID == old.LinkID || b.Mode != ModeGeneric {
		t.Errorf("re-attach: adopted=%v state %+v (old link %d) mode %q", b.Adopted, st, old.LinkID, b.Mode)
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"auto", "native", "generic"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseMode("offload"); err == nil {
		t.Error("ParseMode(offload): no error")
	}
}
