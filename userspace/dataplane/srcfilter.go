package dataplane

// The Go model of the per-source filter (source.h, xl_srcf_*): in front
// of the table, each CPU's own lines of SrcFilterWays entries, an entry
// remembering till when a source that the table refused is refused
// anyway, and the line stamped with its last write. The model is one CPU,
// so it has one CPU's lines.

const (
	// SrcFilterShift is XL_SRCF_SHIFT: an entry's till counts units of
	// 2^SrcFilterShift ns.
	SrcFilterShift = 20
	// SrcFilterMaxWait is XL_SRCF_MAX_WAIT, in those units.
	SrcFilterMaxWait = 1 << 22
	// SrcFilterCountMax is XL_SRCF_COUNT_MAX.
	SrcFilterCountMax = 0xff
	// srcFilterMaxWaitNS is XL_SRCF_MAX_WAIT_NS: a line not written for
	// longer holds no live entry.
	srcFilterMaxWaitNS = uint64(SrcFilterMaxWait) << SrcFilterShift
)

// srcFilterLine is one line of the filter (struct xl_srcf_line).
type srcFilterLine struct {
	stamp uint64 // ns, its last write
	e     [SrcFilterWays]uint64
}

// SrcFilterFP is the Go model of source.h's xl_srcf_fp: key k's
// fingerprint under seed for a rule of epoch whose per-source settings
// have units (xl_rule.source_units).
func SrcFilterFP(k SourceKey, seed, epoch, units uint32) uint32 {
	salt := 0x6a09e667 ^ epoch*0x9e3779b1 ^ units*0x85ebca6b
	return SrcHash(k, seed^salt) | 1
}

// SrcFilterPending is what a filter's entries count for the source of key
// k (of a rule of epoch and units, under seed): packets they refused that
// its way's drops do not have yet. lines are every CPU's, per of them
// each.
func SrcFilterPending(lines [][SrcFilterWays]uint64, per int, k SourceKey, seed, epoch, units uint32) uint64 {
	if per <= 0 {
		return 0
	}
	fp := SrcFilterFP(k, seed, epoch, units)
	at := int(SrcHash(k, seed) & uint32(per-1))
	var n uint64
	for c := 0; c+per <= len(lines); c += per {
		n += srcfPending(&lines[c+at], fp)
	}
	return n
}

// srcfPending is what entries es of fingerprint fp count.
func srcfPending(es *[SrcFilterWays]uint64, fp uint32) uint64 {
	var n uint64
	for _, e := range es {
		if uint32(e>>32) == fp {
			n += e & 0xff
		}
	}
	return n
}

// srcFilterLineOf is the model's line for key k (xl_srcf_line, on its
// one CPU).
func (m *Model) srcFilterLineOf(k SourceKey) *srcFilterLine {
	lines := m.SrcFilterLines
	if lines == 0 {
		sets := m.SrcSets
		if sets == 0 {
			sets = SrcSets(0)
		}
		lines = SrcFilterLines(sets, 1)
	}
	if m.srcFilter == nil {
		m.srcFilter = map[uint32]*srcFilterLine{}
	}
	i := SrcHash(k, m.SrcSeed) & uint32(lines-1)
	l := m.srcFilter[i]
	if l == nil {
		l = &srcFilterLine{}
		m.srcFilter[i] = l
	}
	return l
}

// srcfLive is xl_srcf_live: whether entry e still refuses at n (now in
// the filter's units).
func srcfLive(e uint64, n uint32) bool {
	d := (uint32(e>>8) - n) & 0xffffff
	return d != 0 && d <= SrcFilterMaxWait
}

// srcfFind is xl_srcf_find: the entry of l with fingerprint fp (the last
// of them), or -1.
func srcfFind(l *srcFilterLine, fp uint32) int {
	f := -1
	for i, e := range l.e {
		if uint32(e>>32) == fp {
			f = i
		}
	}
	return f
}

// srcfHolds is xl_srcf_holds: whether entry i of l still refuses its
// source at nowNS.
func srcfHolds(l *srcFilterLine, i int, nowNS uint64) bool {
	return nowNS-l.stamp <= srcFilterMaxWaitNS && srcfLive(l.e[i], uint32(nowNS>>SrcFilterShift))
}

// srcfWrite is xl_srcf_write: the entry of fingerprint fp (at way, or
// -1: none yet) at nowNS says refused till tillNS, or goes when that is
// not a whole unit ahead; before an entry is written, every entry that
// refuses no more is marked so, and the line stamped.
func srcfWrite(l *srcFilterLine, way int, fp uint32, nowNS, tillNS uint64) {
	n := uint32(nowNS >> SrcFilterShift)
	var w uint64
	if tillNS > nowNS {
		w = tillNS>>SrcFilterShift - nowNS>>SrcFilterShift // all 64 bits of now, not n's 32
	}
	w = min(w, SrcFilterMaxWait)
	if w == 0 {
		if way >= 0 {
			l.e[way] = 0
		}
		return
	}
	stale := nowNS-l.stamp > srcFilterMaxWaitNS
	for j, e := range l.e {
		if e != 0 && (stale || !srcfLive(e, n)) {
			l.e[j] = e&^(0xffffff<<8) | uint64(n&0xffffff)<<8
		}
	}
	l.stamp = nowNS
	if way < 0 {
		way = int(fp % SrcFilterWays)
		for j := SrcFilterWays - 1; j >= 0; j-- {
			if l.e[j]>>32 == 0 || !srcfLive(l.e[j], n) {
				way = j
			}
		}
	}
	l.e[way] = uint64(fp)<<32 | uint64((n+uint32(w))&0xffffff)<<8
}
