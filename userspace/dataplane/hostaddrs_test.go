package dataplane

import (
	"maps"
	"net"
	"net/netip"
	"testing"
)

// TestSelectHostAddrs: a host with more addresses than xl_host_addrs holds
// gets the MAC, the attached interface's addresses, those of the other
// attached interfaces, then the rest by interface index, and the mark
// that the map is incomplete; the choice is the same whatever the order
// of the input; with room for all, all and no mark.
func TestSelectHostAddrs(t *testing.T) {
	mac := MACKey(net.HardwareAddr{2, 0, 0, 0, 0, 2})
	ip := func(s string) HostKey { return IPKey(netip.MustParseAddr(s)) }
	all := HostAddrs{mac: 2,
		// The attached interface (2): IPv6 listed after IPv4.
		ip("2001:db8::2"): 2, ip("192.0.2.9"): 2, ip("192.0.2.2"): 2,
		// Another interface the daemon is attached to (7).
		ip("198.51.100.2"): 7, ip("198.51.100.1"): 7,
		// Others: lower interface index first.
		ip("10.0.0.1"): 9, ip("10.0.0.2"): 3, ip("10.0.0.3"): 3,
	}

	listed, unlisted := SelectHostAddrs(all, len(all), 2, 7)
	if unlisted != 0 || !maps.Equal(listed, all) || listed.Incomplete() {
		t.Errorf("room for all: listed %d (incomplete %v), unlisted %d; want all %d, none unlisted, no mark", len(listed), listed.Incomplete(), unlisted, len(all))
	}

	for _, tc := range []struct {
		capacity int
		want     []HostKey
	}{
		{8, []HostKey{mac, ip("192.0.2.2"), ip("192.0.2.9"), ip("2001:db8::2"), ip("198.51.100.1"), ip("198.51.100.2"), ip("10.0.0.2")}},
		{5, []HostKey{mac, ip("192.0.2.2"), ip("192.0.2.9"), ip("2001:db8::2")}},
		{3, []HostKey{mac, ip("192.0.2.2")}},
		{1, nil},
	} {
		want := HostAddrs{IncompleteKey: 0}
		for _, k := range tc.want {
			want[k] = all[k]
		}
		for try := range 20 { // map order differs from one range to the next
			in := HostAddrs{}
			for k, v := range all {
				in[k] = v
			}
			listed, unlisted := SelectHostAddrs(in, tc.capacity, 2, 7)
			if !maps.Equal(listed, want) || unlisted != len(all)-len(tc.want) || len(listed) > tc.capacity {
				t.Fatalf("capacity %d, try %d: listed %v, unlisted %d; want %v, unlisted %d", tc.capacity, try, listed, unlisted, want, len(all)-len(tc.want))
			}
		}
	}

	// A mark in the input (a map read back) is not an address.
	in := maps.Clone(all)
	in[IncompleteKey] = 0
	if listed, unlisted := SelectHostAddrs(in, len(all), 2); unlisted != 0 || listed.Incomplete() {
		t.Errorf("the mark counted as an address: listed %d, incomplete %v, unlisted %d", len(listed), listed.Incomplete(), unlisted)
	}
}
