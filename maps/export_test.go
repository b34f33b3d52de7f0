//go:build linux

package maps

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// What only the tests of this package read or write of the maps.

// SetConns overwrites a slot's count of connections in flight (tests).
func (t *Tables) SetConns(slot int, c dataplane.Conns) error {
	v := xdpXlConns{Count: c.Count, Epoch: c.Epoch}
	if err := t.conns.Update(uint32(slot), &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write connections %d: %w", slot, err)
	}
	return nil
}

// BucketTAT reads the theoretical arrival time of a slot's bucket (2^-6 ns)
// and the epoch it belongs to.
func (t *Tables) BucketTAT(slot int) (tat uint64, epoch uint32, err error) {
	var v xdpXlBucketState
	if err := t.buckets.Lookup(uint32(slot), &v); err != nil {
		return 0, 0, fmt.Errorf("read bucket %d: %w", slot, err)
	}
	return v.Tat, v.Epoch, nil
}
