//go:build linux

package maps

import (
	"bytes"
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// A migration needs the layout of each pinned map it converts: the types
// of its key and value as the program that created it had them. The kernel
// keeps them (the map's BTF) but gives them out only with CAP_SYS_ADMIN,
// which the systemd unit does not grant. So the layouts are also kept with
// the pins: every load writes the key and value types of its pinned maps,
// as raw BTF, into one more pinned map, xl_layouts, which any later
// version reads with the capabilities it has. For pins of a version from
// before that record, the layouts of earlier versions are built in
// (layouts/*.o, their XDP objects) and matched by size. In that order:
// the record, the kernel (where permitted), the built-in layouts.

// layoutsPin is the pinned map of the record of layouts; it is not one of
// the program's maps.
const layoutsPin = "xl_layouts"

// layoutPrefix names the record's struct of a map: key, then value.
const layoutPrefix = "xl_layout__"

// kernelBTF: read the old maps' BTF from the kernel where permitted (tests
// turn it off to take the path of an unprivileged daemon).
var kernelBTF = true

//go:embed layouts/*.o
var builtinLayouts embed.FS

// EarlierObject returns the XDP object of an earlier version that is
// built in (layouts/, by file name such as "xdp-2392467.o"): the tests of
// a migration load it to pin maps of its layouts, and need no source tree.
func EarlierObject(name string) ([]byte, error) {
	return builtinLayouts.ReadFile("layouts/" + name)
}

// layout is a map's key and value types.
type layout struct {
	key, value btf.Type
	source     string
}

func (l layout) sizes() (int, int) {
	k, _ := btf.Sizeof(l.key)
	v, _ := btf.Sizeof(l.value)
	return k, v
}

// writeLayouts records the layouts of spec's pinned maps in dir, replacing
// a record that differs.
func writeLayouts(dir string, spec *ebpf.CollectionSpec) error {
	var names []string
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinByName && ms.Key != nil && ms.Value != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var b btf.Builder
	for _, name := range names {
		ms := spec.Maps[name]
		st := &btf.Struct{Name: layoutPrefix + name, Size: ms.KeySize + ms.ValueSize, Members: []btf.Member{
			{Name: "key", Type: ms.Key},
			{Name: "value", Type: ms.Value, Offset: btf.Bits(ms.KeySize * 8)},
		}}
		if _, err := b.Add(st); err != nil {
			return fmt.Errorf("record the layout of %s: %w", name, err)
		}
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		return fmt.Errorf("record the layouts: %w", err)
	}
	blob := binary.NativeEndian.AppendUint32(nil, uint32(len(raw)))
	blob = append(blob, raw...)
	for len(blob)%8 != 0 {
		blob = append(blob, 0)
	}
	pin := filepath.Join(dir, layoutsPin)
	if have, err := readBlob(pin); err == nil && bytes.Equal(have, blob) {
		return nil
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: layoutsPin, Type: ebpf.Array, KeySize: 4, ValueSize: uint32(len(blob)), MaxEntries: 1})
	if err != nil {
		return fmt.Errorf("record the layouts: %w", err)
	}
	defer m.Close()
	if err := m.Update(uint32(0), blob, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("record the layouts: %w", err)
	}
	tmp := pin + "_new"
	_ = os.Remove(tmp)
	if err := m.Pin(tmp); err != nil {
		return fmt.Errorf("record the layouts: %w", err)
	}
	if err := os.Rename(tmp, pin); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("record the layouts: %w", err)
	}
	return nil
}

func readBlob(pin string) ([]byte, error) {
	m, err := ebpf.LoadPinnedMap(pin, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var blob []byte
	if err := m.Lookup(uint32(0), &blob); err != nil {
		return nil, err
	}
	return blob, nil
}

// readLayouts reads the record of layouts in dir; nil when there is none.
func readLayouts(dir string) (map[string]layout, error) {
	blob, err := readBlob(filepath.Join(dir, layoutsPin))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the record of layouts: %w", err)
	}
	if len(blob) < 4 || int(binary.NativeEndian.Uint32(blob)) > len(blob)-4 {
		return nil, errors.New("read the record of layouts: truncated")
	}
	raw := blob[4 : 4+binary.NativeEndian.Uint32(blob)]
	s, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("read the record of layouts: %w", err)
	}
	out := map[string]layout{}
	for typ, err := range s.All() {
		if err != nil {
			return nil, fmt.Errorf("read the record of layouts: %w", err)
		}
		st, ok := typ.(*btf.Struct)
		if !ok || len(st.Name) <= len(layoutPrefix) || st.Name[:len(layoutPrefix)] != layoutPrefix || len(st.Members) != 2 {
			continue
		}
		out[st.Name[len(layoutPrefix):]] = layout{key: st.Members[0].Type, value: st.Members[1].Type, source: "the pins' record"}
	}
	return out, nil
}

var builtin struct {
	once sync.Once
	l    []map[string]layout
	err  error
}

// builtinLayoutList parses the built-in layouts of earlier versions, the
// most recent first.
func builtinLayoutList() ([]map[string]layout, error) {
	builtin.once.Do(func() {
		ents, err := builtinLayouts.ReadDir("layouts")
		if err != nil {
			builtin.err = err
			return
		}
		for i := len(ents) - 1; i >= 0; i-- {
			b, err := builtinLayouts.ReadFile("layouts/" + ents[i].Name())
			if err != nil {
				builtin.err = err
				return
			}
			spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(b))
			if err != nil {
				builtin.err = fmt.Errorf("built-in layouts %s: %w", ents[i].Name(), err)
				return
			}
			l := map[string]layout{}
			for name, ms := range spec.Maps {
				if ms.Key != nil && ms.Value != nil {
					l[name] = layout{key: ms.Key, value: ms.Value, source: "built-in " + ents[i].Name()}
				}
			}
			builtin.l = append(builtin.l, l)
		}
	})
	return builtin.l, builtin.err
}

// oldLayout finds the layout of the pinned map old, named name: from the
// pins' record, the kernel, or the built-in layouts, whichever has one of
// old's key and value sizes first; ok false when none does.
func oldLayout(name string, old *ebpf.Map, record map[string]layout) (layout, bool) {
	fits := func(l layout) bool {
		k, v := l.sizes()
		return k == int(old.KeySize()) && v == int(old.ValueSize())
	}
	if l, ok := record[name]; ok && fits(l) {
		return l, true
	}
	if kernelBTF {
		if k, v, err := mapTypes(old); err == nil && k != nil && v != nil {
			if l := (layout{key: k, value: v, source: "the kernel"}); fits(l) {
				return l, true
			}
		}
	}
	list, _ := builtinLayoutList()
	for _, b := range list {
		if l, ok := b[name]; ok && fits(l) {
			return l, true
		}
	}
	return layout{}, false
}
