//go:build linux

package maps

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Source is one entry of the per-source table.
type Source struct {
	Slot   int
	Prefix netip.Prefix
	dataplane.SourceState
}

// SourceSeed returns the per-source table's hash key (xl_globals.src_seed,
// bpf/source.h's xl_src_hash): the one a generation holds already, so that
// a reload or a restart over the pins keeps every source in its set, or a
// new random one when neither has one (a fresh load, or pins of an xlimit
// from before the table). Apply writes it into every generation it writes.
func (t *Tables) SourceSeed() (uint32, error) {
	for gen := range uint32(2) {
		var g xdpXlGlobals
		if err := t.config.Lookup(gen, &g); err != nil {
			return 0, fmt.Errorf("read globals: %w", err)
		}
		if g.SrcSeed != 0 {
			return g.SrcSeed, nil
		}
	}
	var b [4]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, fmt.Errorf("draw the per-source table's seed: %w", err)
		}
		if s := binary.LittleEndian.Uint32(b[:]); s != 0 {
			return s, nil
		}
	}
}

// SourceSets is the number of sets of the loaded per-source table.
func (o *Objects) SourceSets() int {
	return int(o.objs.XlSrcTable.MaxEntries())
}

// SourceFilterLines is the number of lines of the per-source filter
// (xl_src_filter) each CPU has (dataplane.SrcFilterLines).
func (o *Objects) SourceFilterLines() (int, error) {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return 0, fmt.Errorf("count CPUs: %w", err)
	}
	return int(o.objs.XlSrcFilter.MaxEntries()) / ncpu, nil
}

// Sources lists the per-source buckets (all of them when slot < 0),
// the most dropped first, at most n (n <= 0: all). A source's drops
// include those its entries in the filter hold (every CPU's), not yet
// in its way. Pins of an xlimit from before the set-associative table
// list none.
func (t *Tables) Sources(slot, n int) ([]Source, error) {
	if t.srcTable == nil || t.srcExts == nil {
		return nil, nil
	}
	pending, err := t.srcPending()
	if err != nil {
		return nil, err
	}
	var out []Source
	sets := make([]xdpXlSrcSet, srcChunk)
	exts := make([]xdpXlSrcExtSet, srcChunk)
	keys := make([]uint32, srcChunk)
	var tc, ec ebpf.MapBatchCursor
	for {
		got, err := readChunk(t.srcTable, &tc, keys, sets)
		if err != nil {
			return nil, fmt.Errorf("read sources: %w", err)
		}
		if got == 0 {
			break
		}
		if g, err := readChunk(t.srcExts, &ec, keys, exts); err != nil || g != got {
			return nil, fmt.Errorf("read sources' rests: %d of %d sets: %w", g, got, err)
		}
		for i := range got {
			for j, w := range sets[i].Way {
				if w.Meta == 0 || (slot >= 0 && int(w.Meta>>16&0xff) != slot) {
					continue
				}
				x := &exts[i].Ext[j]
				k, s, ok := dataplane.SrcEntry(
					&dataplane.SrcWay{Addr: w.Addr, Meta: w.Meta, Units: w.Units, TAT: w.Tat, Epoch: w.Epoch, Drops: w.Drops},
					&dataplane.SrcExt{Addr: x.Addr, OverSinceNS: x.OverSinceNs, BannedUntilNS: x.BannedUntilNs, Meta: x.Meta, Epoch: x.Epoch})
				if ok {
					s.Drops = min(s.Drops+pending(k, w.Epoch, w.Units), dataplane.SrcDropsMax)
					out = append(out, Source{Slot: int(k.Slot), Prefix: k.Prefix(), SourceState: s})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Source) int { return cmp.Compare(b.Drops, a.Drops) })
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out, nil
}

// srcPending reads the per-source filter, every CPU's lines, and returns
// what its entries count for a source of key k under a rule of epoch and
// units (dataplane.SrcFilterPending). Without a filter, nothing.
func (t *Tables) srcPending() (func(k dataplane.SourceKey, epoch, units uint32) uint64, error) {
	none := func(dataplane.SourceKey, uint32, uint32) uint64 { return 0 }
	if t.srcFilter == nil {
		return none, nil
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("read the per-source filter: %w", err)
	}
	seed, err := t.SourceSeed()
	if err != nil {
		return nil, err
	}
	all := make([]xdpXlSrcfLine, t.srcFilter.MaxEntries())
	keys := make([]uint32, len(all))
	var c ebpf.MapBatchCursor
	if got, err := readChunk(t.srcFilter, &c, keys, all); err != nil || got != len(all) {
		return nil, fmt.Errorf("read the per-source filter: %d of %d lines: %w", got, len(all), err)
	}
	lines := make([][dataplane.SrcFilterWays]uint64, len(all))
	for i := range all {
		lines[i] = all[i].E
	}
	per := len(lines) / ncpu
	return func(k dataplane.SourceKey, epoch, units uint32) uint64 {
		return dataplane.SrcFilterPending(lines, per, k, seed, epoch, units)
	}, nil
}

// srcChunk is how many sets Sources reads per batch (128 KiB of ways).
const srcChunk = 1024

// readChunk reads up to len(vals) entries of array m from cursor c: how
// many, 0 at the end.
func readChunk[V any](m *ebpf.Map, c *ebpf.MapBatchCursor, keys []uint32, vals []V) (int, error) {
	read := 0
	for read < len(vals) {
		n, err := m.BatchLookup(c, keys[read:], vals[read:], nil)
		read += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return read, err
		}
	}
	return read, nil
}
