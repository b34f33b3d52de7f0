package dataplane

import "testing"

func TestConfigMapBytes(t *testing.T) {
	// The per-source table dominates: 128 B an entry (48 B of element
	// header, 24 B key, 40 B value, 16 B of bucket).
	if got, want := ConfigMapBytes(DefaultSourceTableSize, 0, 0), uint64(DefaultSourceTableSize*128); got != want {
		t.Errorf("default table: %d B, want %d", got, want)
	}
	if got := ConfigMapBytes(DefaultSourceTableSize, MaxPrefixes, MaxPrefixes); got > MaxMapMemory {
		t.Errorf("the default table with full tries (%d B) is over the ceiling", got)
	}
	if got := ConfigMapBytes(MaxSourceTableSize, 0, 0); got <= MaxMapMemory {
		t.Errorf("the largest table (%d B) fits the ceiling: the ceiling checks nothing", got)
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
