package dataplane

import "testing"

func TestConfigMapBytes(t *testing.T) {
	// The per-source table dominates: 64 B an entry (a 32-byte way and
	// its 32-byte rest), the entries rounded up to a power of two.
	if got, want := ConfigMapBytes(DefaultSourceTableSize, 0, 0), uint64(DefaultSourceTableSize*64); got != want {
		t.Errorf("default table: %d B, want %d", got, want)
	}
	if got, want := ConfigMapBytes(100000, 0, 0), uint64(131072*64); got != want {
		t.Errorf("a table of 100000: %d B, want %d (131072 entries)", got, want)
	}
	for _, c := range []struct{ size, sets int }{{0, 16384}, {1, 1}, {4, 1}, {5, 2}, {65536, 16384}, {65537, 32768}} {
		if got := SrcSets(c.size); got != c.sets {
			t.Errorf("SrcSets(%d) = %d, want %d", c.size, got, c.sets)
		}
	}
	if got := ConfigMapBytes(DefaultSourceTableSize, MaxPrefixes, MaxPrefixes); got > MaxMapMemory {
		t.Errorf("the default table with full tries (%d B) is over the ceiling", got)
	}
	if got := ConfigMapBytes(MaxSourceTableSize, 1, 1); got <= MaxMapMemory {
		t.Errorf("the largest table with a prefix of each family (%d B) fits the ceiling: the ceiling checks nothing", got)
	}
	// Tries: both generations of every prefix, node + key bits + value.
	if got, want := ConfigMapBytes(1, 10, 0)-ConfigMapBytes(1, 0, 0), uint64(2*10*(40+8+16)); got != want {
		t.Errorf("10 IPv4 prefixes: %d B, want %d", got, want)
	}
	if got, want := MapBytes(MapPerCPUArray, 4, 36, 10, 0, 4), uint64(10*(8+40*4)); got != want {
		t.Errorf("per-CPU array: %d B, want %d", got, want)
	}
	if got, want := MapBytes(MapHash, 4, 8, 100, 0, 2), uint64(128*16+102*(48+8+8)); got != want {
		t.Errorf("hash: %d B, want %d", got, want)
	}
}

// TestSrcFilterLines checks the per-source filter's size: a line per 8
// ways on each CPU where that fits, never more than half the table's memory or
// SrcFilterMaxBytes in all, a power of two of lines.
func TestSrcFilterLines(t *testing.T) {
	for _, c := range []struct{ size, ncpu, lines int }{
		{DefaultSourceTableSize, 1, 8192},
		{DefaultSourceTableSize, 2, 8192},
		{DefaultSourceTableSize, 4, 8192},
		{DefaultSourceTableSize, 8, 4096},
		{DefaultSourceTableSize, 64, 512},
		{MaxSourceTableSize, 2, 1 << 17},
		{MaxSourceTableSize, 256, 1 << 10},
		{1, 2, 1},
		{100, 3, 16},
	} {
		sets := SrcSets(c.size)
		got := SrcFilterLines(sets, c.ncpu)
		if got != c.lines {
			t.Errorf("SrcFilterLines(%d sets, %d CPUs) = %d, want %d", sets, c.ncpu, got, c.lines)
		}
		if got&(got-1) != 0 {
			t.Errorf("SrcFilterLines(%d sets, %d CPUs) = %d: not a power of two", sets, c.ncpu, got)
		}
		bytes := got * c.ncpu * SrcFilterLineSize
		if got > 1 && (bytes > sets*(SrcSetSize+SrcExtSetSize)/2 || bytes > SrcFilterMaxBytes) {
			t.Errorf("%d sets, %d CPUs: a filter of %d bytes", sets, c.ncpu, bytes)
		}
	}
}
