//go:build linux

package loader

import "testing"

// virtio_net shares the stack's queue pairs with XDP_TX when a pair per CPU
// does not fit beside them (virtnet_xdp_set); other drivers never warn.
func TestVirtioSharedXDPTx(t *testing.T) {
	for _, c := range []struct {
		driver        string
		combined, max uint32
		cpus          int
		want          bool
	}{
		{"virtio_net", 4, 4, 2, true},  // every pair in use: the realhost lab's panic
		{"virtio_net", 2, 4, 2, false}, // two pairs free for two CPUs
		{"virtio_net", 3, 4, 2, true},  // one free pair for two CPUs
		{"virtio_net", 1, 1, 1, true},  // a single queue
		{"virtio_net", 1, 2, 1, false},
		{"veth", 1, 1, 2, false},
		{"ena", 8, 8, 8, false},
	} {
		if got := virtioSharedXDPTx(c.driver, c.combined, c.max, c.cpus); got != c.want {
			t.Errorf("%s combined %d of %d, %d CPUs: shared %v, want %v", c.driver, c.combined, c.max, c.cpus, got, c.want)
		}
	}
	// Loopback names no driver: no warning, no error.
	if err := CheckXDPTxQueues("lo"); err != nil {
		t.Errorf("lo: %v", err)
	}
}
