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

// Sources lists the per-source buckets (all of them when slot < 0),
// the most dropped first, at most n (n <= 0: all). Pins of an xlimit from
// before the set-associative table list none.
func (t *Tables) Sources(slot, n int) ([]Source, error) {
	if t.srcTable == nil || t.srcExts == nil {
		return nil, nil
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
