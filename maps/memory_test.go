//go:build linux

package maps

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// TestMapGeometryMatchesLimits checks the capacities and sizes that
// userspace/config enforces at check time against the compiled program.
func TestMapGeometryMatchesLimits(t *testing.T) {
	spec, err := Spec()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name              string
		key, value, count uint32
	}{
		{xdpMapXlSrcTable, 4, dataplane.SrcSetSize, uint32(dataplane.SrcSets(0))},
		{xdpMapXlSrcExts, 4, dataplane.SrcExtSetSize, uint32(dataplane.SrcSets(0))},
		{xdpMapXlPrefix4, dataplane.LPM4KeySize, dataplane.PrefixValueSize, dataplane.PrefixTrieEntries},
		{xdpMapXlPrefix6, dataplane.LPM6KeySize, dataplane.PrefixValueSize, dataplane.PrefixTrieEntries},
		{xdpMapXlPrefilter, 4, 8, dataplane.Generations * 2 * dataplane.PrefilterWords},
	} {
		m := spec.Maps[c.name]
		if m == nil {
			t.Errorf("map %s missing", c.name)
			continue
		}
		if m.KeySize != c.key || m.ValueSize != c.value || m.MaxEntries != c.count {
			t.Errorf("map %s: key %d, value %d, %d entries; dataplane says %d, %d, %d",
				c.name, m.KeySize, m.ValueSize, m.MaxEntries, c.key, c.value, c.count)
		}
	}
	if got := dataplane.MaxRules; got != 64 {
		t.Errorf("MaxRules %d", got)
	}
}

// TestPinnedMemory loads the program with its maps pinned in a private
// bpffs, a large per-source table and some prefixes, and checks that
// PinnedMemory reports every pinned map and that the estimate of each is
// within 10 % (plus a page for the map's header) of what the kernel says.
func TestPinnedMemory(t *testing.T) {
	requireRoot(t)
	pins := privatePinDir(t)
	objs, err := Load(Options{PinDir: pins, SourceTableSize: 100000})
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	spec := &dataplane.Spec{}
	for i := range 300 {
		spec.Allow = append(spec.Allow, netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)))
	}
	for i := range 50 {
		spec.Deny = append(spec.Deny, netip.MustParsePrefix(fmt.Sprintf("2001:db8:%x::/48", i)))
	}
	plan, err := dataplane.Compile(spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := objs.Tables().Apply(plan); err != nil {
		t.Fatal(err)
	}
	// 10 000 host addresses: xl_host_addrs is not preallocated, its
	// memory follows them.
	host := dataplane.HostAddrs{}
	for i := range 10000 {
		host[dataplane.IPKey(netip.AddrFrom4([4]byte{10, 64, byte(i >> 8), byte(i)}))] = 2
	}
	if err := objs.Tables().SetHostAddrs(host); err != nil {
		t.Fatal(err)
	}

	mem, err := PinnedMemory(pins)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]MapMemory{}
	var total, estimate uint64
	for _, m := range mem {
		byName[m.Name] = m
		total += m.Memlock
		estimate += m.Estimate
		t.Logf("%-12s %-12s key %3d value %4d entries %8d: kernel %10d B, estimate %10d B", m.Name, m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Memlock, m.Estimate)
		if m.Memlock == 0 {
			continue // the kernel does not say
		}
		if m.Type == "LPMTrie" {
			// Kernels count a trie node without its value (16 B here);
			// the estimate counts what is allocated.
			if m.Estimate < m.Memlock || m.Estimate > m.Memlock*3/2 {
				t.Errorf("%s: estimate %d B, kernel %d B", m.Name, m.Estimate, m.Memlock)
			}
			continue
		}
		diff := float64(m.Memlock) - float64(m.Estimate)
		if diff < 0 {
			diff = -diff
		}
		if diff > 0.1*float64(m.Memlock)+4096 {
			t.Errorf("%s: estimate %d B, kernel %d B", m.Name, m.Estimate, m.Memlock)
		}
	}
	t.Logf("total: kernel %d B, estimate %d B", total, estimate)
	for _, name := range PinnedNames() {
		if _, ok := byName[name]; !ok {
			t.Errorf("pinned map %s missing from the report", name)
		}
	}
	for _, name := range []string{xdpMapXlSrcTable, xdpMapXlSrcExts} {
		if m := byName[name]; m.MaxEntries != 131072/dataplane.SrcWays {
			t.Errorf("%s has %d sets, want %d (100000 sources rounded up)", name, m.MaxEntries, 131072/dataplane.SrcWays)
		}
	}
	if m := byName[xdpMapXlPrefix4]; m.Estimate != dataplane.MapBytes(dataplane.MapLPMTrie, dataplane.LPM4KeySize, dataplane.PrefixValueSize, 0, 300, 0) {
		t.Errorf("xl_prefix4 estimate %d B for 300 prefixes", m.Estimate)
	}
}

// privatePinDir mounts a bpffs of the test's own, unmounted when the test
// ends, and returns a pin directory in it.
func privatePinDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount bpffs: %v", err)
		}
	})
	pins := filepath.Join(dir, "pins")
	if err := os.Mkdir(pins, 0o700); err != nil {
		t.Fatal(err)
	}
	return pins
}
