package maps

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/cilium/ebpf/btf"
)

// A converter copies a value laid out as one BTF type into the layout of
// another, field by field by name (nested structs, arrays element by
// element), so that a map pinned by an earlier xlimit can be carried into
// this one's layout whatever changed: fields added (left zero), removed,
// moved, widened or narrowed (integers are converted, saturating), arrays
// grown or shrunk. Nothing in it knows xlimit's types: a new field anywhere
// is zero after a migration, and code that reads state must take zero as
// "not known yet" (for example an epoch 0 matches no rule, so the state
// starts afresh).

// copyOp copies one integer (or a run of raw bytes when raw).
type copyOp struct {
	src, dst           int
	srcSize, dstSize   int
	srcSigned, dstSign bool
	raw                bool
}

type converter struct {
	ops              []copyOp
	srcSize, dstSize int
	// added, removed and changed name the fields (paths) that are new in
	// the destination, gone from it, or of a type that cannot be
	// converted (left zero).
	added, removed, changed []string
}

// newConverter plans the conversion of values of type src into type dst.
func newConverter(dst, src btf.Type) (*converter, error) {
	dsz, err := btf.Sizeof(dst)
	if err != nil {
		return nil, fmt.Errorf("size of %v: %w", dst, err)
	}
	ssz, err := btf.Sizeof(src)
	if err != nil {
		return nil, fmt.Errorf("size of %v: %w", src, err)
	}
	c := &converter{srcSize: ssz, dstSize: dsz}
	if err := c.plan("", dst, src, 0, 0, 0); err != nil {
		return nil, err
	}
	c.coalesce()
	return c, nil
}

// rawConverter copies size bytes as they are (no type information, same
// sizes).
func rawConverter(size int) *converter {
	return &converter{ops: []copyOp{{srcSize: size, dstSize: size, raw: true}}, srcSize: size, dstSize: size}
}

// identity reports that the conversion is a plain copy.
func (c *converter) identity() bool {
	return c.srcSize == c.dstSize && len(c.ops) == 1 && c.ops[0].raw && c.ops[0].src == 0 && c.ops[0].dst == 0 && c.ops[0].srcSize == c.srcSize
}

const maxDepth = 32

func (c *converter) plan(path string, dst, src btf.Type, dOff, sOff, depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("convert %s: types nested too deep", path)
	}
	dst, src = btf.UnderlyingType(dst), btf.UnderlyingType(src)
	dsz, err := btf.Sizeof(dst)
	if err != nil {
		return fmt.Errorf("convert %s: %w", path, err)
	}
	ssz, err := btf.Sizeof(src)
	if err != nil {
		return fmt.Errorf("convert %s: %w", path, err)
	}
	switch d := dst.(type) {
	case *btf.Int, *btf.Enum:
		dSigned, _ := intSign(d)
		sSigned, ok := intSign(src)
		if !ok || ssz > 8 || dsz > 8 {
			if ok && ssz == dsz {
				c.ops = append(c.ops, copyOp{src: sOff, dst: dOff, srcSize: ssz, dstSize: dsz, raw: true})
				return nil
			}
			c.changed = append(c.changed, name(path))
			return nil
		}
		op := copyOp{src: sOff, dst: dOff, srcSize: ssz, dstSize: dsz, srcSigned: sSigned, dstSign: dSigned}
		op.raw = ssz == dsz && sSigned == dSigned
		c.ops = append(c.ops, op)
	case *btf.Float:
		if _, ok := src.(*btf.Float); ok && ssz == dsz {
			c.ops = append(c.ops, copyOp{src: sOff, dst: dOff, srcSize: ssz, dstSize: dsz, raw: true})
			return nil
		}
		c.changed = append(c.changed, name(path))
	case *btf.Array:
		s, ok := src.(*btf.Array)
		if !ok {
			c.changed = append(c.changed, name(path))
			return nil
		}
		de, err := btf.Sizeof(d.Type)
		if err != nil {
			return fmt.Errorf("convert %s: %w", path, err)
		}
		se, err := btf.Sizeof(s.Type)
		if err != nil {
			return fmt.Errorf("convert %s: %w", path, err)
		}
		n := min(d.Nelems, s.Nelems)
		if n < d.Nelems {
			c.added = append(c.added, fmt.Sprintf("%s[%d:%d]", name(path), n, d.Nelems))
		}
		if n < s.Nelems {
			c.removed = append(c.removed, fmt.Sprintf("%s[%d:%d]", name(path), n, s.Nelems))
		}
		for i := range int(n) {
			if err := c.plan(fmt.Sprintf("%s[%d]", path, i), d.Type, s.Type, dOff+i*de, sOff+i*se, depth+1); err != nil {
				return err
			}
		}
	case *btf.Struct, *btf.Union:
		dm, err := members(dst, 0)
		if err != nil {
			return fmt.Errorf("convert %s: %w", path, err)
		}
		sm, err := members(src, 0)
		if err != nil {
			c.changed = append(c.changed, name(path))
			return nil
		}
		for _, m := range dm {
			p := path + "." + m.name
			o, ok := find(sm, m.name)
			if !ok {
				if !padding(m.name) {
					c.added = append(c.added, name(p))
				}
				continue
			}
			if m.bitfield || o.bitfield {
				c.changed = append(c.changed, name(p))
				continue
			}
			if err := c.plan(p, m.typ, o.typ, dOff+m.off, sOff+o.off, depth+1); err != nil {
				return err
			}
		}
		for _, m := range sm {
			if _, ok := find(dm, m.name); !ok && !padding(m.name) {
				c.removed = append(c.removed, name(path+"."+m.name))
			}
		}
	case *btf.Pointer:
		// Addresses mean nothing in another program.
	default:
		if dsz == ssz && fmt.Sprintf("%T", dst) == fmt.Sprintf("%T", src) {
			c.ops = append(c.ops, copyOp{src: sOff, dst: dOff, srcSize: ssz, dstSize: dsz, raw: true})
			return nil
		}
		c.changed = append(c.changed, name(path))
	}
	return nil
}

// padding reports a field that holds nothing (types.h pads by hand with
// _pad fields).
func padding(field string) bool { return strings.HasPrefix(field, "_") }

func name(path string) string {
	if path == "" {
		return "(value)"
	}
	return strings.TrimPrefix(path, ".")
}

// intSign reports whether t is a signed integer (or enum), and whether it
// is an integer at all.
func intSign(t btf.Type) (signed, ok bool) {
	switch v := t.(type) {
	case *btf.Int:
		return v.Encoding&btf.Signed != 0, true
	case *btf.Enum:
		return v.Signed, true
	}
	return false, false
}

// member is a named field of a struct or union, anonymous members
// flattened into their parent as C has it.
type member struct {
	name     string
	typ      btf.Type
	off      int
	bitfield bool
}

func members(t btf.Type, base int) ([]member, error) {
	var ms []btf.Member
	switch v := t.(type) {
	case *btf.Struct:
		ms = v.Members
	case *btf.Union:
		ms = v.Members
	default:
		return nil, fmt.Errorf("%v is not a struct", t)
	}
	var out []member
	for _, m := range ms {
		if m.Offset%8 != 0 && m.BitfieldSize == 0 {
			return nil, fmt.Errorf("member %s at bit %d", m.Name, m.Offset)
		}
		off := base + int(m.Offset/8)
		if m.Name == "" {
			inner, err := members(btf.UnderlyingType(m.Type), off)
			if err != nil {
				return nil, err
			}
			out = append(out, inner...)
			continue
		}
		out = append(out, member{name: m.Name, typ: m.Type, off: off, bitfield: m.BitfieldSize != 0})
	}
	return out, nil
}

func find(ms []member, name string) (member, bool) {
	i := slices.IndexFunc(ms, func(m member) bool { return m.name == name })
	if i < 0 {
		return member{}, false
	}
	return ms[i], true
}

// coalesce merges raw copies that follow each other in both layouts.
func (c *converter) coalesce() {
	out := c.ops[:0:0]
	for _, op := range c.ops {
		if n := len(out); n > 0 && op.raw && out[n-1].raw &&
			out[n-1].src+out[n-1].srcSize == op.src && out[n-1].dst+out[n-1].dstSize == op.dst {
			out[n-1].srcSize += op.srcSize
			out[n-1].dstSize += op.dstSize
			continue
		}
		out = append(out, op)
	}
	c.ops = out
}

// convert writes src's value in the destination layout into a new,
// zeroed buffer.
func (c *converter) convert(src []byte) ([]byte, error) {
	if len(src) < c.srcSize {
		return nil, fmt.Errorf("convert: %d bytes, want %d", len(src), c.srcSize)
	}
	dst := make([]byte, c.dstSize)
	for _, op := range c.ops {
		if op.raw {
			copy(dst[op.dst:op.dst+op.dstSize], src[op.src:op.src+op.srcSize])
			continue
		}
		putInt(dst[op.dst:op.dst+op.dstSize], op.dstSign, getInt(src[op.src:op.src+op.srcSize], op.srcSigned))
	}
	return dst, nil
}

// wide is an integer of up to 64 bits, signed or not.
type wide struct {
	u   uint64
	neg bool // the value is u as an int64, below zero
}

func getInt(b []byte, signed bool) wide {
	var u uint64
	switch len(b) {
	case 1:
		u = uint64(b[0])
		if signed && int8(b[0]) < 0 {
			return wide{uint64(int64(int8(b[0]))), true}
		}
	case 2:
		v := binary.NativeEndian.Uint16(b)
		if signed && int16(v) < 0 {
			return wide{uint64(int64(int16(v))), true}
		}
		u = uint64(v)
	case 4:
		v := binary.NativeEndian.Uint32(b)
		if signed && int32(v) < 0 {
			return wide{uint64(int64(int32(v))), true}
		}
		u = uint64(v)
	case 8:
		u = binary.NativeEndian.Uint64(b)
		if signed && int64(u) < 0 {
			return wide{u, true}
		}
	}
	return wide{u: u}
}

// putInt writes v into b, saturating at the bounds of b's type.
func putInt(b []byte, signed bool, v wide) {
	bits := uint(len(b) * 8)
	var u uint64
	switch {
	case v.neg && !signed:
		u = 0
	case v.neg:
		lo := int64(-1) << (bits - 1)
		if int64(v.u) < lo {
			u = uint64(lo)
		} else {
			u = v.u
		}
	case signed:
		hi := uint64(1)<<(bits-1) - 1
		u = min(v.u, hi)
	default:
		if bits < 64 {
			u = min(v.u, uint64(1)<<bits-1)
		} else {
			u = v.u
		}
	}
	switch len(b) {
	case 1:
		b[0] = byte(u)
	case 2:
		binary.NativeEndian.PutUint16(b, uint16(u))
	case 4:
		binary.NativeEndian.PutUint32(b, uint32(u))
	case 8:
		binary.NativeEndian.PutUint64(b, u)
	}
}
