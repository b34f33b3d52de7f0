package dataplane

import (
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func entries(prefixes ...string) []PrefixEntry {
	var out []PrefixEntry
	for _, s := range prefixes {
		out = append(out, PrefixEntry{Prefix: netip.MustParsePrefix(s).Masked()})
	}
	return out
}

// setBits4 lists the IPv4 bits that are set.
func setBits4(f *Prefilter) []uint32 {
	var out []uint32
	for w, v := range f.V4 {
		for v != 0 {
			b := uint32(bits.TrailingZeros64(v))
			out = append(out, uint32(w)*64+b)
			v &= v - 1
		}
	}
	return out
}

func countBits(words *[PrefilterWords]uint64) int {
	n := 0
	for _, v := range words {
		n += bits.OnesCount64(v)
	}
	return n
}

func TestPrefilterEmpty(t *testing.T) {
	f := NewPrefilter(nil, nil)
	if n4, n6 := countBits(&f.V4), countBits(&f.V6); n4 != 0 || n6 != 0 {
		t.Fatalf("empty plan: %d IPv4 and %d IPv6 bits set", n4, n6)
	}
	if f.MayContain(netip.MustParseAddr("10.0.0.1")) || f.MayContain(netip.MustParseAddr("2001:db8::1")) {
		t.Fatal("empty prefilter lets an address through")
	}
}

// TestPrefilterIPv4 checks which /16s each length sets, at the /16
// boundaries.
func TestPrefilterIPv4(t *testing.T) {
	for _, c := range []struct {
		prefix      string
		first, n    uint32 // the bits set: first, first+1, …, first+n-1
		in, outside []string
	}{
		{"0.0.0.0/0", 0, 65536, []string{"0.0.0.0", "255.255.255.255", "128.0.0.1"}, nil},
		{"10.0.0.0/8", 10 << 8, 256, []string{"10.0.0.0", "10.255.255.255"}, []string{"9.255.255.255", "11.0.0.0"}},
		{"172.16.0.0/15", 172<<8 | 16, 2, []string{"172.16.0.0", "172.17.255.255"}, []string{"172.15.255.255", "172.18.0.0"}},
		{"172.17.0.0/15", 172<<8 | 16, 2, []string{"172.16.0.0"}, []string{"172.18.0.0"}}, // not masked by the caller
		{"10.1.0.0/16", 10<<8 | 1, 1, []string{"10.1.0.0", "10.1.255.255"}, []string{"10.0.255.255", "10.2.0.0"}},
		{"10.1.128.0/17", 10<<8 | 1, 1, []string{"10.1.128.0", "10.1.0.0"}, []string{"10.0.255.255", "10.2.0.0"}},
		{"10.1.255.0/24", 10<<8 | 1, 1, []string{"10.1.255.255"}, []string{"10.2.0.0"}},
		{"10.1.255.255/32", 10<<8 | 1, 1, []string{"10.1.255.255", "10.1.0.0"}, []string{"10.2.0.0", "10.0.255.255"}},
		{"255.255.0.0/16", 65535, 1, []string{"255.255.255.255"}, []string{"255.254.255.255"}},
		{"0.0.0.0/32", 0, 1, []string{"0.0.255.255"}, []string{"0.1.0.0"}},
	} {
		f := NewPrefilter([]PrefixEntry{{Prefix: netip.MustParsePrefix(c.prefix)}}, nil)
		got := setBits4(f)
		if uint32(len(got)) != c.n || got[0] != c.first || got[len(got)-1] != c.first+c.n-1 {
			t.Errorf("%s: %d bits set from %d to %d, want %d from %d", c.prefix, len(got), got[0], got[len(got)-1], c.n, c.first)
		}
		if countBits(&f.V6) != 0 {
			t.Errorf("%s: IPv6 bits set", c.prefix)
		}
		for _, a := range c.in {
			if !f.MayContain(netip.MustParseAddr(a)) {
				t.Errorf("%s: %s skipped", c.prefix, a)
			}
		}
		for _, a := range c.outside {
			if f.MayContain(netip.MustParseAddr(a)) {
				t.Errorf("%s: %s let through", c.prefix, a)
			}
		}
	}
}

// TestPrefilterIPv6 checks the fill of entries shorter than /32 and the
// single bit of longer ones.
func TestPrefilterIPv6(t *testing.T) {
	for _, p := range []string{"::/0", "2000::/3", "2400::/16", "2a00:1450::/31"} {
		f := NewPrefilter(nil, entries("2001:db8:1::/48", p))
		if n := countBits(&f.V6); n != PrefilterBits {
			t.Errorf("%s: %d of %d IPv6 bits set", p, n, PrefilterBits)
		}
		if countBits(&f.V4) != 0 {
			t.Errorf("%s: IPv4 bits set", p)
		}
	}
	top := func(a string) uint32 { return PrefilterIndex6(netip.MustParseAddr(a).As16()) }
	for _, p := range []string{"2001:db8::/32", "2001:db8:ffff::/48", "2001:db8::1/128", "2001:db8:1:2:3:4:5:6/127"} {
		f := NewPrefilter(nil, entries(p))
		if n := countBits(&f.V6); n != 1 {
			t.Errorf("%s: %d IPv6 bits set, want 1", p, n)
		}
		i := top("2001:db8::")
		if f.V6[i/64]>>(i%64)&1 == 0 {
			t.Errorf("%s: bit %d of 2001:db8::/32 clear", p, i)
		}
		for _, a := range []string{"2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff"} {
			if !f.MayContain(netip.MustParseAddr(a)) {
				t.Errorf("%s: %s skipped", p, a)
			}
		}
		for _, a := range []string{"2001:db9::", "2001:db7:ffff::", "3001:db8::"} {
			if f.MayContain(netip.MustParseAddr(a)) && top(a) != i {
				t.Errorf("%s: %s let through", p, a)
			}
		}
	}
	// The hash is the kernel's (bpf/match.h): pinned values, so that a
	// change on one side only shows here, not only in the kernel tier.
	for a, want := range map[string]uint32{"::": 0, "2001:db8::": 0x22be, "0:1::": 0x9e37, "ffff:ffff::": 0x61c8} {
		if got := top(a); got != want {
			t.Errorf("PrefilterIndex6(%s) = %#x, want %#x", a, got, want)
		}
	}
}

// TestPrefilterNoFalseNegatives checks random sets of prefixes against an
// independent oracle: an IPv4 bit is set exactly when some prefix overlaps
// its /16, and no address of any prefix is skipped.
func TestPrefilterNoFalseNegatives(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	randAddr4 := func() netip.Addr {
		v := rng.Uint32()
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	randAddr6 := func() netip.Addr {
		var a [16]byte
		for i := range a {
			a[i] = byte(rng.Uint32())
		}
		return netip.AddrFrom16(a)
	}
	for round := range 20 {
		var v4, v6 []PrefixEntry
		for range 1 + rng.IntN(12) {
			p, _ := randAddr4().Prefix(1 + rng.IntN(32)) // not /0: it sets everything
			v4 = append(v4, PrefixEntry{Prefix: p})
		}
		for range 1 + rng.IntN(12) {
			p, _ := randAddr6().Prefix(32 + rng.IntN(97))
			v6 = append(v6, PrefixEntry{Prefix: p})
		}
		f := NewPrefilter(v4, v6)
		for i := range uint32(PrefilterBits) {
			block := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(i >> 8), byte(i), 0, 0}), 16)
			want := false
			for _, e := range v4 {
				want = want || e.Prefix.Overlaps(block)
			}
			if got := f.V4[i/64]>>(i%64)&1 != 0; got != want {
				t.Fatalf("round %d: /16 %s: bit %v, overlapped by a prefix %v (%v)", round, block, got, want, v4)
			}
		}
		if n := countBits(&f.V6); n < 1 || n > len(v6) {
			t.Fatalf("round %d: %d IPv6 bits for %d prefixes", round, n, len(v6))
		}
		for _, e := range append(v4, v6...) {
			for range 50 {
				// A random address inside the prefix.
				a := e.Prefix.Addr().As16()
				if e.Prefix.Addr().Is4() {
					a4 := e.Prefix.Addr().As4()
					r := rng.Uint32() >> e.Prefix.Bits() // host bits
					if e.Prefix.Bits() == 32 {
						r = 0
					}
					v := (uint32(a4[0])<<24 | uint32(a4[1])<<16 | uint32(a4[2])<<8 | uint32(a4[3])) | r
					addr := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
					if !f.MayContain(addr) {
						t.Fatalf("round %d: %s of %s skipped", round, addr, e.Prefix)
					}
					continue
				}
				for i := e.Prefix.Bits(); i < 128; i++ {
					if rng.IntN(2) == 1 {
						a[i/8] |= 0x80 >> (i % 8)
					}
				}
				addr := netip.AddrFrom16(a)
				if !e.Prefix.Contains(addr) || !f.MayContain(addr) {
					t.Fatalf("round %d: %s of %s skipped (in it: %v)", round, addr, e.Prefix, e.Prefix.Contains(addr))
				}
			}
		}
	}
}

// TestPlanPrefilter checks that a compiled plan's prefilter covers its
// trie: every configured prefix, allow, deny and sources, and nothing
// else.
func TestPlanPrefilter(t *testing.T) {
	p := mustCompile(t, &Spec{
		Allow: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")},
		Deny:  []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")},
		Rules: []RuleSpec{{Name: "s", Protocol: "udp", Rate: 1, Burst: 1,
			Sources: []netip.Prefix{netip.MustParsePrefix("198.51.100.7/32")}}},
	}, nil)
	f := p.Prefilter()
	if got := setBits4(f); len(got) != 3 {
		t.Errorf("IPv4 bits %v, want 3", got)
	}
	for _, a := range []string{"10.1.2.3", "192.0.2.200", "198.51.100.7", "2001:db8:5::1"} {
		if !f.MayContain(netip.MustParseAddr(a)) || p.Lookup(netip.MustParseAddr(a)) == nil {
			t.Errorf("%s: skipped, or in no prefix", a)
		}
	}
	for _, a := range []string{"10.2.0.1", "192.1.2.1", "203.0.113.9"} {
		if f.MayContain(netip.MustParseAddr(a)) {
			t.Errorf("%s let through", a)
		}
	}
}
