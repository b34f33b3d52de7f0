//go:build linux

package maps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// A migration loads this program over the pins of an xlimit whose map
// layouts differ (an upgrade across a change of a pinned map's value, key
// or size), without a moment of the interface without a program and
// without losing the buckets and counters:
//
//  1. LoadMigrating loads the program with maps of its own layout. Every
//     pinned map whose layout is the same is shared with the program still
//     attached, as an adoption would (it keeps counting into it); every
//     other one is created anew, pinned in a staging directory beside the
//     interface's. xl_gen, the root of the configuration (which generation
//     every program reads), is always a copy of the program's own: the
//     daemon then writes the new rules into the generation the old program
//     does not read and flips only the new root, so the old program runs
//     its own rules until it is replaced, whatever maps are shared.
//  2. ConvertConfig copies the config maps (written by the daemon) into the
//     new ones, field by field by name (convert.go) using the old map's BTF
//     (from the kernel, by the map's BTF id) and this program's types, so
//     that the rules can be written compiled against the plan in force:
//     every rule keeps its slot, hence its bucket and counters.
//  3. The caller writes the rules (loader.Options.Fill).
//  4. ConvertState copies the state maps (written by the programs) the
//     same way, the largest first, so that what the old program changes
//     between its copy and the swap (at most the last maps' few entries'
//     worth of microseconds) is little.
//  5. The caller swaps the program of the pinned link (BPF_LINK_UPDATE).
//  6. Commit replaces the old pins with the new maps' (a rename within the
//     bpffs each) and removes the staging directory.
//
// A daemon that dies before step 5 leaves the old program attached with
// its own maps and pins, untouched but for generations it does not read:
// the staging directory is garbage, and the next start removes it and
// migrates again. One that dies after step 5 leaves the new program
// attached with maps pinned partly in the staging directory: the next
// start sees that the attached program uses them (ResumeStaged) and
// completes step 6. The link's program is the truth either way.

// configMaps are the maps the daemon writes (docs/design.md section 2:
// their comments in bpf/*.h start with "Config."; TestMapClasses checks
// that they agree). Every other pinned map is state.
var configMaps = map[string]bool{
	xdpMapXlGen: true, xdpMapXlConfirm: true, xdpMapXlConfig: true, xdpMapXlRules: true, xdpMapXlPorts: true,
	xdpMapXlPrefix4: true, xdpMapXlPrefix6: true, xdpMapXlPrefilter: true, xdpMapXlLimits: true,
	xdpMapXlHostAddrs: true, xdpMapXlCookieCfg: true, xdpMapXlCookieLink: true,
}

// rootMap is never shared with the program being replaced.
const rootMap = xdpMapXlGen

// MapReport says what a migration did with one pinned map.
type MapReport struct {
	Name string
	// How: "shared" (same layout, adopted as it is), "converted" (copied
	// into the new layout), "copied" (same layout, a copy of its own:
	// xl_gen), "new" (no pin before), "fresh" (not carried: Err says why).
	How              string
	Entries, Dropped int
	// Added, Removed and Changed name the fields that are new (zero), gone,
	// or of a type that could not be converted (zero).
	Added, Removed, Changed []string
	// Layout says where the old layout came from (layouts.go).
	Layout string
	Err    error
}

func (r MapReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", r.Name, r.How)
	if r.How == "converted" || r.How == "copied" {
		fmt.Fprintf(&b, " %d entries (layout from %s)", r.Entries, r.Layout)
		if r.Dropped > 0 {
			fmt.Fprintf(&b, " (%d dropped)", r.Dropped)
		}
	}
	for _, f := range []struct {
		what string
		l    []string
	}{{"added", r.Added}, {"removed", r.Removed}, {"not converted", r.Changed}} {
		if len(f.l) > 0 {
			fmt.Fprintf(&b, "; %s %s", f.what, strings.Join(f.l, ","))
		}
	}
	if r.Err != nil {
		fmt.Fprintf(&b, "; %v", r.Err)
	}
	return b.String()
}

// Migration is a load of the program over incompatible pins, until
// Commit or Abort.
type Migration struct {
	obj        *Objects
	dir, stage string
	spec       *ebpf.CollectionSpec
	record     map[string]layout // the pins' record of layouts (layouts.go)
	fresh      []*freshMap
	reports    []MapReport
}

// freshMap is a map the program got anew, and the pinned map it is carried
// from (nil when none was pinned).
type freshMap struct {
	name string
	old  *ebpf.Map
	rep  *MapReport
}

// LoadMigrating loads the program over the pins in opts.PinDir, carrying
// the incompatible ones over (see above); stage is the staging directory,
// on the same bpffs, which must not be the pin directory. Whatever a
// migration that did not complete left in stage is removed first.
func LoadMigrating(opts Options, stage string) (_ *Migration, err error) {
	if opts.PinDir == "" || stage == "" || filepath.Clean(stage) == filepath.Clean(opts.PinDir) {
		return nil, errors.New("migrate: a pin directory and a staging directory of its own are needed")
	}
	spec, err := loadSpec(opts)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(stage); err != nil {
		return nil, fmt.Errorf("migrate: remove %s: %w", stage, err)
	}
	if err := os.Mkdir(stage, 0o700); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	m := &Migration{dir: opts.PinDir, stage: stage, spec: spec}
	if m.record, err = readLayouts(opts.PinDir); err != nil {
		m.record = nil // the other sources of layouts remain
	}
	defer func() {
		if err != nil {
			m.closeOld()
			_ = os.RemoveAll(stage)
		}
	}()
	repl := map[string]*ebpf.Map{}
	var shared []*ebpf.Map
	defer func() {
		for _, s := range shared {
			s.Close() // the collection holds clones
		}
	}()
	names := make([]string, 0, len(spec.Maps))
	for name, ms := range spec.Maps {
		if ms.Pinning == ebpf.PinByName {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		ms := spec.Maps[name]
		old, err := ebpf.LoadPinnedMap(filepath.Join(opts.PinDir, name), nil)
		switch {
		case errors.Is(err, os.ErrNotExist):
			m.reports = append(m.reports, MapReport{Name: name, How: "new"})
			continue
		case err != nil:
			return nil, fmt.Errorf("migrate: open pinned map %s: %w", name, err)
		}
		if name != rootMap && ms.Compatible(old) == nil {
			repl[name] = old
			shared = append(shared, old)
			m.reports = append(m.reports, MapReport{Name: name, How: "shared"})
			continue
		}
		m.reports = append(m.reports, MapReport{Name: name, How: "converted"})
		m.fresh = append(m.fresh, &freshMap{name: name, old: old})
	}
	for _, f := range m.fresh {
		f.rep = m.report(f.name)
	}
	o := &Objects{fakeClock: opts.FakeClock}
	if err := spec.LoadAndAssign(&o.objs, &ebpf.CollectionOptions{
		Maps:            ebpf.MapOptions{PinPath: stage},
		MapReplacements: repl,
	}); err != nil {
		return nil, loadError(err)
	}
	m.obj = o
	// The record of this program's layouts goes in with its maps.
	if err := writeLayouts(stage, spec); err != nil {
		o.Close()
		return nil, err
	}
	return m, nil
}

func (m *Migration) report(name string) *MapReport {
	for i := range m.reports {
		if m.reports[i].Name == name {
			return &m.reports[i]
		}
	}
	return nil
}

// Objects returns the program and maps loaded.
func (m *Migration) Objects() *Objects { return m.obj }

// Reports says what became of each pinned map, by name.
func (m *Migration) Reports() []MapReport { return slices.Clone(m.reports) }

// ConvertConfig carries the config maps over (step 2).
func (m *Migration) ConvertConfig() { m.convert(true) }

// ConvertState carries the state maps over (step 4), the largest first.
func (m *Migration) ConvertState() { m.convert(false) }

func (m *Migration) convert(config bool) {
	var todo []*freshMap
	for _, f := range m.fresh {
		if configMaps[f.name] == config {
			todo = append(todo, f)
		}
	}
	slices.SortStableFunc(todo, func(a, b *freshMap) int {
		return int(b.old.MaxEntries()) - int(a.old.MaxEntries())
	})
	for _, f := range todo {
		dst := m.obj.objs.mapByName(f.name)
		if dst == nil {
			f.rep.How, f.rep.Err = "fresh", errors.New("not in the loaded collection")
			continue
		}
		convertMap(f.rep, dst, f.old, m.spec.Maps[f.name], m.record)
		if f.name == rootMap && f.rep.How == "converted" && len(f.rep.Added)+len(f.rep.Removed)+len(f.rep.Changed) == 0 {
			f.rep.How = "copied"
		}
	}
}

// Commit replaces the old pins with the new maps' (step 6), after the
// program was swapped; the root last, so that a staging directory with a
// root in it is a migration not committed.
func (m *Migration) Commit() error {
	m.closeOld()
	return CommitStaged(m.dir, m.stage)
}

// Abort forgets a migration before the swap: the old pins stay as they
// were and the staging directory goes. The caller closes the objects.
func (m *Migration) Abort() error {
	m.closeOld()
	if err := os.RemoveAll(m.stage); err != nil {
		return fmt.Errorf("migrate: remove %s: %w", m.stage, err)
	}
	return nil
}

func (m *Migration) closeOld() {
	for _, f := range m.fresh {
		if f.old != nil {
			f.old.Close()
			f.old = nil
		}
	}
}

// CommitStaged moves every pin of stage into dir, replacing the pins of
// the same name, the root last, and removes stage and the retired pins
// (retiredPins).
func CommitStaged(dir, stage string) error {
	entries, err := os.ReadDir(stage)
	if err != nil {
		return fmt.Errorf("migrate: read %s: %w", stage, err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if e.Name() == StagedProgram {
			if err := os.Remove(filepath.Join(stage, e.Name())); err != nil {
				return fmt.Errorf("migrate: %w", err)
			}
			continue
		}
		names = append(names, e.Name())
	}
	slices.SortFunc(names, func(a, b string) int {
		if (a == rootMap) != (b == rootMap) {
			if a == rootMap {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	for _, n := range names {
		if err := os.Rename(filepath.Join(stage, n), filepath.Join(dir, n)); err != nil {
			return fmt.Errorf("migrate: replace the pin of %s: %w", n, err)
		}
	}
	if err := os.Remove(stage); err != nil {
		return fmt.Errorf("migrate: remove %s: %w", stage, err)
	}
	return removeRetired(dir)
}

// StagedProgram is the pin, in the staging directory, of the program a
// migration swaps in, made before the swap: the link's program being that
// one tells, without CAP_SYS_ADMIN, that the swap happened.
const StagedProgram = "xlimit_xdp"

// PinProgram pins the program to swap in (StagedProgram), before the swap.
func (m *Migration) PinProgram() error {
	if err := m.obj.Program().Pin(filepath.Join(m.stage, StagedProgram)); err != nil {
		return fmt.Errorf("migrate: pin the new program: %w", err)
	}
	return nil
}

// StagedProgramID returns the id of the program a migration left pinned
// in stage, or 0 when there is none (no migration, or one that ended
// before the swap was prepared).
func StagedProgramID(stage string) (ebpf.ProgramID, bool, error) {
	if _, err := os.Stat(stage); errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	p, err := ebpf.LoadPinnedProgram(filepath.Join(stage, StagedProgram), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return 0, true, nil
	}
	if err != nil {
		return 0, true, fmt.Errorf("migrate: open the staged program: %w", err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return 0, true, fmt.Errorf("migrate: read the staged program: %w", err)
	}
	id, _ := info.ID()
	return id, true, nil
}

// convertMap copies every entry of old into dst, converted from old's
// layout (layouts.go) to spec's.
func convertMap(rep *MapReport, dst, old *ebpf.Map, spec *ebpf.MapSpec, record map[string]layout) {
	fresh := func(err error) {
		rep.How, rep.Err = "fresh", err
	}
	if perCPU(old.Type()) != perCPU(dst.Type()) {
		fresh(fmt.Errorf("per-CPU values became shared or the other way round (%v, was %v)", dst.Type(), old.Type()))
		return
	}
	kc, vc, src, err := converters(rep.Name, old, spec, record)
	if err != nil {
		fresh(err)
		return
	}
	rep.Layout = src
	rep.Added, rep.Removed, rep.Changed = vc.added, vc.removed, vc.changed
	for _, p := range kc.added {
		rep.Added = append(rep.Added, "key."+p)
	}
	for _, p := range kc.removed {
		rep.Removed = append(rep.Removed, "key."+p)
	}
	for _, p := range kc.changed {
		rep.Changed = append(rep.Changed, "key."+p)
	}
	isArray := dst.Type() == ebpf.Array || dst.Type() == ebpf.PerCPUArray
	var k []byte
	var v []byte
	var pv [][]byte
	it := old.Iterate()
	for {
		var ok bool
		if perCPU(old.Type()) {
			ok = it.Next(&k, &pv)
		} else {
			ok = it.Next(&k, &v)
		}
		if !ok {
			break
		}
		nk, err := kc.convert(k)
		if err != nil {
			rep.Dropped++
			continue
		}
		if isArray && len(nk) == 4 && uint32(nk[0])|uint32(nk[1])<<8|uint32(nk[2])<<16|uint32(nk[3])<<24 >= dst.MaxEntries() {
			rep.Dropped++
			continue
		}
		var val any
		if perCPU(old.Type()) {
			out := make([][]byte, len(pv))
			for i := range pv {
				if out[i], err = vc.convert(pv[i]); err != nil {
					break
				}
			}
			val = out
		} else {
			var nv []byte
			nv, err = vc.convert(v)
			val = nv
		}
		if err == nil {
			err = dst.Update(nk, val, ebpf.UpdateAny)
		}
		if err != nil {
			rep.Dropped++
			continue
		}
		rep.Entries++
	}
	if err := it.Err(); err != nil {
		rep.Err = fmt.Errorf("read the old map: %w", err)
	}
}

func perCPU(t ebpf.MapType) bool {
	switch t {
	case ebpf.PerCPUHash, ebpf.PerCPUArray, ebpf.LRUCPUHash, ebpf.PerCPUCGroupStorage:
		return true
	}
	return false
}

// converters plans the conversion of old's keys and values into spec's
// layout, and says where old's layout came from; with no layout known for
// old, values of equal sizes are copied as they are.
func converters(name string, old *ebpf.Map, spec *ebpf.MapSpec, record map[string]layout) (kc, vc *converter, src string, err error) {
	l, ok := oldLayout(name, old, record)
	if !ok || spec.Key == nil || spec.Value == nil {
		if old.KeySize() == spec.KeySize && old.ValueSize() == spec.ValueSize {
			return rawConverter(int(spec.KeySize)), rawConverter(int(spec.ValueSize)), "as it is (sizes equal)", nil
		}
		return nil, nil, "", fmt.Errorf("the old layout (%d-byte keys, %d-byte values) is not known here: not in the pins' record, not readable from the kernel without CAP_SYS_ADMIN, not built in", old.KeySize(), old.ValueSize())
	}
	if kc, err = newConverter(spec.Key, l.key); err != nil {
		return nil, nil, "", fmt.Errorf("key: %w", err)
	}
	if vc, err = newConverter(spec.Value, l.value); err != nil {
		return nil, nil, "", fmt.Errorf("value: %w", err)
	}
	if kc.dstSize != int(spec.KeySize) || vc.dstSize != int(spec.ValueSize) {
		return nil, nil, "", fmt.Errorf("this program's BTF says %d/%d bytes, its map %d/%d", kc.dstSize, vc.dstSize, spec.KeySize, spec.ValueSize)
	}
	return kc, vc, l.source, nil
}

// mapTypes reads a map's key and value types from its BTF in the kernel
// (nil when it has none).
func mapTypes(m *ebpf.Map) (key, value btf.Type, err error) {
	btfID, keyID, valueID, err := mapBTFIDs(m.FD())
	if err != nil || btfID == 0 {
		return nil, nil, err
	}
	h, err := btf.NewHandleFromID(btf.ID(btfID))
	if err != nil {
		return nil, nil, fmt.Errorf("open the map's BTF: %w", err)
	}
	defer h.Close()
	s, err := h.Spec(nil)
	if err != nil {
		return nil, nil, fmt.Errorf("read the map's BTF: %w", err)
	}
	if key, err = s.TypeByID(btf.TypeID(keyID)); err != nil {
		return nil, nil, fmt.Errorf("the map's key type: %w", err)
	}
	if value, err = s.TypeByID(btf.TypeID(valueID)); err != nil {
		return nil, nil, fmt.Errorf("the map's value type: %w", err)
	}
	return key, value, nil
}

// mapInfo is the head of the kernel's struct bpf_map_info, up to the
// fields read here (include/uapi/linux/bpf.h).
type mapInfo struct {
	Type, ID, KeySize, ValueSize, MaxEntries, MapFlags uint32
	Name                                               [16]byte
	Ifindex, BTFVmlinuxValueTypeID                     uint32
	NetnsDev, NetnsIno                                 uint64
	BTFID, BTFKeyTypeID, BTFValueTypeID, _             uint32
	MapExtra                                           uint64
}

// mapBTFIDs reads the BTF object and the key and value type ids of a map,
// which cilium/ebpf's MapInfo does not expose.
func mapBTFIDs(fd int) (btfID, keyID, valueID uint32, err error) {
	info := new(mapInfo) // on the heap: the kernel writes it through a plain address
	attr := struct {
		fd, infoLen uint32
		info        uint64
	}{uint32(fd), uint32(unsafe.Sizeof(*info)), uint64(uintptr(unsafe.Pointer(info)))}
	const bpfObjGetInfoByFD = 15
	_, _, e := unix.Syscall(unix.SYS_BPF, bpfObjGetInfoByFD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(info)
	if e != 0 {
		return 0, 0, 0, fmt.Errorf("read map info: %w", e)
	}
	return info.BTFID, info.BTFKeyTypeID, info.BTFValueTypeID, nil
}

// mapByName returns the loaded map of that name, or nil.
func (o *xdpObjects) mapByName(name string) *ebpf.Map {
	mv := reflect.ValueOf(&o.xdpMaps).Elem()
	for i := range mv.NumField() {
		if mv.Type().Field(i).Tag.Get("ebpf") == name {
			m, _ := mv.Field(i).Interface().(*ebpf.Map)
			return m
		}
	}
	return nil
}
