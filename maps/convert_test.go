//go:build linux

package maps

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// oldRelease is the XDP object of 2392467 (three days before the
// migration was written: xl_config 104 bytes, 14 reasons, no resets),
// kept as it was built, for the tests of a migration from its pins.
const oldRelease = "xdp-2392467.o"

// oldReleaseSpec is oldRelease's collection spec.
func oldReleaseSpec(tb testing.TB) *ebpf.CollectionSpec {
	tb.Helper()
	b, err := EarlierObject(oldRelease)
	if err != nil {
		tb.Fatal(err)
	}
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(b))
	if err != nil {
		tb.Fatal(err)
	}
	return spec
}

var (
	u8  = &btf.Int{Name: "u8", Size: 1}
	u16 = &btf.Int{Name: "u16", Size: 2}
	u32 = &btf.Int{Name: "u32", Size: 4}
	u64 = &btf.Int{Name: "u64", Size: 8}
	s32 = &btf.Int{Name: "s32", Size: 4, Encoding: btf.Signed}
	s64 = &btf.Int{Name: "s64", Size: 8, Encoding: btf.Signed}
)

func field(name string, t btf.Type, byteOff int) btf.Member {
	return btf.Member{Name: name, Type: t, Offset: btf.Bits(byteOff * 8)}
}

// TestConverter: a value is carried into another layout field by field by
// name: moved, widened, narrowed (saturating), signed, new fields zero,
// removed fields dropped, arrays grown and shrunk, nested and anonymous
// members, and a type that cannot be converted left zero and named.
func TestConverter(t *testing.T) {
	inner := &btf.Struct{Name: "in", Size: 8, Members: []btf.Member{field("a", u32, 0), field("b", u32, 4)}}
	innerNew := &btf.Struct{Name: "in", Size: 16, Members: []btf.Member{field("b", u64, 0), field("c", u64, 8)}}
	src := &btf.Struct{Name: "v", Size: 48, Members: []btf.Member{
		field("tat", u64, 0),
		field("epoch", u32, 8),
		field("small", u16, 12),
		field("gone", u16, 14),
		field("big", u64, 16),
		field("neg", s32, 24),
		field("arr", &btf.Array{Type: u32, Index: u32, Nelems: 3}, 28),
		field("nested", inner, 40),
	}}
	anon := &btf.Union{Size: 8, Members: []btf.Member{field("tat", u64, 0)}}
	dst := &btf.Struct{Name: "v", Size: 72, Members: []btf.Member{
		field("epoch", u64, 0),                // moved and widened
		btf.Member{Type: anon, Offset: 8 * 8}, // tat, in an anonymous union
		field("big", u32, 16),                 // narrowed: saturates
		field("small", u32, 20),
		field("neg", s64, 24),
		field("arr", &btf.Array{Type: u32, Index: u32, Nelems: 2}, 32),
		field("nested", innerNew, 40),
		field("new", u64, 56),
		field("tat2", inner, 64), // not in src
	}}
	c, err := newConverter(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	in := make([]byte, 48)
	ne := binary.NativeEndian
	ne.PutUint64(in[0:], 123456789)
	ne.PutUint32(in[8:], 0xdeadbeef)
	ne.PutUint16(in[12:], 7)
	ne.PutUint16(in[14:], 9)
	ne.PutUint64(in[16:], 1<<40)
	ne.PutUint32(in[24:], uint32(0xfffffffe)) // -2
	ne.PutUint32(in[28:], 1)
	ne.PutUint32(in[32:], 2)
	ne.PutUint32(in[36:], 3)
	ne.PutUint32(in[40:], 11)
	ne.PutUint32(in[44:], 12)
	out, err := c.convert(in)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, got, want uint64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %d (%#x), want %d (%#x)", what, got, got, want, want)
		}
	}
	check("epoch widened", ne.Uint64(out[0:]), 0xdeadbeef)
	check("tat in an anonymous union", ne.Uint64(out[8:]), 123456789)
	check("big narrowed, saturated", uint64(ne.Uint32(out[16:])), 0xffffffff)
	check("small", uint64(ne.Uint32(out[20:])), 7)
	check("neg sign-extended", ne.Uint64(out[24:]), uint64(0xfffffffffffffffe))
	check("arr[0]", uint64(ne.Uint32(out[32:])), 1)
	check("arr[1]", uint64(ne.Uint32(out[36:])), 2)
	check("nested.b widened", ne.Uint64(out[40:]), 12)
	check("nested.c new", ne.Uint64(out[48:]), 0)
	check("new", ne.Uint64(out[56:]), 0)
	check("tat2 new", ne.Uint64(out[64:]), 0)
	if want := []string{"nested.c", "new", "tat2"}; !slices.Equal(c.added, want) {
		t.Errorf("added %v, want %v", c.added, want)
	}
	if want := []string{"arr[2:3]", "nested.a", "gone"}; !slices.Equal(c.removed, want) {
		t.Errorf("removed %v, want %v", c.removed, want)
	}

	// A field whose type cannot be converted stays zero and is named.
	odd := &btf.Struct{Size: 8, Members: []btf.Member{field("x", &btf.Array{Type: u8, Index: u32, Nelems: 8}, 0)}}
	c2, err := newConverter(&btf.Struct{Size: 8, Members: []btf.Member{field("x", u64, 0)}}, odd)
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := c2.convert([]byte{1, 2, 3, 4, 5, 6, 7, 8}); ne.Uint64(out) != 0 || !slices.Equal(c2.changed, []string{"x"}) {
		t.Errorf("array to integer: %x, changed %v; want zero and x named", out, c2.changed)
	}
	// The same layout is one plain copy.
	if c3, err := newConverter(src, src); err != nil || !c3.identity() {
		t.Errorf("same type: identity %v, %v", c3 != nil && c3.identity(), err)
	}
}

// TestConverterOldRelease: the value types of the last release's pinned
// maps carry into today's: every field kept by name keeps its value,
// arrays that grew (the reasons) keep their elements and the new ones
// and the new fields (resets, the globals' served and resp_time) are zero.
func TestConverterOldRelease(t *testing.T) {
	old := oldReleaseSpec(t)
	cur, err := loadXdp()
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	for name, om := range old.Maps {
		nm := cur.Maps[name]
		if nm == nil || om.Pinning != ebpf.PinByName {
			continue
		}
		vc, err := newConverter(nm.Value, om.Value)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if vc.srcSize != int(om.ValueSize) || vc.dstSize != int(nm.ValueSize) {
			t.Errorf("%s: converter sizes %d -> %d, maps %d -> %d", name, vc.srcSize, vc.dstSize, om.ValueSize, nm.ValueSize)
		}
		if len(vc.changed) > 0 || len(vc.removed) > 0 {
			t.Errorf("%s: fields not carried: changed %v, removed %v", name, vc.changed, vc.removed)
		}
		if !vc.identity() {
			changed++
			t.Logf("%s: %d -> %d bytes, added %v", name, om.ValueSize, nm.ValueSize, vc.added)
		}
	}
	if changed == 0 {
		t.Fatal("no layout changed since the old release: the fixture is not the one the test needs")
	}

	// xl_counters, one CPU's: every old counter keeps its place.
	vc, err := newConverter(cur.Maps[xdpMapXlStats].Value, old.Maps[xdpMapXlStats].Value)
	if err != nil {
		t.Fatal(err)
	}
	in := make([]byte, old.Maps[xdpMapXlStats].ValueSize)
	for i := 0; i+8 <= len(in); i += 8 {
		binary.NativeEndian.PutUint64(in[i:], uint64(i/8+1))
	}
	out, err := vc.convert(in)
	if err != nil {
		t.Fatal(err)
	}
	var got xdpXlCounters
	if _, err := binary.Decode(out, binary.NativeEndian, &got); err != nil {
		t.Fatal(err)
	}
	const verdicts, oldReasons = 3, 14
	for v := range verdicts {
		if got.Packets[v] != uint64(v+1) || got.Bytes[v] != uint64(verdicts+v+1) {
			t.Errorf("verdict %d: packets %d bytes %d, want %d and %d", v, got.Packets[v], got.Bytes[v], v+1, verdicts+v+1)
		}
	}
	for r := range got.Reasons {
		want := uint64(0)
		if r < oldReasons {
			want = uint64(2*verdicts + r + 1)
		}
		if got.Reasons[r] != want {
			t.Errorf("reason %d: %d, want %d", r, got.Reasons[r], want)
		}
	}
	for r := range got.Resets {
		if got.Resets[r] != 0 {
			t.Errorf("reset outcome %d: %d, want 0 (new)", r, got.Resets[r])
		}
	}
}
