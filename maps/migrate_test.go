//go:build linux

package maps

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// oldPins is the last release's program loaded over a pin directory of
// its own, as its daemon left it: rules written in its layout.
type oldPins struct {
	coll *ebpf.Collection
	spec *ebpf.CollectionSpec
	dir  string
}

// loadOldRelease loads the fixture's program with the fake clock, its maps
// pinned in dir.
func loadOldRelease(t *testing.T, dir string) *oldPins {
	t.Helper()
	spec := oldReleaseSpec(t)
	if err := spec.Variables["xl_cfg_fake_clock"].Set(uint32(1)); err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}})
	if err != nil {
		t.Fatalf("load the old release: %v", err)
	}
	t.Cleanup(func() { coll.Close() })
	return &oldPins{coll: coll, spec: spec, dir: dir}
}

// put writes v, a value of this program's layout for map name, into the
// old map converted to the old layout (the converter, backwards).
func (o *oldPins) put(t *testing.T, name string, key, v any) {
	t.Helper()
	cur, err := loadXdp()
	if err != nil {
		t.Fatal(err)
	}
	c, err := newConverter(o.spec.Maps[name].Value, cur.Maps[name].Value)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := binary.Write(&b, binary.NativeEndian, v); err != nil {
		t.Fatal(err)
	}
	old, err := c.convert(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if err := o.coll.Maps[name].Update(key, old, ebpf.UpdateAny); err != nil {
		t.Fatalf("write %s: %v", name, err)
	}
}

// apply writes plan into generation 1 of the old maps and makes it
// active, as the old daemon did.
func (o *oldPins) apply(t *testing.T, p *dataplane.Plan) {
	t.Helper()
	const gen = 1
	for s := range p.Rules {
		r := ruleToKernel(&p.Rules[s])
		o.put(t, xdpMapXlRules, uint32(gen*dataplane.MaxRules+s), &r)
	}
	g := xdpXlGlobals{Portless: p.Globals.Portless, FragMatch: p.Globals.FragMatch, SynOnly: p.Globals.SynOnly, Flags: p.Globals.Flags &^ dataplane.GlobalPrefilter}
	o.put(t, xdpMapXlConfig, uint32(gen), &g)
	for k, mask := range p.Ports {
		if err := o.coll.Maps[xdpMapXlPorts].Update(uint32(gen<<17)|k, mask, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.coll.Maps[xdpMapXlGen].Update(uint32(0), uint32(gen), ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
}

// run runs frame n times at now through the old program and returns how
// many passed.
func (o *oldPins) run(t *testing.T, frame []byte, now uint64, n int) int {
	t.Helper()
	if err := o.coll.Maps["xl_clock"].Update(uint32(0), now, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	passed := 0
	for range n {
		ret, err := o.coll.Programs["xlimit_xdp"].Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatal(err)
		}
		if ret == xdpPass {
			passed++
		}
	}
	return passed
}

// runNew is run through the new program.
func runNew(t *testing.T, o *Objects, frame []byte, now uint64, n int) int {
	t.Helper()
	if err := o.Tables().SetClock(now); err != nil {
		t.Fatal(err)
	}
	passed := 0
	for range n {
		ret, err := o.Program().Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatal(err)
		}
		if ret == xdpPass {
			passed++
		}
	}
	return passed
}

// TestMigrateOldReleasePins: pins of the last release (2392467: its
// xl_config, xl_limits, xl_caches and xl_stats had other layouts, which
// Load refuses) are carried into this program's layout by LoadMigrating:
// the rules keep their slot, the bucket keeps its fill (no burst after
// the migration), the counters keep their counts and grow from there,
// the old program runs its own rules until the end whatever the new
// daemon writes, and after Commit the pins adopt as this program's.
func TestMigrateOldReleasePins(t *testing.T) {
	for _, kernel := range []bool{true, false} {
		name := "layouts from the kernel"
		if !kernel {
			name = "built-in layouts (no CAP_SYS_ADMIN)"
		}
		t.Run(name, func(t *testing.T) {
			defer func(k bool) { kernelBTF = k }(kernelBTF)
			kernelBTF = kernel
			testMigrateOldReleasePins(t, kernel)
		})
	}
}

func testMigrateOldReleasePins(t *testing.T, kernel bool) {
	requireRoot(t)
	pinToOneCPU(t)
	pins := privatePinDir(t)
	stage := filepath.Join(pins, "migrating")
	old := loadOldRelease(t, pins)
	spec := &dataplane.Spec{Rules: []dataplane.RuleSpec{{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 10, Burst: 5}}}
	plan := compile(t, spec, nil)
	old.apply(t, plan)
	slot := plan.Slot("dns")
	frame := build(udpTo(srcA4, 53))
	t0 := 1000 * second
	if got := old.run(t, frame, t0, 20); got != 5 {
		t.Fatalf("the old program admitted %d of 20, want its burst of 5", got)
	}

	if _, err := Load(Options{PinDir: pins, FakeClock: true}); !errors.Is(err, ebpf.ErrMapIncompatible) {
		t.Fatalf("Load over the old pins: %v, want ErrMapIncompatible", err)
	}
	mig, err := LoadMigrating(Options{PinDir: pins, FakeClock: true}, stage)
	if err != nil {
		t.Fatal(err)
	}
	o := mig.Objects()
	t.Cleanup(func() { o.Close() })
	mig.ConvertConfig()
	tab := o.Tables()
	base, err := tab.ReadPlan()
	if err != nil {
		t.Fatal(err)
	}
	if base.Slot("dns") != slot || base.Rules[slot].Epoch != plan.Rules[slot].Epoch || base.Rules[slot].Fallback != plan.Rules[slot].Fallback {
		t.Fatalf("the plan read back from the converted config: %+v, want rule dns in slot %d as written", base.Rules[slot], slot)
	}
	// The new daemon writes its rules (here: a shadow rule, which would
	// pass everything) into the new maps; the old program is unaffected.
	shadow := *spec
	shadow.Rules = slices.Clone(spec.Rules)
	shadow.Rules[0].Shadow = true
	if err := tab.Apply(compile(t, &shadow, base)); err != nil {
		t.Fatal(err)
	}
	if got := old.run(t, frame, t0, 3); got != 0 {
		t.Errorf("the old program admitted %d once the new rules were written: it must run its own until it is replaced", got)
	}
	if err := tab.Apply(compile(t, spec, base)); err != nil {
		t.Fatal(err)
	}
	mig.ConvertState()

	for _, r := range mig.Reports() {
		t.Logf("%s", r)
	}
	reports := map[string]MapReport{}
	for _, r := range mig.Reports() {
		reports[r.Name] = r
	}
	for name, how := range map[string]string{
		xdpMapXlGen: "copied", xdpMapXlConfig: "converted", xdpMapXlStats: "converted", xdpMapXlCaches: "converted",
		xdpMapXlLimits: "converted", xdpMapXlBuckets: "converted", xdpMapXlFlood: "new",
	} {
		if r := reports[name]; r.How != how || r.Err != nil || r.Dropped != 0 {
			t.Errorf("%s: %s, want %s without loss", name, r, how)
		}
	}
	if r := reports[xdpMapXlStats]; !slices.Contains(r.Added, "resets") {
		t.Errorf("xl_stats: added %v, want resets among them", r.Added)
	}
	// The bucket's units come zeroed (unknown: taken as the settings in
	// force, bucket.h xl_units_claim): the checks below find it as full
	// as the old program left it, neither stalled nor refilled.
	if r := reports[xdpMapXlBuckets]; !slices.Equal(r.Added, []string{"units"}) {
		t.Errorf("xl_buckets: added %v, want units", r.Added)
	}
	wantLayout := "the kernel"
	if !kernel {
		wantLayout = "built-in xdp-2392467.o"
	}
	if r := reports[xdpMapXlConfig]; r.Layout != wantLayout {
		t.Errorf("xl_config's old layout came from %q, want %q", r.Layout, wantLayout)
	}

	// Counters: what the old program counted, in the new layout.
	c := o.Tables()
	got, err := c.Counters(slot)
	if err != nil {
		t.Fatal(err)
	}
	if got.Packets[dataplane.VerdictPass] != 5 || got.Packets[dataplane.VerdictDrop] != 18 || got.Reasons[dataplane.ReasonRule] != 18 {
		t.Errorf("after the migration slot %d counts %s, want the old program's pass 5, drop 18 (rule 18)", slot, fmtCounters(got))
	}
	// The bucket: empty at t0, one token per 100 ms, as the old program
	// left it; a bucket that started afresh would admit its burst of 5.
	if n := runNew(t, o, frame, t0, 5); n != 0 {
		t.Errorf("the new program admitted %d at the migration's instant: the bucket lost its fill", n)
	}
	if n := runNew(t, o, frame, t0+second/10, 5); n != 1 {
		t.Errorf("the new program admitted %d 100 ms later, want the one token of 100 ms at 10/s", n)
	}
	after, err := c.Counters(slot)
	if err != nil {
		t.Fatal(err)
	}
	if after.Packets[dataplane.VerdictPass] != 6 || after.Packets[dataplane.VerdictDrop] != 27 {
		t.Errorf("counters went on to %s, want pass 6, drop 27", fmtCounters(after))
	}

	if err := mig.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stage); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the staging directory is still there: %v", err)
	}
	// The pins are this program's now: a plain load adopts them, state and
	// all.
	again, err := Load(Options{PinDir: pins, FakeClock: true})
	if err != nil {
		t.Fatalf("Load after the migration: %v", err)
	}
	defer again.Close()
	ag, err := again.Tables().Counters(slot)
	if err != nil || ag != after {
		t.Errorf("the adopted counters: %s, %v; want %s", fmtCounters(ag), err, fmtCounters(after))
	}
	entries, _ := os.ReadDir(pins)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Contains(names, xdpMapXlFlood) || !slices.Contains(names, xdpMapXlConfig) {
		t.Errorf("pins after the migration: %s", strings.Join(names, " "))
	}
}

// TestMigrateAbandoned: a migration abandoned before its swap (a daemon
// that died) leaves the old program running its own rules with its own
// pins, and the next one starts over from them.
func TestMigrateAbandoned(t *testing.T) {
	requireRoot(t)
	pinToOneCPU(t)
	pins := privatePinDir(t)
	stage := filepath.Join(pins, "migrating")
	old := loadOldRelease(t, pins)
	spec := &dataplane.Spec{Rules: []dataplane.RuleSpec{{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 10, Burst: 5}}}
	old.apply(t, compile(t, spec, nil))
	frame := build(udpTo(srcA4, 53))
	t0 := 1000 * second
	old.run(t, frame, t0, 20)

	mig, err := LoadMigrating(Options{PinDir: pins, FakeClock: true}, stage)
	if err != nil {
		t.Fatal(err)
	}
	mig.ConvertConfig()
	tab := mig.Objects().Tables()
	base, err := tab.ReadPlan()
	if err != nil {
		t.Fatal(err)
	}
	if err := tab.Apply(compile(t, &dataplane.Spec{}, base)); err != nil {
		t.Fatal(err)
	}
	mig.ConvertState()
	mig.Objects().Close() // the daemon dies: no Commit, no Abort
	if got := old.run(t, frame, t0, 3); got != 0 {
		t.Errorf("the old program admitted %d after an abandoned migration, want its own rules (0)", got)
	}
	ids := stagedIDs(t, stage)
	if len(ids) == 0 {
		t.Fatal("no staged maps: want the abandoned migration's")
	}
	mig2, err := LoadMigrating(Options{PinDir: pins, FakeClock: true}, stage)
	if err != nil {
		t.Fatalf("a second migration: %v", err)
	}
	defer mig2.Objects().Close()
	mig2.ConvertConfig()
	mig2.ConvertState()
	if r := mig2.report(xdpMapXlStats); r == nil || r.How != "converted" || r.Entries == 0 {
		t.Errorf("the second migration's xl_stats: %v", r)
	}
	ids2 := stagedIDs(t, stage)
	for name, id := range ids2 {
		if ids[name] == id {
			t.Errorf("%s: the second migration reused the first's map %d", name, id)
		}
	}
	if err := mig2.Abort(); err != nil {
		t.Fatal(err)
	}
}

// stagedIDs returns the ids of the maps pinned in stage, by name.
func stagedIDs(t *testing.T, stage string) map[string]ebpf.MapID {
	t.Helper()
	ents, err := os.ReadDir(stage)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]ebpf.MapID{}
	for _, e := range ents {
		m, err := ebpf.LoadPinnedMap(filepath.Join(stage, e.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			continue
		}
		if info, err := m.Info(); err == nil {
			ids[e.Name()], _ = info.ID()
		}
		m.Close()
	}
	return ids
}

// TestMigrateFromRecord: without the kernel's BTF of the old maps (a
// daemon without CAP_SYS_ADMIN), the layouts come from the record the
// earlier version kept with its pins (xl_layouts). Here xl_buckets is
// pinned in an older layout than today's (no probes, no reset_tat) with a
// drained bucket: converted, the bucket keeps its fill.
func TestMigrateFromRecord(t *testing.T) {
	requireRoot(t)
	pinToOneCPU(t)
	defer func(k bool) { kernelBTF = k }(kernelBTF)
	kernelBTF = false
	pins := privatePinDir(t)
	stage := filepath.Join(pins, "migrating")
	spec := &dataplane.Spec{Rules: []dataplane.RuleSpec{{Name: "dns", Protocol: "udp", Ports: ports(53, 53), Rate: 10, Burst: 5}}}
	frame := build(udpTo(srcA4, 53))
	t0 := 1000 * second

	o1, err := Load(Options{PinDir: pins, FakeClock: true})
	if err != nil {
		t.Fatal(err)
	}
	plan := compile(t, spec, nil)
	if err := o1.Tables().Apply(plan); err != nil {
		t.Fatal(err)
	}
	slot := plan.Slot("dns")
	if n := runNew(t, o1, frame, t0, 20); n != 5 {
		t.Fatalf("admitted %d of 20, want the burst of 5", n)
	}
	tat, epoch, err := o1.Tables().BucketTAT(slot)
	if err != nil {
		t.Fatal(err)
	}
	o1.Close()

	// The same bucket in an older layout, and the record saying so.
	u32t, u64t := &btf.Int{Name: "__u32", Size: 4}, &btf.Int{Name: "__u64", Size: 8}
	older := &btf.Struct{Name: "xl_bucket_state", Size: 16, Members: []btf.Member{
		{Name: "tat", Type: u64t}, {Name: "epoch", Type: u32t, Offset: 64}, {Name: "_pad", Type: u32t, Offset: 96},
	}}
	ob, err := ebpf.NewMap(&ebpf.MapSpec{Name: xdpMapXlBuckets, Type: ebpf.Array, KeySize: 4, ValueSize: 16, MaxEntries: dataplane.MaxRules, Key: u32t, Value: older})
	if err != nil {
		t.Fatal(err)
	}
	defer ob.Close()
	val := binary.NativeEndian.AppendUint64(nil, tat)
	val = binary.NativeEndian.AppendUint32(val, epoch)
	val = binary.NativeEndian.AppendUint32(val, 0)
	if err := ob.Update(uint32(slot), val, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(pins, xdpMapXlBuckets)); err != nil {
		t.Fatal(err)
	}
	if err := ob.Pin(filepath.Join(pins, xdpMapXlBuckets)); err != nil {
		t.Fatal(err)
	}
	was, err := loadXdp()
	if err != nil {
		t.Fatal(err)
	}
	was.Maps[xdpMapXlBuckets].Value, was.Maps[xdpMapXlBuckets].ValueSize = older, 16
	if err := writeLayouts(pins, was); err != nil {
		t.Fatal(err)
	}

	mig, err := LoadMigrating(Options{PinDir: pins, FakeClock: true}, stage)
	if err != nil {
		t.Fatal(err)
	}
	o := mig.Objects()
	defer o.Close()
	mig.ConvertConfig()
	base, err := o.Tables().ReadPlan()
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Tables().Apply(compile(t, spec, base)); err != nil {
		t.Fatal(err)
	}
	mig.ConvertState()
	r := mig.report(xdpMapXlBuckets)
	t.Logf("%s", r)
	if r.How != "converted" || r.Layout != "the pins' record" || !slices.Equal(r.Added, []string{"units", "probes", "reset_tat"}) {
		t.Errorf("xl_buckets: %s; want converted from the pins' record, units, probes and reset_tat added", r)
	}
	if n := runNew(t, o, frame, t0, 5); n != 0 {
		t.Errorf("admitted %d at the migration's instant: the converted bucket lost its fill", n)
	}
	if n := runNew(t, o, frame, t0+second/10, 5); n != 1 {
		t.Errorf("admitted %d 100 ms later, want 1", n)
	}
	if err := mig.Commit(); err != nil {
		t.Fatal(err)
	}
	rec, err := readLayouts(pins)
	if err != nil {
		t.Fatal(err)
	}
	if k, v := rec[xdpMapXlBuckets].sizes(); k != 4 || v != binary.Size(xdpXlBucketState{}) {
		t.Errorf("the record after the migration says xl_buckets is %d/%d bytes, want today's", k, v)
	}
}
