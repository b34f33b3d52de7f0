package dataplane

import "encoding/binary"

// The front of the per-source table (bpf/source.h, xl_src_front): per CPU,
// SrcFrontSets sets of SrcFrontWays ways, indexed by SrcFrontHash.
const (
	SrcFrontSets = 16384
	SrcFrontWays = 2
	// SrcFrontBlock is how many sets one entry of the map holds (32 KiB
	// a CPU: a per-CPU value's largest size).
	SrcFrontBlock = 512
	// SrcFrontDropsMax is what a way's count of refusals holds (a u16).
	SrcFrontDropsMax = 0xffff
)

// SrcFrontHash is the Go model of source.h's xl_src_front_hash: the hash of
// a source's key that picks its set (modulo SrcFrontSets).
func SrcFrontHash(k SourceKey) uint32 {
	tag := k.Slot
	if k.Family == 6 {
		tag |= 0x40
	}
	h := tag * 0x9e3779b1
	for i := range 4 {
		h = (h ^ binary.LittleEndian.Uint32(k.Addr[4*i:])) * 0x85ebca6b
		h ^= h >> 13
	}
	return h
}

// frontWay is the Go model of struct xl_src_front: a source that the table
// does not hold (seen: t is its TAT) or that its bucket refuses while now
// is before t (over); times in 2^-6 ns.
type frontWay struct {
	key SourceKey
	t   uint64
	// plan and reloads stand for xl_gen's raw value when written (plan
	// nil: empty), as in floodMemo.
	plan    *Plan
	reloads uint64
	drops   uint16
	over    bool
}

// srcFront is one CPU's front.
type srcFront [SrcFrontSets][SrcFrontWays]frontWay

// current reports whether w was written in the model's generation.
func (m *Model) frontCurrent(w *frontWay) bool {
	return w.plan != nil && w.plan == m.Plan && w.reloads == m.reloads
}

// frontFree is the Go model of xl_src_front_free: w holds nothing at now.
func (m *Model) frontFree(w *frontWay, now uint64) bool {
	return !m.frontCurrent(w) || int64(w.t-now) <= 0
}

// frontFind is the Go model of xl_source_admit's lookup of the front at
// now (2^-6 ns): the source's way (nil when it has none) and the way it
// takes (its own, else xl_src_front_victim's: nil when none may go).
func (m *Model) frontFind(k SourceKey, now uint64) (f, v *frontWay) {
	if m.front == nil {
		m.front = new(srcFront)
	}
	set := &m.front[SrcFrontHash(k)&(SrcFrontSets-1)]
	for i := range set {
		if m.frontCurrent(&set[i]) && set[i].key == k {
			return &set[i], &set[i]
		}
	}
	a, b := &set[0], &set[1]
	switch {
	case m.frontFree(a, now):
		return nil, a
	case m.frontFree(b, now):
		return nil, b
	case a.over && (!b.over || int64(a.t-b.t) <= 0):
		return nil, a
	case b.over:
		return nil, b
	}
	return nil, nil
}

// frontPut is the Go model of xl_src_front_put: the source of k takes w;
// a way of another source first adds its refusals to that source's entry
// (xl_src_front_flush, of any generation).
func (m *Model) frontPut(w *frontWay, k SourceKey, t uint64, over bool) {
	if !(m.frontCurrent(w) && w.key == k) && w.plan != nil && w.drops != 0 {
		if s, ok := m.sources[w.key]; ok {
			s.Drops += uint64(w.drops)
		}
	}
	*w = frontWay{key: k, t: t, plan: m.Plan, reloads: m.reloads, over: over}
}

// Sources returns the model's per-source buckets as the kernel's reader
// lists them (maps.Tables.Sources): each entry's drops with those its
// ways have not added yet.
func (m *Model) Sources() map[SourceKey]*SourceState {
	out := make(map[SourceKey]*SourceState, len(m.sources))
	for k, s := range m.sources {
		c := *s
		out[k] = &c
	}
	if m.front != nil {
		for i := range m.front {
			for j := range m.front[i] {
				w := &m.front[i][j]
				if s, ok := out[w.key]; ok && w.plan != nil {
					s.Drops += uint64(w.drops)
				}
			}
		}
	}
	return out
}
