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
// does not hold, seen once, and the TAT its packet left (2^-6 ns).
type frontWay struct {
	key SourceKey
	t   uint64
	// owner is frontOwner of the rule that wrote it (0: empty).
	owner uint32
}

// frontOwner is the Go model of source.h's xl_src_front_owner: the rule's
// epoch and per-source units folded, never 0. A reload that keeps the
// rule and its per-source settings keeps the ways.
func frontOwner(r *Rule) uint32 {
	return (r.Epoch ^ UnitsCode(r.Source.Tol)*0x9e3779b1) | 1
}

// srcFront is one CPU's front.
type srcFront [SrcFrontSets][SrcFrontWays]frontWay

// frontFree is the Go model of xl_src_front_free: w holds nothing at now
// (empty, of another owner, or its TAT passed).
func frontFree(w *frontWay, owner uint32, now uint64) bool {
	return w.owner != owner || int64(w.t-now) <= 0
}

// frontSeen is the Go model of xl_source_admit's front, for a source the
// table does not hold, at now (2^-6 ns): it returns the TAT the source's
// new entry starts at, and whether it gets none because the front took
// it (its packet passes).
func (m *Model) frontSeen(r *Rule, k SourceKey, now, inc uint64) (tat uint64, taken bool) {
	if m.front == nil {
		m.front = new(srcFront)
	}
	owner := frontOwner(r)
	set := &m.front[SrcFrontHash(k)&(SrcFrontSets-1)]
	var f *frontWay
	for i := range set {
		if w := &set[i]; w.owner == owner && w.key == k {
			f = w
			break
		}
	}
	if f != nil && !frontFree(f, owner, now) {
		t := f.t
		f.owner = 0
		return t, false
	}
	if f != nil && now-f.t < uint64(SrcPromoteNS)<<TimeShift {
		f.owner = 0
		return now, false
	}
	v := f
	for i := range set {
		if v == nil && frontFree(&set[i], owner, now) {
			v = &set[i]
		}
	}
	if v == nil {
		return now, false
	}
	*v = frontWay{key: k, t: now + inc, owner: owner}
	return 0, true
}

// Sources returns (a copy of) the model's per-source buckets.
func (m *Model) Sources() map[SourceKey]*SourceState {
	out := make(map[SourceKey]*SourceState, len(m.sources))
	for k, s := range m.sources {
		c := *s
		out[k] = &c
	}
	return out
}
