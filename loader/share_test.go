//go:build linux

package loader

import (
	"errors"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/tests/kit/xdpcount"
)

// TestExtensionLoads: xlimit's program loads as an freplace program into a
// slot of bpf/dispatcher.c and links to it, as sharing the interface needs.
func TestExtensionLoads(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs")
	}
	requireFreplace(t)
	conf := maps.DispatcherConfig{NumProgsEnabled: 1}
	conf.ChainCallActions[0] = 1<<xdpPass | 1<<maps.DispatcherRetval
	disp, err := maps.LoadDispatcher(conf)
	if err != nil {
		t.Fatal(err)
	}
	defer disp.Close()
	o, err := maps.Load(maps.Options{Extend: &maps.Extension{Target: disp, Func: "prog0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	l, err := link.AttachFreplace(disp, "prog0", o.Program())
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	got, err := maps.ReadDispatcherConfig(disp)
	if err != nil || got.NumProgsEnabled != 1 || got.Magic != maps.DispatcherMagic {
		t.Fatalf("read back the dispatcher's config: %+v, %v", got, err)
	}
}

// TestSharePlanOrder: the slots run by priority, then by name (libxdp's
// order), xlimit at SharePriority before libxdp's default 50, and each
// slot's chain actions keep the dispatcher's own return value.
func TestSharePlanOrder(t *testing.T) {
	comps := []component{
		{name: "zfilter", prio: 50, chain: 1 << xdpPass},
		{name: "afilter", prio: 50, chain: 1 << xdpPass},
		{name: "first", prio: 5, chain: 1<<xdpPass | 1<<1},
		{name: xlimitProgName, prio: SharePriority, chain: 1 << xdpPass, xlimit: true},
	}
	got, conf := planSlots(comps)
	var names []string
	for _, c := range got {
		names = append(names, c.name)
	}
	want := []string{"first", xlimitProgName, "afilter", "zfilter"}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("slot order %v, want %v", names, want)
		}
	}
	if conf.NumProgsEnabled != 4 || conf.RunPrios[1] != SharePriority || conf.ChainCallActions[1] != 1<<xdpPass|1<<maps.DispatcherRetval || conf.ChainCallActions[0] != 1<<xdpPass|1<<1|1<<maps.DispatcherRetval {
		t.Errorf("config %+v", conf)
	}
}

func TestParseShare(t *testing.T) {
	for _, s := range []string{"auto", "always", "never"} {
		if v, err := ParseShare(s); err != nil || string(v) != s {
			t.Errorf("ParseShare(%q) = %q, %v", s, v, err)
		}
	}
	if _, err := ParseShare("yes"); err == nil {
		t.Errorf("ParseShare(yes) accepted")
	}
}

// TestShareSwap: on a veth, xlimit attaches through a dispatcher of its own
// (ShareAlways); another program joins as libxdp would (a slot at priority
// 50, added by the same protocol); a frame run through the dispatcher
// passes xlimit and reaches the other program; xlimit's upgrade (a second
// Attach) keeps the other program's slot and program; Detach leaves the
// other program alone on a dispatcher of its own.
func TestShareSwap(t *testing.T) {
	l, bpffs := setup(t)
	requireFreplace(t)
	t.Cleanup(func() {
		_ = l.Server.Do(func() error { return setXDP(l.ServerIndex, -1, 0, nil) })
	})
	attach := func() *Attachment {
		t.Helper()
		var a *Attachment
		err := l.Server.Do(func() error {
			var err error
			a, err = Attach(l.ServerIf, Options{BPFFS: bpffs, Share: ShareAlways})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	inspect := func() LinkState {
		t.Helper()
		var st LinkState
		if err := l.Server.Do(func() error {
			var err error
			st, err = Inspect(bpffs, l.ServerIf)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return st
	}
	a := attach()
	if !a.Shared {
		t.Fatalf("ShareAlways: not attached through a dispatcher")
	}
	a.Close()
	st := inspect()
	if !st.Attached || len(st.Shared) != 1 || !st.Shared[0].Xlimit {
		t.Fatalf("after the attach: %+v", st)
	}

	// The other program: tests/kit/xdpcount, loaded for its slot as libxdp
	// would load it.
	spec, err := xdpcount.Spec()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	var objs struct {
		Prog    *ebpf.Program `ebpf:"xdpcount"`
		Counter *ebpf.Map     `ebpf:"xdpcount_pkts"`
	}
	err = l.Server.Do(func() error {
		tx, err := beginShare(bpffs, l.ServerIndex, "", &component{name: "xdpcount", prio: 50, chain: 1 << xdpPass})
		if err != nil {
			return err
		}
		defer tx.close()
		p := spec.Programs["xdpcount"]
		p.Type, p.AttachType, p.AttachTarget, p.AttachTo = ebpf.Extension, ebpf.AttachNone, tx.disp, tx.extension().Func
		if err := spec.LoadAndAssign(&objs, nil); err != nil {
			return err
		}
		l, err := tx.commit(objs.Prog)
		if l != nil {
			l.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("add the other program: %v", err)
	}
	other, counter := objs.Prog, objs.Counter
	defer counter.Close()
	defer other.Close()
	otherInfo, _ := other.Info()
	otherID, _ := otherInfo.ID()
	st = inspect()
	t.Logf("dispatcher %d: %+v", st.Dispatcher, st.Shared)
	if len(st.Shared) != 2 || !st.Shared[0].Xlimit || st.Shared[1].ID != uint32(otherID) {
		t.Fatalf("after the other joined: want xlimit then other (id %d): %+v", otherID, st.Shared)
	}
	run := func() uint64 {
		t.Helper()
		disp, err := ebpf.NewProgramFromID(ebpf.ProgramID(st.Dispatcher))
		if err != nil {
			t.Fatal(err)
		}
		defer disp.Close()
		f := make([]byte, 64) // no rule matches: xlimit passes it
		ret, err := disp.Run(&ebpf.RunOptions{Data: f})
		if err != nil || ret != xdpPass {
			t.Fatalf("run the dispatcher: %d, %v", ret, err)
		}
		var per []uint64
		if err := counter.Lookup(uint32(0), &per); err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		return n
	}
	if n := run(); n != 1 {
		t.Errorf("the other program counted %d frames, want 1 (xlimit passed it on)", n)
	}

	// Upgrade: xlimit's slot is replaced, the other's kept.
	before := st
	a = attach()
	a.Close()
	st = inspect()
	if len(st.Shared) != 2 || st.Shared[1].ID != uint32(otherID) || st.Dispatcher == before.Dispatcher || st.ProgramID == before.ProgramID {
		t.Fatalf("after the upgrade: %+v (before %+v)", st, before)
	}
	if n := run(); n != 2 {
		t.Errorf("after the upgrade the other program counted %d frames, want 2", n)
	}

	// Detach: the other stays, alone in a new dispatcher.
	if err := l.Server.Do(func() error { return Detach(bpffs, l.ServerIf) }); err != nil {
		t.Fatal(err)
	}
	var on *onIface
	if err := l.Server.Do(func() error {
		var err error
		on, err = readIface(bpffs, l.ServerIndex)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer on.close()
	if !on.isDispatcher || len(on.comps) != 1 || on.comps[0].id != otherID {
		t.Fatalf("after xlimit's detach: want the other program alone in a dispatcher, got %+v", on.shared())
	}
}

// requireFreplace skips where the kernel refuses freplace programs (EPERM):
// sharing cannot work there, libxdp's included. Any other failure to load
// xlimit's program for a slot fails the test.
func requireFreplace(t *testing.T) {
	t.Helper()
	if err := FreplaceSupported(); errors.Is(err, unix.EPERM) {
		t.Skipf("SKIP, not a pass: this kernel refuses freplace programs, which sharing needs (libxdp falls back to one program alone here too): %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
}
