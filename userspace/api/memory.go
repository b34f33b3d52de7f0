package api

// MemoryStatus is the kernel memory of an interface's maps: what the kernel
// reports (memlock) and xlimit's estimate from each map's geometry
// (docs/robustness.md), per map, largest first, and in total.
type MemoryStatus struct {
	MemlockBytes  uint64      `json:"memlock_bytes"`
	EstimateBytes uint64      `json:"estimate_bytes"`
	Maps          []MapMemory `json:"maps"`
}

// MapMemory is one map of a MemoryStatus.
type MapMemory struct {
	Name          string `json:"name"`
	Type          string `json:"type"`
	KeySize       uint32 `json:"key_size"`
	ValueSize     uint32 `json:"value_size"`
	MaxEntries    uint32 `json:"max_entries"`
	MemlockBytes  uint64 `json:"memlock_bytes"` // 0: the kernel does not say
	EstimateBytes uint64 `json:"estimate_bytes"`
}
