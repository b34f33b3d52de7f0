//go:build linux

package maps

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// ErrNotPinned is returned by OpenPinned when no xlimit maps are pinned in
// the directory.
var ErrNotPinned = errors.New("no xlimit maps pinned")

// ErrCapabilities says what loading and attaching need.
var ErrCapabilities = errors.New("xlimit needs CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN (and CAP_SYS_RESOURCE on kernels before 5.11), or root")

// Options says how to load the program and its maps.
type Options struct {
	// PinDir, when set, is a directory on a bpffs where the maps are
	// pinned by name; maps already pinned there are adopted, state and all.
	PinDir string
	// FakeClock makes the program read the time from the clock map that
	// SetClock writes (tests only).
	FakeClock bool
	// SourceTableSize is the number of per-source buckets (ways of the
	// set-associative table, bpf/source.h), rounded up to a power of two
	// of at least dataplane.SrcWays; 0 keeps the default of 65536.
	SourceTableSize int
	// NoXDPTx loads the program with XDP_TX compiled out (xl_cfg_no_tx):
	// for an interface whose driver is known to misbehave sending XDP_TX
	// frames (loader/preflight). SYNs the cookie path would answer go to
	// the kernel, whose own SYN cookies answer them; refused SYNs are
	// dropped without a reset.
	NoXDPTx bool
	// Extend, when set, loads the XDP program as an extension of a libxdp
	// dispatcher's slot (the interface is shared, loader/share.go).
	Extend *Extension
}

// Objects is a loaded XDP program with its maps.
type Objects struct {
	objs      xdpObjects
	fakeClock bool
	// SourcesReset reports that the pinned per-source table had another
	// size and was replaced by an empty one.
	SourcesReset bool
}

// Spec returns the embedded collection spec, for callers that inspect it.
func Spec() (*ebpf.CollectionSpec, error) {
	return loadXdp()
}

// Load loads the program and creates (or adopts) its maps. Pins of an
// earlier xlimit whose layout differs are refused with an error wrapping
// ebpf.ErrMapIncompatible; LoadMigrating carries them over.
func Load(opts Options) (*Objects, error) {
	spec, err := loadSpec(opts)
	if err != nil {
		return nil, err
	}
	o := Objects{fakeClock: opts.FakeClock}
	if opts.PinDir == "" {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
	} else {
		// A per-source table of another size cannot be adopted: replace
		// it (per-source state starts afresh; everything else carries on).
		for _, name := range []string{xdpMapXlSrcTable, xdpMapXlSrcExts} {
			reset, err := unpinIfResized(filepath.Join(opts.PinDir, name), spec.Maps[name].MaxEntries)
			if err != nil {
				return nil, err
			}
			o.SourcesReset = o.SourcesReset || reset
		}
		// The filter in front of it is a cache: one of another size
		// starts empty, and says nothing of the sources' state.
		if _, err := unpinIfResized(filepath.Join(opts.PinDir, xdpMapXlSrcFilter), spec.Maps[xdpMapXlSrcFilter].MaxEntries); err != nil {
			return nil, err
		}
	}
	err = spec.LoadAndAssign(&o.objs, &ebpf.CollectionOptions{
		Maps: ebpf.MapOptions{PinPath: opts.PinDir},
	})
	if err != nil {
		return nil, loadError(err)
	}
	if opts.PinDir != "" {
		// For a later version's migration (layouts.go).
		if err := writeLayouts(opts.PinDir, spec); err != nil {
			o.Close()
			return nil, err
		}
		if err := removeRetired(opts.PinDir); err != nil {
			o.Close()
			return nil, err
		}
	}
	return &o, nil
}

// retiredPins are the pins of maps that earlier versions had and this one
// has not: the per-source LRU hash and its per-CPU front, which the
// set-associative table replaced (issue 28; per-source state starts
// afresh across that upgrade: every source's bucket full once).
var retiredPins = []string{"xl_sources", "xl_src_front"}

// removeRetired removes retiredPins from dir: a load over an earlier
// version's pins would leave them pinned, and their memory held, until
// `xlimit detach`. A program still attached keeps its own reference to
// them until it is replaced.
func removeRetired(dir string) error {
	for _, name := range retiredPins {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove retired pin %s: %w", name, err)
		}
	}
	return nil
}

// loadSpec is the embedded collection spec set up as opts say.
func loadSpec(opts Options) (*ebpf.CollectionSpec, error) {
	spec, err := loadXdp()
	if err != nil {
		return nil, fmt.Errorf("load spec: %w", err)
	}
	if opts.FakeClock {
		if err := spec.Variables[xdpVarXlCfgFakeClock].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("set fake clock: %w", err)
		}
	}
	if opts.NoXDPTx {
		if err := spec.Variables[xdpVarXlCfgNoTx].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("compile XDP_TX out: %w", err)
		}
	}
	if KernelMPTCP() {
		if err := spec.Variables[xdpVarXlCfgMptcp].Set(uint32(1)); err != nil {
			return nil, fmt.Errorf("set MPTCP: %w", err)
		}
	}
	sets := uint32(dataplane.SrcSets(opts.SourceTableSize))
	spec.Maps[xdpMapXlSrcTable].MaxEntries = sets
	spec.Maps[xdpMapXlSrcExts].MaxEntries = sets
	if err := spec.Variables[xdpVarXlCfgSrcSets].Set(sets); err != nil {
		return nil, fmt.Errorf("set the per-source table's sets: %w", err)
	}
	if err := setSrcFilter(spec, int(sets)); err != nil {
		return nil, err
	}
	if x := opts.Extend; x != nil {
		p := spec.Programs[xdpProgXlimitXdp]
		p.Type, p.AttachType, p.AttachTarget, p.AttachTo = ebpf.Extension, ebpf.AttachNone, x.Target, x.Func
	}
	return spec, nil
}

// setSrcFilter sizes spec's per-source filter (xl_src_filter) for a table
// of sets sets: dataplane.SrcFilterLines lines for each possible CPU. A
// TC object's spec has the variables but not the map (loadOverXDP).
func setSrcFilter(spec *ebpf.CollectionSpec, sets int) error {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("size the per-source filter: %w", err)
	}
	lines := dataplane.SrcFilterLines(sets, ncpu)
	if m, ok := spec.Maps[xdpMapXlSrcFilter]; ok {
		m.MaxEntries = uint32(lines * ncpu)
	}
	for name, v := range map[string]uint32{xdpVarXlCfgSrcfLines: uint32(lines), xdpVarXlCfgSrcfCpus: uint32(ncpu)} {
		if sv, ok := spec.Variables[name]; ok {
			if err := sv.Set(v); err != nil {
				return fmt.Errorf("size the per-source filter: set %s: %w", name, err)
			}
		}
	}
	return nil
}

// loadError says what a failed load of the collection means.
func loadError(err error) error {
	if errors.Is(err, os.ErrPermission) {
		// EPERM from map or program creation, EACCES from a verifier
		// that refuses an unprivileged program: either way a missing
		// capability, not a bug to debug from a verifier log.
		return fmt.Errorf("load program: %w: %s", errors.Unwrap(err), ErrCapabilities)
	}
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("load program: %+v", ve)
	}
	return fmt.Errorf("load program: %w", err)
}

func unpinIfResized(path string, want uint32) (bool, error) {
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open pinned %s: %w", path, err)
	}
	defer m.Close()
	if m.MaxEntries() == want {
		return false, nil
	}
	if err := os.Remove(path); err != nil {
		return false, fmt.Errorf("replace per-source table: %w", err)
	}
	return true, nil
}

// Program returns the XDP program.
func (o *Objects) Program() *ebpf.Program { return o.objs.XlimitXdp }

// SockOps returns the sock_ops program that counts connections in flight.
func (o *Objects) SockOps() *ebpf.Program { return o.objs.XlimitSockops }

// Close releases the program and maps (pins stay).
func (o *Objects) Close() error {
	return o.objs.Close()
}

// PinnedNames lists the names under which maps are pinned in a directory:
// every map of the XDP object that bpf/ marks LIBBPF_PIN_BY_NAME (the TC
// objects are loaded over its maps), sorted. Read from the embedded
// object, so a map added in bpf/ needs no list by hand.
func PinnedNames() []string { return slices.Clone(pinnedNames()) }

var pinnedNames = sync.OnceValue(func() []string {
	spec, err := loadXdp()
	if err != nil {
		// The object is embedded at build time: it cannot fail to
		// parse unless the binary is corrupt (TestPinnedNames).
		panic(fmt.Sprintf("read the embedded XDP object: %v", err))
	}
	var names []string
	for name, m := range spec.Maps {
		if m.Pinning == ebpf.PinByName {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
})

// Tables is read-write access to the maps alone: what Objects has, and what
// OpenPinned gives to `xlimit status` without loading a program.
type Tables struct {
	gen, config, rules, ports, prefix4, prefix6, limits, buckets, stats, clock, conns *ebpf.Map
	hostAddrs                                                                         *ebpf.Map
	// srcTable and srcExts are the per-source table (sources.go); nil in
	// pins of an xlimit from before it, which kept an LRU hash instead.
	srcTable, srcExts *ebpf.Map
	// srcFilter is the filter in front of them, whose entries count drops
	// that the ways' do not have yet; nil in pins of an xlimit from before
	// it.
	srcFilter *ebpf.Map
	// prefilter is nil in pins of an xlimit from before it: then no
	// generation is written with one (GlobalPrefilter), and the program
	// looks every source up.
	prefilter *ebpf.Map
	// flood holds the flood memo's drops (bpf/flood.h), which Counters adds
	// in; nil in pins of an xlimit from before it, which counted every drop
	// in stats.
	flood *ebpf.Map
	// confirm holds a pending confirmation's deadline (confirm.go); nil
	// in pins of an xlimit from before it, which never has one.
	confirm *ebpf.Map
	// fakeClock: the programs read the time from clock (SetClock), and so
	// do the deadlines' checks here.
	fakeClock bool
	cookie    *cookieMaps // cookie.go
	resp      *respMaps   // resptime.go
	owned     bool
}

// Tables returns access to the maps of loaded objects.
func (o *Objects) Tables() *Tables {
	m := &o.objs.xdpMaps
	return &Tables{
		gen: m.XlGen, config: m.XlConfig, rules: m.XlRules, ports: m.XlPorts,
		prefix4: m.XlPrefix4, prefix6: m.XlPrefix6, limits: m.XlLimits,
		buckets: m.XlBuckets, stats: m.XlStats, clock: m.XlClock, srcTable: m.XlSrcTable, srcExts: m.XlSrcExts,
		srcFilter: m.XlSrcFilter, conns: m.XlConns, hostAddrs: m.XlHostAddrs, prefilter: m.XlPrefilter, flood: m.XlFlood, confirm: m.XlConfirm,
		cookie: o.cookieMaps(), resp: o.respMaps(), fakeClock: o.fakeClock,
	}
}

// OpenPinned opens the maps pinned in dir. The caller must Close it.
func OpenPinned(dir string, readOnly bool) (*Tables, error) {
	if !pinned(dir, xdpMapXlGen) {
		return nil, fmt.Errorf("open %s: %w", dir, ErrNotPinned)
	}
	t := &Tables{owned: true}
	opts := &ebpf.LoadPinOptions{ReadOnly: readOnly}
	if err := openPins(dir, opts,
		pin{name: xdpMapXlGen, dst: &t.gen}, pin{name: xdpMapXlConfig, dst: &t.config}, pin{name: xdpMapXlRules, dst: &t.rules},
		pin{name: xdpMapXlPorts, dst: &t.ports}, pin{name: xdpMapXlPrefix4, dst: &t.prefix4}, pin{name: xdpMapXlPrefix6, dst: &t.prefix6},
		pin{name: xdpMapXlLimits, dst: &t.limits}, pin{name: xdpMapXlBuckets, dst: &t.buckets}, pin{name: xdpMapXlStats, dst: &t.stats},
		pin{name: xdpMapXlConns, dst: &t.conns}, pin{name: xdpMapXlHostAddrs, dst: &t.hostAddrs},
		// Absent in the pins of earlier releases (see the fields).
		pin{name: xdpMapXlSrcTable, dst: &t.srcTable, optional: true}, pin{name: xdpMapXlSrcExts, dst: &t.srcExts, optional: true},
		pin{name: xdpMapXlSrcFilter, dst: &t.srcFilter, optional: true}, pin{name: xdpMapXlPrefilter, dst: &t.prefilter, optional: true},
		pin{name: xdpMapXlFlood, dst: &t.flood, optional: true}, pin{name: xdpMapXlConfirm, dst: &t.confirm, optional: true},
	); err != nil {
		return nil, err
	}
	c, err := openCookieMaps(dir, opts)
	if err != nil {
		t.Close()
		return nil, err
	}
	t.cookie = c
	if t.resp, err = openRespMaps(dir, opts); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Close closes maps that OpenPinned opened; for Objects' tables it is a
// no-op (Objects.Close owns them).
func (t *Tables) Close() error {
	if !t.owned {
		return nil
	}
	return errors.Join(closeMaps(t.gen, t.config, t.rules, t.ports, t.prefix4, t.prefix6, t.prefilter, t.flood, t.confirm,
		t.limits, t.buckets, t.stats, t.srcTable, t.srcExts, t.srcFilter, t.conns, t.hostAddrs), t.cookie.close(), t.resp.close())
}

// ActiveGeneration returns the generation the programs read now.
func (t *Tables) ActiveGeneration() (uint32, error) {
	g, err := t.reloads()
	return g & 1, err
}

// reloads is xl_gen's value as the programs apply it (bpf/gen.h): a count
// of reloads whose lowest bit is the active generation. The program's
// flood memo (bpf/flood.h) holds it, so every reload voids the memos,
// even two within one tick that bring the same generation back, and so
// does the deadline of a change waiting for its confirmation (confirm.go).
func (t *Tables) reloads() (uint32, error) {
	return t.effective()
}

// Apply writes plan into the inactive generation and then makes it active,
// so the program switches from the old rules to the new ones between two
// packets. Bucket state and counters are untouched: rules keep their slots
// (dataplane.Compile) and their epochs. A change waiting for its
// confirmation ends: its previous rules come back first (Revert), and the
// plan replaces both.
func (t *Tables) Apply(p *dataplane.Plan) error {
	return t.apply(p, 0)
}

// apply is Apply, and ApplyConfirm with a deadline (not 0).
func (t *Tables) apply(p *dataplane.Plan, deadlineNS uint64) error {
	// Never write the generation a pending change returns to, nor the one
	// in force: settle it first.
	if _, err := t.Revert(); err != nil {
		return err
	}
	cur, err := t.rawGen()
	if err != nil {
		return err
	}
	next := cur + 1
	if err := t.writeGeneration(next&1, p); err != nil {
		return fmt.Errorf("write generation %d: %w", next&1, err)
	}
	if deadlineNS != 0 {
		w := xdpXlConfirmWait{DeadlineNs: deadlineNS, Gen: cur & 1}
		if err := t.confirm.Update(uint32(0), &w, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write the confirmation deadline: %w", err)
		}
		next |= genConfirm
	}
	if err := t.gen.Update(uint32(0), next, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("activate generation %d: %w", next&1, err)
	}
	return nil
}

func (t *Tables) writeGeneration(gen uint32, p *dataplane.Plan) error {
	keys := make([]uint32, dataplane.MaxRules)
	rules := make([]xdpXlRule, dataplane.MaxRules)
	for i := range rules {
		keys[i] = gen*dataplane.MaxRules + uint32(i)
		rules[i] = ruleToKernel(&p.Rules[i])
	}
	if _, err := t.rules.BatchUpdate(keys, rules, nil); err != nil {
		return fmt.Errorf("write rules: %w", err)
	}

	n := dataplane.PortProtos * dataplane.Ports
	pkeys := make([]uint32, n)
	pvals := make([]uint64, n)
	for i := range pkeys {
		pkeys[i] = gen<<17 | uint32(i)
		pvals[i] = p.Ports[uint32(i)]
	}
	if _, err := t.ports.BatchUpdate(pkeys, pvals, nil); err != nil {
		return fmt.Errorf("write ports: %w", err)
	}

	if err := t.writePrefixes(gen, p); err != nil {
		return err
	}
	flags := p.Globals.Flags &^ dataplane.GlobalPrefilter
	if t.prefilter != nil {
		if err := t.writePrefilter(gen, p.Prefilter()); err != nil {
			return err
		}
		flags |= dataplane.GlobalPrefilter
	}

	seed, err := t.SourceSeed()
	if err != nil {
		return err
	}
	g := xdpXlGlobals{
		Portless:    p.Globals.Portless,
		FragMatch:   p.Globals.FragMatch,
		SynOnly:     p.Globals.SynOnly,
		SrcFiltered: p.Globals.SrcFiltered,
		Concurrent:  p.Globals.Concurrent,
		Served:      p.Globals.Served,
		RespTime:    p.Globals.RespTime,
		NetnsCookie: netnsCookie(),
		Reset:       xdpXlBucket{Mult: p.Globals.Reset.Mult, Tol: p.Globals.Reset.Tol},
		Flags:       flags,
		SrcSeed:     seed,
	}
	// The globals after the prefilter: the generation's flag must not
	// come before its bitmap.
	if err := t.config.Update(gen, &g, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write globals: %w", err)
	}
	return t.writeCookies(gen, p)
}

func (t *Tables) writePrefixes(gen uint32, p *dataplane.Plan) error {
	// Remove what an earlier plan left in this generation.
	if err := deleteGeneration(t.prefix4, gen, func(k *xdpXlLpm4Key) uint32 { return k.Gen }); err != nil {
		return err
	}
	if err := deleteGeneration(t.prefix6, gen, func(k *xdpXlLpm6Key) uint32 { return k.Gen }); err != nil {
		return err
	}
	for _, e := range p.Prefix4 {
		k := xdpXlLpm4Key{Prefixlen: 32 + uint32(e.Prefix.Bits()), Gen: gen, Addr: e.Prefix.Addr().As4()}
		if err := writePrefix(t.prefix4, &k, e); err != nil {
			return err
		}
	}
	for _, e := range p.Prefix6 {
		k := xdpXlLpm6Key{Prefixlen: 32 + uint32(e.Prefix.Bits()), Gen: gen, Addr: e.Prefix.Addr().As16()}
		if err := writePrefix(t.prefix6, &k, e); err != nil {
			return err
		}
	}
	return nil
}

// prefilterKey is the key of a word of xl_prefilter (bpf/maps.h).
func prefilterKey(gen uint32, v6 bool, word int) uint32 {
	k := gen<<11 | uint32(word)
	if v6 {
		k |= 1 << 10
	}
	return k
}

// writePrefilter writes a generation's prefilter, both families, whole:
// every bit of an earlier plan is overwritten.
func (t *Tables) writePrefilter(gen uint32, f *dataplane.Prefilter) error {
	keys := make([]uint32, 0, 2*dataplane.PrefilterWords)
	vals := make([]uint64, 0, 2*dataplane.PrefilterWords)
	for i := range dataplane.PrefilterWords {
		keys = append(keys, prefilterKey(gen, false, i))
		vals = append(vals, f.V4[i])
	}
	for i := range dataplane.PrefilterWords {
		keys = append(keys, prefilterKey(gen, true, i))
		vals = append(vals, f.V6[i])
	}
	if _, err := t.prefilter.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("write prefilter: %w", err)
	}
	return nil
}

func writePrefix(m *ebpf.Map, key any, e dataplane.PrefixEntry) error {
	v := xdpXlPrefix{Rules: e.Rules, Flags: e.Flags}
	if err := m.Update(key, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write prefix %s: %w", e.Prefix, err)
	}
	return nil
}

// deleteGeneration removes the trie entries of one generation.
func deleteGeneration[K any](m *ebpf.Map, gen uint32, genOf func(*K) uint32) error {
	var k K
	var stale []K
	it := m.Iterate()
	for it.Next(&k, new(xdpXlPrefix)) {
		if genOf(&k) == gen {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("list prefixes: %w", err)
	}
	for i := range stale {
		if err := m.Delete(&stale[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete prefix: %w", err)
		}
	}
	return nil
}

// ReadPlan reads the active generation back into a Plan: what `xlimit
// status` shows, and what a restarted daemon compiles against so rules keep
// their slots.
func (t *Tables) ReadPlan() (*dataplane.Plan, error) {
	gen, err := t.ActiveGeneration()
	if err != nil {
		return nil, err
	}
	p := &dataplane.Plan{Ports: make(map[uint32]uint64)}
	for i := range p.Rules {
		var r xdpXlRule
		if err := t.rules.Lookup(gen*dataplane.MaxRules+uint32(i), &r); err != nil {
			return nil, fmt.Errorf("read rule %d: %w", i, err)
		}
		p.Rules[i] = ruleFromKernel(&r)
	}
	var g xdpXlGlobals
	if err := t.config.Lookup(gen, &g); err != nil {
		return nil, fmt.Errorf("read globals: %w", err)
	}
	p.Globals = dataplane.Globals{Portless: g.Portless, FragMatch: g.FragMatch, SynOnly: g.SynOnly, SrcFiltered: g.SrcFiltered, Concurrent: g.Concurrent,
		Served: g.Served, RespTime: g.RespTime,
		Reset: dataplane.Bucket{Mult: g.Reset.Mult, Tol: g.Reset.Tol}, Flags: g.Flags &^ dataplane.GlobalPrefilter}

	if p.Cookies, err = t.readCookies(gen); err != nil {
		return nil, err
	}
	vals, err := t.allPorts()
	if err != nil {
		return nil, err
	}
	for i := range uint32(dataplane.PortProtos * dataplane.Ports) {
		if v := vals[gen<<17|i]; v != 0 {
			p.Ports[i] = v
		}
	}

	var k4 xdpXlLpm4Key
	var v xdpXlPrefix
	it := t.prefix4.Iterate()
	for it.Next(&k4, &v) {
		if k4.Gen == gen {
			pfx := netip.PrefixFrom(netip.AddrFrom4(k4.Addr), int(k4.Prefixlen)-32)
			p.Prefix4 = append(p.Prefix4, dataplane.PrefixEntry{Prefix: pfx, Rules: v.Rules, Flags: v.Flags})
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read prefixes: %w", err)
	}
	var k6 xdpXlLpm6Key
	it = t.prefix6.Iterate()
	for it.Next(&k6, &v) {
		if k6.Gen == gen {
			pfx := netip.PrefixFrom(netip.AddrFrom16(k6.Addr), int(k6.Prefixlen)-32)
			p.Prefix6 = append(p.Prefix6, dataplane.PrefixEntry{Prefix: pfx, Rules: v.Rules, Flags: v.Flags})
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read prefixes: %w", err)
	}
	return p, nil
}

// allPorts reads the whole port array, both generations, in batches.
func (t *Tables) allPorts() ([]uint64, error) {
	n := int(t.ports.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]uint64, n)
	var cursor ebpf.MapBatchCursor
	read := 0
	for read < n {
		c, err := t.ports.BatchLookup(&cursor, keys[read:], vals[read:], nil)
		read += c
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read ports: %w", err)
		}
	}
	if read != n {
		return nil, fmt.Errorf("read ports: got %d of %d entries", read, n)
	}
	return vals, nil
}

func ruleToKernel(r *dataplane.Rule) xdpXlRule {
	k := xdpXlRule{
		Flags:      r.Flags,
		Epoch:      r.Epoch,
		Fallback:   xdpXlBucket{Mult: r.Fallback.Mult, Tol: r.Fallback.Tol},
		Source:     xdpXlBucket{Mult: r.Source.Mult, Tol: r.Source.Tol},
		BanAfterNs: r.BanAfterNS,
		BanNs:      r.BanNS,
		Prefix4:    r.Prefix4,
		Prefix6:    r.Prefix6,
		ConcSoft:   r.ConcSoft,
		ConcMax:    r.ConcMax,
		// Derived: the per-source entries' units (bucket.h, xl_units_decode).
		SourceUnits: dataplane.UnitsCode(r.Source.Tol),
	}
	for i := 0; i < len(r.Name) && i < len(k.Name)-1; i++ {
		k.Name[i] = int8(r.Name[i])
	}
	return k
}

func ruleFromKernel(k *xdpXlRule) dataplane.Rule {
	name := make([]byte, 0, len(k.Name))
	for _, c := range k.Name {
		if c == 0 {
			break
		}
		name = append(name, byte(c))
	}
	return dataplane.Rule{
		Name:       string(name),
		Flags:      k.Flags,
		Epoch:      k.Epoch,
		Fallback:   dataplane.Bucket{Mult: k.Fallback.Mult, Tol: k.Fallback.Tol},
		Source:     dataplane.Bucket{Mult: k.Source.Mult, Tol: k.Source.Tol},
		BanAfterNS: k.BanAfterNs,
		BanNS:      k.BanNs,
		Prefix4:    k.Prefix4,
		Prefix6:    k.Prefix6,
		ConcSoft:   k.ConcSoft,
		ConcMax:    k.ConcMax,
	}
}

// SetLimit writes the control loop's bucket for a slot.
func (t *Tables) SetLimit(slot int, l dataplane.Limit) error {
	v := xdpXlLimit{
		Bucket:     xdpXlBucket{Mult: l.Bucket.Mult, Tol: l.Bucket.Tol},
		DeadlineNs: l.DeadlineNS,
		Epoch:      l.Epoch,
		GateDrop:   l.Gate.Drop,
		GateProbes: l.Gate.Probes,
		GateRound:  l.Gate.Round,
		ConcCap:    l.ConcCap,
		ReqCap:     l.ReqCap,
	}
	if err := t.limits.Update(uint32(slot), &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write limit %d: %w", slot, err)
	}
	return nil
}

// Limit reads the control loop's bucket for a slot.
func (t *Tables) Limit(slot int) (dataplane.Limit, error) {
	var v xdpXlLimit
	if err := t.limits.Lookup(uint32(slot), &v); err != nil {
		return dataplane.Limit{}, fmt.Errorf("read limit %d: %w", slot, err)
	}
	return dataplane.Limit{Bucket: dataplane.Bucket{Mult: v.Bucket.Mult, Tol: v.Bucket.Tol}, DeadlineNS: v.DeadlineNs, Epoch: v.Epoch,
		Gate: dataplane.Gate{Drop: v.GateDrop, Probes: v.GateProbes, Round: v.GateRound}, ConcCap: v.ConcCap, ReqCap: v.ReqCap}, nil
}

// Conns reads the connections in flight to a slot's rule as the sock_ops
// program counted them, and the epoch of the rule they belong to.
func (t *Tables) Conns(slot int) (dataplane.Conns, error) {
	var v xdpXlConns
	if err := t.conns.Lookup(uint32(slot), &v); err != nil {
		return dataplane.Conns{}, fmt.Errorf("read connections %d: %w", slot, err)
	}
	return dataplane.Conns{Count: v.Count, Epoch: v.Epoch}, nil
}

// netnsCookie identifies the calling thread's network namespace, whose
// sockets the sock_ops program counts; 0 (count every namespace) where the
// kernel cannot tell (before 5.14).
func netnsCookie() uint64 {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0
	}
	return c
}

// Counters returns a slot's counters summed over CPUs, with the drops the
// flood memo counted on its own (bpf/flood.h): a rule slot's own, and all
// of them in the global slot.
func (t *Tables) Counters(slot int) (dataplane.Counters, error) {
	c, err := t.statsCounters(slot)
	if err != nil {
		return c, err
	}
	fl, err := t.floodCounts()
	if err != nil {
		return dataplane.Counters{}, err
	}
	fl[slot].addTo(&c)
	return c, nil
}

// AllCounters returns every slot's counters as Counters does, from one
// batch lookup of xl_stats.
func (t *Tables) AllCounters() ([dataplane.CounterSlots]dataplane.Counters, error) {
	var all [dataplane.CounterSlots]dataplane.Counters
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return all, fmt.Errorf("count CPUs: %w", err)
	}
	keys := make([]uint32, dataplane.CounterSlots)
	vals := make([]xdpXlCounters, dataplane.CounterSlots*ncpu)
	var cursor ebpf.MapBatchCursor
	n, err := t.stats.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return all, fmt.Errorf("read counters: %w", err)
	}
	if n != len(keys) {
		return all, fmt.Errorf("read counters: %d of %d slots", n, len(keys))
	}
	fl, err := t.floodCounts()
	if err != nil {
		return all, err
	}
	for i, k := range keys {
		all[k] = sumCounters(vals[i*ncpu : (i+1)*ncpu])
	}
	for i := range all {
		fl[i].addTo(&all[i])
	}
	return all, nil
}

// statsCounters returns a slot's counters in xl_stats, summed over CPUs.
func (t *Tables) statsCounters(slot int) (dataplane.Counters, error) {
	var per []xdpXlCounters
	if err := t.stats.Lookup(uint32(slot), &per); err != nil {
		return dataplane.Counters{}, fmt.Errorf("read counters %d: %w", slot, err)
	}
	return sumCounters(per), nil
}

// sumCounters sums one slot's per-CPU counters.
func sumCounters(per []xdpXlCounters) dataplane.Counters {
	var sum dataplane.Counters
	for i := range per {
		c := dataplane.Counters{Packets: per[i].Packets, Bytes: per[i].Bytes, Resets: per[i].Resets}
		copy(c.Reasons[:], per[i].Reasons[:]) // TestEnumsMatchBTF checks the lengths agree
		sum.Add(&c)
	}
	return sum
}

// floodCount is what the flood memo dropped for the rate.
type floodCount struct{ packets, bytes uint64 }

func (f floodCount) addTo(c *dataplane.Counters) {
	c.Packets[dataplane.VerdictDrop] += f.packets
	c.Bytes[dataplane.VerdictDrop] += f.bytes
	c.Reasons[dataplane.ReasonRule] += f.packets
}

// floodCounts returns the drops the flood memo counted by slot, summed
// over CPUs, and their total in the global slot. Each CPU's counts only
// grow, so adding them to xl_stats' keeps every counter monotonic.
func (t *Tables) floodCounts() ([dataplane.CounterSlots]floodCount, error) {
	var out [dataplane.CounterSlots]floodCount
	if t.flood == nil {
		return out, nil
	}
	var per []xdpXlFlood
	if err := t.flood.Lookup(uint32(0), &per); err != nil {
		return out, fmt.Errorf("read flood memo counts: %w", err)
	}
	for i := range per {
		for s, c := range per[i].Counts {
			out[s].packets += c.Packets
			out[s].bytes += c.Bytes
			out[dataplane.GlobalSlot].packets += c.Packets
			out[dataplane.GlobalSlot].bytes += c.Bytes
		}
	}
	return out, nil
}

// HostAddrs reads the host's addresses the program answers for
// (xl_host_addrs).
func (t *Tables) HostAddrs() (dataplane.HostAddrs, error) {
	out := dataplane.HostAddrs{}
	var k xdpXlHostKey
	var v xdpXlHostAddr
	it := t.hostAddrs.Iterate()
	for it.Next(&k, &v) {
		out[dataplane.HostKey{Kind: k.Kind, Addr: k.Addr}] = v.Ifindex
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read host addresses: %w", err)
	}
	return out, nil
}

// SetHostAddrs makes xl_host_addrs hold exactly want: addresses not in it
// are removed, the others added or updated. The program reads the map
// entry by entry, so an address kept in both is never missing meanwhile.
// With more than the map holds, what dataplane.SelectHostAddrs picks
// (callers select first, with their preferences). The mark that the map
// is incomplete (dataplane.IncompleteKey) goes in before anything is
// removed and out only after everything is written; every entry is tried
// whatever fails before it, and an entry that cannot be written leaves
// the mark in: a failure never leaves the map claiming to be complete.
// The daemon's lease (dataplane.LeaseKey) is left as it is: LeaseHostAddrs
// and ReleaseHostAddrs write it.
func (t *Tables) SetHostAddrs(want dataplane.HostAddrs) error {
	// One entry stays free for the daemon's lease (LeaseHostAddrs).
	if capacity := int(t.hostAddrs.MaxEntries()) - 1; len(want) > capacity {
		want, _ = dataplane.SelectHostAddrs(want, capacity)
	}
	have, err := t.HostAddrs()
	if err != nil {
		return errors.Join(fmt.Errorf("set host addresses: %w", err), t.MarkHostAddrsIncomplete())
	}
	var errs []error
	// A full map takes the mark only once the addresses that go are out.
	marked := have.Incomplete() || (want.Incomplete() && t.MarkHostAddrsIncomplete() == nil)
	for k := range have {
		if _, ok := want[k]; ok || k == dataplane.IncompleteKey || k == dataplane.LeaseKey {
			continue
		}
		kk := xdpXlHostKey{Kind: k.Kind, Addr: k.Addr}
		if err := t.hostAddrs.Delete(&kk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("remove host address: %w", err))
		}
	}
	if want.Incomplete() && !marked {
		if err := t.MarkHostAddrsIncomplete(); err != nil {
			errs = append(errs, err)
		}
	}
	failed := false
	for k, ifindex := range want {
		if old, ok := have[k]; (ok && old == ifindex) || k == dataplane.IncompleteKey || k == dataplane.LeaseKey {
			continue
		}
		kk := xdpXlHostKey{Kind: k.Kind, Addr: k.Addr}
		if err := t.hostAddrs.Update(&kk, &xdpXlHostAddr{Ifindex: ifindex}, ebpf.UpdateAny); err != nil {
			if !failed {
				errs = append(errs, fmt.Errorf("add host address: %w", err))
			}
			failed = true
		}
	}
	switch {
	case failed:
		if err := t.MarkHostAddrsIncomplete(); err != nil {
			errs = append(errs, err)
		}
	case !want.Incomplete() && len(errs) == 0:
		kk := xdpXlHostKey{Kind: dataplane.HostIncomplete}
		if err := t.hostAddrs.Delete(&kk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("remove the mark of incomplete host addresses: %w", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("set host addresses: %w", errors.Join(errs...))
	}
	return nil
}

// MarkHostAddrsIncomplete puts the mark that xl_host_addrs does not list
// every address of the host (dataplane.IncompleteKey) in, leaving the
// addresses as they are: when they cannot be read, the program answers for
// the last ones known, and a SYN-cookie port leaves a SYN to an unlisted
// destination to its bucket rather than dropping it.
func (t *Tables) MarkHostAddrsIncomplete() error {
	kk := xdpXlHostKey{Kind: dataplane.HostIncomplete}
	if err := t.hostAddrs.Update(&kk, &xdpXlHostAddr{}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("mark host addresses incomplete: %w", err)
	}
	return nil
}

// LeaseHostAddrs renews the daemon's lease on xl_host_addrs
// (dataplane.LeaseKey): the program trusts the map until
// dataplane.HostLeaseSeconds from now on the programs' clock (the fake
// one under FakeClock). Only a daemon that keeps the map up to date
// renews it, after a full write, and then every second.
func (t *Tables) LeaseHostAddrs() error {
	kk := xdpXlHostKey{Kind: dataplane.HostLease}
	if err := t.hostAddrs.Update(&kk, &xdpXlHostAddr{Ifindex: dataplane.LeaseEnd(t.now())}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("renew the lease on the host addresses: %w", err)
	}
	return nil
}

// HostAddrsMaintained reports whether host, as HostAddrs read it, carries
// a lease that has not ended on the programs' clock: what the program
// checks before it trusts the map (bpf/answer.h).
func (t *Tables) HostAddrsMaintained(host dataplane.HostAddrs) bool {
	return host.Maintained(t.now())
}

// ReleaseHostAddrs ends the daemon's lease on xl_host_addrs at once: a
// daemon that exits no longer follows the host's addresses, and the
// program leaves what it would answer by them to the kernel.
func (t *Tables) ReleaseHostAddrs() error {
	kk := xdpXlHostKey{Kind: dataplane.HostLease}
	if err := t.hostAddrs.Delete(&kk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("release the lease on the host addresses: %w", err)
	}
	return nil
}

// SetClock sets the time a program loaded with FakeClock reads.
func (t *Tables) SetClock(ns uint64) error {
	if t.clock == nil {
		return errors.New("set clock: no clock map")
	}
	if err := t.clock.Update(uint32(0), ns, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("set clock: %w", err)
	}
	return nil
}
