package dataplane

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"
)

// The per-source table (bpf/source.h, xl_src_table and xl_src_exts): sets
// of SrcWays ways; a source lives in one of its two sets (SrcSetsOf, by
// SrcHash under the table's seed).
const (
	SrcWays = 4
	// SrcBanned marks a banned source's way (xl_src_way.meta,
	// XL_SRC_BANNED): the last its set gives up.
	SrcBanned = 0x80000000
	// SrcDropsMax is where a way's drop count stops (XL_SRC_DROPS_MAX).
	SrcDropsMax = 0xffff0000
	// SrcPageSets: a source's second set is in its first's page of this
	// many sets (XL_SRC_PAGE_SETS).
	SrcPageSets = 32
)

// SrcSets is the number of sets of a per-source table of size sources
// (0: DefaultSourceTableSize): size rounded up to a power of two of at
// least SrcWays, divided by SrcWays.
func SrcSets(size int) int {
	if size <= 0 {
		size = DefaultSourceTableSize
	}
	size = max(size, SrcWays)
	return (1 << bits.Len(uint(size-1))) / SrcWays
}

// SrcFilterWays is XL_SRCF_WAYS: the entries of a line of the per-source
// filter (xl_src_filter), which with the line's stamp fill one cache line
// (SrcFilterLineSize bytes).
const (
	SrcFilterWays     = 7
	SrcFilterLineSize = 64
)

// SrcFilterLines is the per-source filter's lines per CPU
// (xl_cfg_srcf_lines) in front of a table of sets sets on ncpu CPUs: 8
// bytes for each of the table's ways on each CPU (a line of SrcFilterWays
// entries per 8 ways), as long as that keeps the filter within half the
// table's memory (8 bytes against 64 a way with its rest: RSS spreads the
// sources over the CPUs) and within SrcFilterMaxBytes on all CPUs
// together. A power of two, at least 1.
func SrcFilterLines(sets, ncpu int) int {
	ncpu = max(ncpu, 1)
	ways := sets * SrcWays
	entries := min(ways, 4*ways/ncpu, SrcFilterMaxBytes/8/ncpu)
	lines := max(entries*8/SrcFilterLineSize, 1)
	return 1 << (bits.Len(uint(lines)) - 1)
}

// SrcFilterMaxBytes bounds the per-source filter's memory, all CPUs'
// lines together (16 MiB).
const SrcFilterMaxBytes = 16 << 20

// srcMeta is a key's xl_src_way.meta.
func srcMeta(k SourceKey) uint32 {
	return k.Slot<<16 | uint32(k.Family)<<8 | uint32(k.PrefixLen)
}

// srcLong reports whether a key's address is longer than a way holds
// (IPv6 beyond /64).
func srcLong(k SourceKey) bool { return k.Family == 6 && k.PrefixLen > 64 }

// SrcHash is the Go model of source.h's xl_src_hash: the hash of a
// source's key under seed that picks its set (modulo the sets).
func SrcHash(k SourceKey, seed uint32) uint32 {
	h := (seed ^ srcMeta(k)) * 0x9e3779b1
	for i := range 4 {
		h = (h ^ binary.LittleEndian.Uint32(k.Addr[4*i:])) * 0x85ebca6b
		h ^= h >> 13
	}
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// SrcWay mirrors struct xl_src_way.
type SrcWay struct {
	Addr         uint64
	Meta, Units  uint32
	TAT          uint64
	Epoch, Drops uint32
}

// SrcExt mirrors struct xl_src_ext.
type SrcExt struct {
	Addr, OverSinceNS, BannedUntilNS uint64
	Meta, Epoch                      uint32
}

// SrcEntry decodes way w and its rest x into the source's key and state;
// false for an empty way, or a long key whose rest is another's.
func SrcEntry(w *SrcWay, x *SrcExt) (SourceKey, SourceState, bool) {
	meta := w.Meta &^ SrcBanned
	if meta == 0 {
		return SourceKey{}, SourceState{}, false
	}
	k := SourceKey{Slot: meta >> 16 & 0xff, Family: uint8(meta >> 8), PrefixLen: uint8(meta)}
	binary.LittleEndian.PutUint64(k.Addr[:8], w.Addr)
	rest := w.Addr
	if srcLong(k) {
		if x.Meta != meta {
			return SourceKey{}, SourceState{}, false
		}
		rest = x.Addr
		binary.LittleEndian.PutUint64(k.Addr[8:], x.Addr)
	}
	s := SourceState{TAT: w.TAT, Drops: uint64(w.Drops), Epoch: w.Epoch, Units: w.Units}
	if x.Meta == meta && x.Addr == rest && x.Epoch == w.Epoch {
		s.OverSinceNS, s.BannedUntilNS = x.OverSinceNS, x.BannedUntilNS
	}
	return k, s, true
}

// Prefix is the key's source prefix.
func (k SourceKey) Prefix() netip.Prefix {
	a := netip.AddrFrom16(k.Addr)
	if k.Family == 4 {
		a = netip.AddrFrom4([4]byte(k.Addr[:4]))
	}
	return netip.PrefixFrom(a, int(k.PrefixLen))
}

// srcSet is one set of the model's table.
type srcSet struct {
	ways [SrcWays]SrcWay
	exts [SrcWays]SrcExt
}

// srcTable is the model's per-source table: the sets in use.
type srcTable map[uint32]*srcSet

// SrcSetsOf is the Go model of source.h's xl_src_sets: key k's first
// and second set under seed in a table of sets sets (a power of two), the
// second in the first's page.
func SrcSetsOf(k SourceKey, seed uint32, sets int) (first, second uint32) {
	mask := uint32(sets - 1)
	near := mask & (SrcPageSets - 1)
	h := SrcHash(k, seed)
	g := h * 0x9e3779b1
	first = h & mask
	second = first&^near | (g^g>>16)&near
	if second == first {
		second = first ^ near&1
	}
	return first, second
}

// srcLocate is the Go model of source.h's xl_src_locate: the way of key k
// and its rest, in its first set or else its second, claimed (with claim)
// as a full bucket of rule r at now (2^-6 ns) when neither holds it; nil
// without claim then.
func (m *Model) srcLocate(k SourceKey, r *Rule, now uint64, claim bool) (*SrcWay, *SrcExt) {
	if m.sources == nil {
		m.sources = srcTable{}
	}
	sets := m.SrcSets
	if sets == 0 {
		sets = SrcSets(0)
	}
	meta := srcMeta(k)
	hi := binary.LittleEndian.Uint64(k.Addr[:8])
	lo := binary.LittleEndian.Uint64(k.Addr[8:])
	long := srcLong(k)
	a, b := SrcSetsOf(k, m.SrcSeed, sets)
	two := [2]*srcSet{m.srcSet(a), m.srcSet(b)}
	for _, set := range two {
		for i := range set.ways {
			w, x := &set.ways[i], &set.exts[i]
			if w.Addr == hi && w.Meta&^SrcBanned == meta && (!long || (x.Addr == lo && x.Meta == meta)) {
				return w, x
			}
		}
	}
	if !claim {
		return nil, nil
	}
	var best int64
	in, v, owed := 0, 0, 0
	for t, set := range two {
		vt, lead, n := srcVictim(set, now)
		if t == 0 || n < owed || (n == SrcWays && owed == SrcWays && lead < best) {
			best, in, v, owed = lead, t, vt, n
		}
	}
	set := two[in]
	w, x := &set.ways[v], &set.exts[v]
	*w = SrcWay{Addr: hi, Meta: meta, TAT: now, Units: UnitsCode(r.Source.Tol), Epoch: r.Epoch}
	if long && (x.Addr != lo || x.Meta != meta) {
		*x = SrcExt{Addr: lo, Meta: meta, Epoch: x.Epoch}
	}
	return w, x
}

// srcSet is the model's set i, made on first use.
func (m *Model) srcSet(i uint32) *srcSet {
	set := m.sources[i]
	if set == nil {
		set = new(srcSet)
		m.sources[i] = set
	}
	return set
}

// srcVictim is the Go model of source.h's xl_src_victim: the way of set
// whose loss costs least at now, how much its source owes, and how many
// of the set's sources owe something.
func srcVictim(set *srcSet, now uint64) (int, int64, int) {
	v, least, owing := 0, int64(math.MaxInt64), 0
	for i := range set.ways {
		w := &set.ways[i]
		lead := int64(w.TAT - now)
		switch {
		case w.Meta == 0:
			lead = -math.MaxInt64
		case w.Meta&SrcBanned != 0 && set.exts[i].BannedUntilNS > now>>TimeShift:
			lead = math.MaxInt64 - 1
		}
		if lead > 0 {
			owing++
		}
		if lead < least {
			least, v = lead, i
		}
	}
	return v, least, owing
}

// srcBan is the Go model of source.h's xl_src_ban: a ban rule's verdict
// for the source of way w (its rest x, key k) at nowNS.
func srcBan(w *SrcWay, x *SrcExt, k SourceKey, r *Rule, nowNS uint64, ok, refilled bool) bool {
	meta := srcMeta(k)
	addr := w.Addr
	if srcLong(k) {
		addr = binary.LittleEndian.Uint64(k.Addr[8:])
	}
	if x.Meta != meta || x.Addr != addr || x.Epoch != w.Epoch {
		*x = SrcExt{Addr: addr, Meta: meta, Epoch: w.Epoch}
	}
	if refilled {
		x.OverSinceNS = 0
	}
	switch {
	case x.BannedUntilNS != 0 && nowNS < x.BannedUntilNS:
		ok = false
	case x.BannedUntilNS != 0 && !ok:
		x.BannedUntilNS = nowNS + r.BanNS
	case x.BannedUntilNS != 0:
		x.BannedUntilNS = 0
	case !ok:
		if x.OverSinceNS == 0 {
			x.OverSinceNS = nowNS
		}
		if nowNS-x.OverSinceNS >= r.BanAfterNS {
			x.BannedUntilNS = nowNS + r.BanNS
		}
	}
	if w.Meta != 0 {
		if x.BannedUntilNS != 0 {
			w.Meta |= SrcBanned
		} else {
			w.Meta &^= SrcBanned
		}
	}
	return ok
}

// Sources returns (a copy of) the model's per-source buckets, their drops
// with what the filter's entries count (as maps' Tables.Sources).
func (m *Model) Sources() map[SourceKey]*SourceState {
	out := map[SourceKey]*SourceState{}
	for _, set := range m.sources {
		for i := range set.ways {
			if k, s, ok := SrcEntry(&set.ways[i], &set.exts[i]); ok {
				if m.srcFilter != nil {
					fp := SrcFilterFP(k, m.SrcSeed, set.ways[i].Epoch, set.ways[i].Units)
					s.Drops = min(s.Drops+srcfPending(&m.srcFilterLineOf(k).e, fp), SrcDropsMax)
				}
				out[k] = &s
			}
		}
	}
	return out
}
