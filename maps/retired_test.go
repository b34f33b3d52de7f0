//go:build linux

package maps

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
)

// TestRetiredPinsRemoved: a load over an earlier version's pins removes
// the pins of maps this version no longer has (the per-source LRU and its
// front, issue 28), which nothing else would remove before `xlimit
// detach`; the maps themselves live on while a program holds them.
func TestRetiredPinsRemoved(t *testing.T) {
	requireRoot(t)
	pins := privatePinDir(t)
	var held []*ebpf.Map
	for _, name := range retiredPins {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Name: name, Type: ebpf.LRUHash, KeySize: 4, ValueSize: 8, MaxEntries: 16})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if err := m.Pin(filepath.Join(pins, name)); err != nil {
			t.Fatal(err)
		}
		held = append(held, m)
	}
	o, err := Load(Options{PinDir: pins})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	for i, name := range retiredPins {
		if _, err := os.Stat(filepath.Join(pins, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin %s still there after the load (%v)", name, err)
		}
		if err := held[i].Update(uint32(1), uint64(2), ebpf.UpdateAny); err != nil {
			t.Errorf("%s, held by its owner, stopped working: %v", name, err)
		}
	}
	for _, name := range []string{xdpMapXlSrcTable, xdpMapXlSrcExts} {
		if _, err := os.Stat(filepath.Join(pins, name)); err != nil {
			t.Errorf("pin %s missing: %v", name, err)
		}
	}
}
