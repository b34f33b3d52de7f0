//go:build linux

package loader

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/tests/kit/frame"
	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// oldRelease is the XDP object of 2392467, whose xl_config, xl_limits,
// xl_caches and xl_stats had other layouts (maps/layouts).
const oldRelease = "xdp-2392467.o"

// attachOldRelease attaches the old release's program to the server's
// interface through a pinned link, its maps pinned, as its daemon did, and
// counts n frames in its counters.
func attachOldRelease(t *testing.T, l *lab.Lab, bpffs string, n int) (linkID link.ID) {
	t.Helper()
	dir := PinDir(bpffs, l.ServerIf)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	obj, err := maps.EarlierObject(oldRelease)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(obj))
	if err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}})
	if err != nil {
		t.Fatalf("load the old release: %v", err)
	}
	defer coll.Close()
	pkt := frame.MustBuild(frame.Spec{Src: l.ClientIP4, Dst: l.ServerIP4, Proto: 17, DstPort: 53})
	if _, err := coll.Programs["xlimit_xdp"].Run(&ebpf.RunOptions{Data: pkt, Repeat: uint32(n)}); err != nil {
		t.Fatal(err)
	}
	err = l.Server.Do(func() error {
		nl, err := netlink.LinkByName(l.ServerIf)
		if err != nil {
			return err
		}
		ln, err := attach(coll.Programs["xlimit_xdp"], nl.Attrs().Index, ModeGeneric)
		if err != nil {
			return err
		}
		defer ln.Close()
		info, err := ln.Info()
		if err != nil {
			return err
		}
		linkID = info.ID
		return ln.Pin(filepath.Join(dir, linkPin))
	})
	if err != nil {
		t.Fatal(err)
	}
	return linkID
}

// TestMigrateAcrossLayouts: Attach over the pins of a release whose map
// layouts differ migrates them in place: the same link, its program
// swapped, the counters carried, the pins this version's. A daemon killed
// at any step of the migration leaves a program on the interface (the old
// one before the swap, the new one after) and a state that the next
// Attach completes.
func TestMigrateAcrossLayouts(t *testing.T) {
	const counted = 100
	for _, step := range []string{"", "loaded", "converted", "pinned", "swapped", "half-committed"} {
		name := step
		if name == "" {
			name = "no crash"
		}
		t.Run(name, func(t *testing.T) {
			l, bpffs := setup(t)
			dir := PinDir(bpffs, l.ServerIf)
			linkID := attachOldRelease(t, l, bpffs, counted)
			before, _ := Inspect(bpffs, l.ServerIf)

			crash := step
			if crash == "half-committed" {
				crash = "swapped"
			}
			testCrash = func(s string) bool { return s == crash }
			defer func() { testCrash = nil }()
			a, err := attachIn(t, l, bpffs, ModeGeneric)
			if step == "" {
				if err != nil {
					t.Fatal(err)
				}
				if len(a.Migrated) == 0 || !a.Adopted {
					t.Errorf("migrated %v, adopted %v: want a migration of the adopted link", a.Migrated, a.Adopted)
				}
				for _, r := range a.Migrated {
					t.Logf("%s", r)
				}
				a.Close()
			} else if !errors.Is(err, errTestCrash) {
				t.Fatalf("attach killed at %q: %v", step, err)
			}
			testCrash = nil
			mid, err := Inspect(bpffs, l.ServerIf)
			if err != nil || !mid.Attached || mid.LinkID != before.LinkID {
				t.Fatalf("after the kill at %q: link %+v, %v; want the same link attached", step, mid, err)
			}
			swapped := step == "" || step == "swapped" || step == "half-committed"
			if (mid.ProgramID != before.ProgramID) != swapped {
				t.Errorf("after the kill at %q the link runs program %d (was %d): swapped %v, want %v", step, mid.ProgramID, before.ProgramID, mid.ProgramID != before.ProgramID, swapped)
			}
			if step == "half-committed" {
				// Some of the staged pins were moved before the kill.
				stage := filepath.Join(dir, migratingDir)
				ents, err := os.ReadDir(stage)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range ents[:len(ents)/2] {
					if err := os.Rename(filepath.Join(stage, e.Name()), filepath.Join(dir, e.Name())); err != nil {
						t.Fatal(err)
					}
				}
			}

			b, err := attachIn(t, l, bpffs, ModeGeneric)
			if err != nil {
				t.Fatalf("the next attach after the kill at %q: %v", step, err)
			}
			defer b.Close()
			if b.Resumed != (step == "swapped" || step == "half-committed") {
				t.Errorf("resumed %v after the kill at %q", b.Resumed, step)
			}
			if migrated := len(b.Migrated) > 0; migrated != (step == "loaded" || step == "converted" || step == "pinned") {
				t.Errorf("the next attach migrated %v after the kill at %q", migrated, step)
			}
			st, _ := Inspect(bpffs, l.ServerIf)
			if !b.Adopted || st.LinkID != before.LinkID || uint32(linkID) != st.LinkID {
				t.Errorf("the next attach: adopted %v, link %d (was %d)", b.Adopted, st.LinkID, before.LinkID)
			}
			if _, err := os.Stat(filepath.Join(dir, migratingDir)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the staging directory is left: %v", err)
			}
			g, err := b.Tables().Counters(dataplane.GlobalSlot)
			if err != nil {
				t.Fatal(err)
			}
			if p := g.Packets[dataplane.VerdictPass]; p < counted {
				t.Errorf("the global slot counts %d packets passed, want the old program's %d at least", p, counted)
			}
			// The pins are this version's now: the maps load as they are.
			o, err := maps.Load(maps.Options{PinDir: dir})
			if err != nil {
				t.Fatalf("load over the migrated pins: %v", err)
			}
			o.Close()
			ents, _ := os.ReadDir(dir)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			for _, want := range maps.PinnedNames() {
				if !slices.Contains(names, want) {
					t.Errorf("pin %s missing after the migration: %v", want, names)
				}
			}
		})
	}
}

// TestDetachDuringMigration: detach after a daemon died in a migration
// removes everything, the staging directory and its pins included.
func TestDetachDuringMigration(t *testing.T) {
	l, bpffs := setup(t)
	attachOldRelease(t, l, bpffs, 1)
	testCrash = func(s string) bool { return s == "converted" }
	defer func() { testCrash = nil }()
	if _, err := attachIn(t, l, bpffs, ModeGeneric); !errors.Is(err, errTestCrash) {
		t.Fatalf("attach killed in the migration: %v", err)
	}
	testCrash = nil
	dir := PinDir(bpffs, l.ServerIf)
	if _, err := os.Stat(filepath.Join(dir, migratingDir)); err != nil {
		t.Fatalf("no staging directory after the kill: %v", err)
	}
	if err := Detach(bpffs, l.ServerIf); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory left after detach: %v", err)
	}
	if st, err := Inspect(bpffs, l.ServerIf); err != nil || st.Pinned {
		t.Errorf("after detach: %+v, %v", st, err)
	}
}
