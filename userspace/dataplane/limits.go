package dataplane

// Capacities of the kernel's maps (bpf/maps.h) that a rules file fills or
// sizes, and the memory they take. userspace/config rejects a file beyond
// them at check time; maps reads what the kernel allocated (MapBytes is
// checked against it there). These are the only copies of these numbers in
// Go: config and maps both use them.
const (
	// MaxPrefixes is how many distinct prefixes of one family the allow
	// list, the deny list and every rule's sources may hold together in
	// one rules file: each is one entry of the family's trie, per
	// generation.
	MaxPrefixes = 65536
	// PrefixTrieEntries is max_entries of xl_prefix4 and xl_prefix6: both
	// generations share a trie, and during a reload both are full.
	PrefixTrieEntries = Generations * MaxPrefixes

	// DefaultSourceTableSize and MaxSourceTableSize bound the ways of the
	// per-source table (source_table_size; SrcSets rounds it up to a
	// power of two).
	DefaultSourceTableSize = 65536
	MaxSourceTableSize     = 1 << 25

	// MaxMapMemory is the ceiling on ConfigMapBytes, the estimated kernel
	// memory of the maps a rules file sizes, per interface: 1 GiB, a
	// per-source table of 2^24 entries (64 B each) less the tries.
	MaxMapMemory = 1 << 30
)

// Key and value sizes of the maps a rules file sizes (struct xl_src_set,
// xl_src_ext_set, xl_lpm4_key, xl_lpm6_key, xl_prefix). maps checks them
// against the compiled program.
const (
	SrcSetSize      = SrcWays * 32
	SrcExtSetSize   = SrcWays * 32
	LPM4KeySize     = 12
	LPM6KeySize     = 24
	PrefixValueSize = 16
)

// MapKind is the kind of a BPF map, as far as its memory is concerned.
type MapKind uint8

const (
	MapArray       MapKind = iota // preallocated values
	MapPerCPUArray                // a value per possible CPU
	MapLRUHash                    // preallocated elements and buckets
	MapHash                       // preallocated elements and buckets, plus one spare element per CPU
	MapLPMTrie                    // allocated per entry (BPF_F_NO_PREALLOC)
	MapOtherKind                  // not estimated
	// MapHashNoPrealloc is a hash with BPF_F_NO_PREALLOC: its buckets,
	// and its elements as they are used (each with the allocator's list
	// node). Last: the values above are the ones they always were.
	MapHashNoPrealloc
	// MapArrayMmap is an array with BPF_F_MMAPABLE (xl_src_table,
	// xl_src_exts, xl_requests): its header on a page of its own, its
	// values on whole pages, as the kernel's array_map_mem_usage counts.
	MapArrayMmap
)

// mapPage is the page the kernel rounds a mmappable array to (x86-64 and
// arm64 with 4 KiB pages: the machines xlimit is built for).
const mapPage = 4096

// Per-element overheads of the kernel's map implementations on 64-bit
// kernels (6.x): struct htab_elem, struct bucket, struct lpm_trie_node.
const (
	htabElemHeader = 48
	htabBucketSize = 16
	lpmNodeHeader  = 40
	llistNode      = 8 // bpf_mem_alloc's, before each element of a hash without preallocation
)

func round8(n uint64) uint64 { return (n + 7) &^ 7 }

func nextPow2(n uint64) uint64 {
	p := uint64(1)
	for p < n {
		p <<= 1
	}
	return p
}

// MapBytes estimates the kernel memory of a map the way the kernel accounts
// it (array_map_mem_usage, htab_map_mem_usage, trie_mem_usage), without the
// few hundred bytes of the map's own header. used is the number of entries
// in use, which only the memory of a trie and of a hash without
// preallocation depends on; ncpu is the number of
// possible CPUs, which only per-CPU maps depend on.
func MapBytes(kind MapKind, keySize, valueSize, maxEntries uint32, used, ncpu int) uint64 {
	k, v, n := round8(uint64(keySize)), round8(uint64(valueSize)), uint64(maxEntries)
	switch kind {
	case MapArray:
		return n * v
	case MapArrayMmap:
		return mapPage + (n*v+mapPage-1)/mapPage*mapPage
	case MapPerCPUArray:
		return n * (8 + v*uint64(max(ncpu, 1)))
	case MapLRUHash:
		return nextPow2(n)*htabBucketSize + n*(htabElemHeader+k+v)
	case MapHash:
		return nextPow2(n)*htabBucketSize + (n+uint64(max(ncpu, 1)))*(htabElemHeader+k+v)
	case MapHashNoPrealloc:
		return nextPow2(n)*htabBucketSize + uint64(max(used, 0))*(htabElemHeader+k+v+llistNode)
	case MapLPMTrie:
		// A node holds the key without its 4-byte prefix length.
		return uint64(max(used, 0)) * (lpmNodeHeader + uint64(keySize) - 4 + uint64(valueSize))
	}
	return 0
}

// ConfigMapBytes estimates the kernel memory of the maps a rules file
// sizes: the per-source table of sourceTableSize entries (its sets of ways
// and their rests, 64 B an entry after SrcSets' rounding) and the prefix
// tries with prefixes4 and prefixes6 distinct prefixes in each of the two
// generations (as during a reload). The other maps have fixed sizes (about
// 2.7 MiB, the 32 KiB source prefilter and the 1 MiB of the host-address
// map's buckets included, plus the per-CPU counters and 88 bytes per host
// address), or are bounded apart from the file (the per-source filter,
// at most SrcFilterMaxBytes and half the table); `xlimit status` reports
// them all.
func ConfigMapBytes(sourceTableSize, prefixes4, prefixes6 int) uint64 {
	sets := uint32(SrcSets(sourceTableSize))
	// The tables' values only: the header page of each (MapArrayMmap) is
	// left out of the ceiling, so that its sizes stay powers of two.
	return MapBytes(MapArray, 4, SrcSetSize, sets, 0, 0) + MapBytes(MapArray, 4, SrcExtSetSize, sets, 0, 0) +
		MapBytes(MapLPMTrie, LPM4KeySize, PrefixValueSize, PrefixTrieEntries, Generations*prefixes4, 0) +
		MapBytes(MapLPMTrie, LPM6KeySize, PrefixValueSize, PrefixTrieEntries, Generations*prefixes6, 0)
}
