//go:build linux

package maps

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// MapMemory is the memory of one pinned map.
type MapMemory struct {
	Name       string
	Type       string
	KeySize    uint32
	ValueSize  uint32
	MaxEntries uint32
	// Memlock is what the kernel says the map uses (the memlock of its
	// fdinfo: map_mem_usage on 5.19 and later, a cruder count before);
	// 0 when the kernel does not say.
	Memlock uint64
	// Estimate is dataplane.MapBytes for the map's geometry (and, for the
	// prefix tries, the entries in use).
	Estimate uint64
}

// PinnedMemory reports the memory of every map pinned in dir (whatever
// else is pinned there, such as links, is skipped), largest first.
func PinnedMemory(dir string) ([]MapMemory, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read map memory in %s: %w", dir, ErrNotPinned)
	}
	if err != nil {
		return nil, fmt.Errorf("read map memory: %w", err)
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("read map memory: %w", err)
	}
	var out []MapMemory
	for _, e := range ents {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, e.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			continue // not a map (the link, for one)
		}
		mm, err := mapMemory(m, ncpu)
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("read memory of %s: %w", e.Name(), err)
		}
		if mm.Name == "" {
			mm.Name = e.Name()
		}
		out = append(out, mm)
	}
	slices.SortStableFunc(out, func(a, b MapMemory) int {
		return cmp.Compare(max(b.Memlock, b.Estimate), max(a.Memlock, a.Estimate))
	})
	return out, nil
}

func mapMemory(m *ebpf.Map, ncpu int) (MapMemory, error) {
	mm := MapMemory{Type: m.Type().String(), KeySize: m.KeySize(), ValueSize: m.ValueSize(), MaxEntries: m.MaxEntries()}
	info, err := m.Info()
	if err != nil {
		return mm, err
	}
	mm.Name = info.Name
	if n, ok := info.Memlock(); ok {
		mm.Memlock = n
	}
	used := int(m.MaxEntries())
	kind := mapKind(m.Type())
	if kind == dataplane.MapHash && m.Flags()&unix.BPF_F_NO_PREALLOC != 0 {
		kind = dataplane.MapHashNoPrealloc
	}
	if kind == dataplane.MapLPMTrie || kind == dataplane.MapHashNoPrealloc {
		if used, err = countEntries(m); err != nil {
			return mm, err
		}
	}
	if kind == dataplane.MapArray && m.Flags()&unix.BPF_F_MMAPABLE != 0 {
		kind = dataplane.MapArrayMmap
	}
	mm.Estimate = dataplane.MapBytes(kind, m.KeySize(), m.ValueSize(), m.MaxEntries(), used, ncpu)
	return mm, nil
}

func mapKind(t ebpf.MapType) dataplane.MapKind {
	switch t {
	case ebpf.Array:
		return dataplane.MapArray
	case ebpf.PerCPUArray:
		return dataplane.MapPerCPUArray
	case ebpf.LRUHash:
		return dataplane.MapLRUHash
	case ebpf.Hash:
		return dataplane.MapHash
	case ebpf.LPMTrie:
		return dataplane.MapLPMTrie
	}
	return dataplane.MapOtherKind
}

func countEntries(m *ebpf.Map) (int, error) {
	key := make([]byte, m.KeySize())
	val := make([]byte, m.ValueSize())
	n := 0
	it := m.Iterate()
	for it.Next(&key, &val) {
		n++
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("count entries: %w", err)
	}
	return n, nil
}
