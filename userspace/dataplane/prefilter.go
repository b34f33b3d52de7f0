package dataplane

import (
	"encoding/binary"
	"net/netip"
)

// Geometry of the source prefilter (xl_prefilter, XL_PREFILTER_WORDS and
// XL_PREFILTER_HASH in bpf/types.h).
const (
	// PrefilterBits is the number of bits of one family's prefilter.
	PrefilterBits = 1 << 16
	// PrefilterWords is the number of 64-bit words that hold them.
	PrefilterWords = PrefilterBits / 64
	// prefilterHash multiplies the top 32 bits of an IPv6 address: the
	// top 16 bits of the 32-bit product are its bit (Fibonacci hashing).
	prefilterHash = 0x9e3779b1
)

// Prefilter is one generation's bitmaps in front of the prefix tries: a
// clear bit says that no entry of the trie can contain a source with that
// bit, so the kernel skips the lookup (bpf/match.h). It has no false
// negatives; a set bit only says "look it up".
//
//   - IPv4: bit i is the /16 block i (the address's first two bytes), set
//     when an entry overlaps that /16: an entry of /16 or shorter sets every
//     /16 it covers, a longer one its own.
//   - IPv6: bit i is PrefilterIndex6 of the address, a hash of its top 32
//     bits; an entry of /32 or longer sets the bit of its top 32 bits, and
//     one shorter than /32, whose addresses' top 32 bits cannot be listed,
//     sets every bit (the filter then skips nothing).
type Prefilter struct {
	V4, V6 [PrefilterWords]uint64
}

// PrefilterIndex4 is an IPv4 address's bit: its /16.
func PrefilterIndex4(a [4]byte) uint32 { return uint32(a[0])<<8 | uint32(a[1]) }

// PrefilterIndex6 is an IPv6 address's bit: the hash of its top 32 bits.
func PrefilterIndex6(a [16]byte) uint32 {
	return (binary.BigEndian.Uint32(a[:4]) * prefilterHash) >> 16
}

// NewPrefilter computes the prefilter of a generation's trie entries
// (Plan.Prefix4 and Plan.Prefix6). Its cost is the entries plus the /16s
// that the short IPv4 ones cover: at most 65536 bits a family.
func NewPrefilter(v4, v6 []PrefixEntry) *Prefilter {
	f := &Prefilter{}
	for _, e := range v4 {
		first := PrefilterIndex4(e.Prefix.Masked().Addr().As4())
		n := uint32(1)
		if b := e.Prefix.Bits(); b < 16 {
			n = 1 << (16 - b)
		}
		f.setRange4(first, n)
	}
	for _, e := range v6 {
		if e.Prefix.Bits() < 32 {
			for i := range f.V6 {
				f.V6[i] = ^uint64(0)
			}
			break
		}
		i := PrefilterIndex6(e.Prefix.Masked().Addr().As16())
		f.V6[i/64] |= 1 << (i % 64)
	}
	return f
}

// setRange4 sets n IPv4 bits from first (n a power of two, first a multiple
// of it).
func (f *Prefilter) setRange4(first, n uint32) {
	for i := first; i < first+n; {
		if i%64 == 0 && first+n-i >= 64 {
			f.V4[i/64] = ^uint64(0)
			i += 64
			continue
		}
		f.V4[i/64] |= 1 << (i % 64)
		i++
	}
}

// Prefilter computes the prefilter of the plan's prefix entries.
func (p *Plan) Prefilter() *Prefilter { return NewPrefilter(p.Prefix4, p.Prefix6) }

// MayContain reports whether the prefilter lets addr through to the trie:
// false means that no entry it was computed from contains addr.
func (f *Prefilter) MayContain(addr netip.Addr) bool {
	if addr.Is4() {
		i := PrefilterIndex4(addr.As4())
		return f.V4[i/64]>>(i%64)&1 != 0
	}
	i := PrefilterIndex6(addr.As16())
	return f.V6[i/64]>>(i%64)&1 != 0
}
