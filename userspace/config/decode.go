package config

import (
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// Short YAML tags, as returned by yaml.Node.ShortTag.
const (
	tagNull  = "!!null"
	tagBool  = "!!bool"
	tagStr   = "!!str"
	tagInt   = "!!int"
	tagFloat = "!!float"
	tagMerge = "!!merge"
)

const (
	// maxErrors bounds the errors collected from one file; past it Parse
	// stops walking the document.
	maxErrors = 1000
	// The walk visits at most maxVisitsFloor + maxVisitsPerByte × len(data)
	// nodes, so that aliases cannot expand a small file into a huge walk.
	maxVisitsFloor   = 100000
	maxVisitsPerByte = 10
)

// parser walks one document and collects problems.
type parser struct {
	file      string
	errs      []*Error
	warns     []*Error
	visits    int
	maxVisits int
	stopped   bool
	// prefixLists holds the decoded prefix lists by their sequence node,
	// so that a list shared through aliases is decoded once.
	prefixLists map[*yaml.Node][]netip.Prefix
	// trace, when set (tests only), records the keys each mapping knows
	// and the values each enum allows: TestDesignSketchKeys holds
	// docs/design.md's sketch to them.
	trace *trace
}

// trace is what a parse saw: for each mapping decoded, its path, the
// keys it knows and the keys present; for each enum present, its path,
// line and allowed values.
type trace struct {
	mappings []tracedMapping
	enums    []tracedEnum
}

type tracedMapping struct {
	path           string
	known, present []string
}

type tracedEnum struct {
	path    string
	line    int
	allowed []string
}

// loc is where a value came from: the node to take the line from and the
// field path to name.
type loc struct {
	node *yaml.Node
	path string
}

func (p *parser) newError(at loc, format string, args ...any) *Error {
	e := &Error{File: p.file, Field: at.path, Problem: fmt.Sprintf(format, args...)}
	if at.node != nil {
		e.Line, e.Column = at.node.Line, at.node.Column
	}
	return e
}

func (p *parser) errorf(at loc, format string, args ...any) {
	if p.stopped {
		return
	}
	p.errs = append(p.errs, p.newError(at, format, args...))
	if len(p.errs) >= maxErrors {
		p.stopped = true
		p.errs = append(p.errs, &Error{File: p.file, Line: at.line(), Problem: fmt.Sprintf("too many errors; stopped after %d", maxErrors)})
	}
}

func (p *parser) warnf(at loc, format string, args ...any) {
	if len(p.warns) < maxErrors {
		p.warns = append(p.warns, p.newError(at, format, args...))
	}
}

func (at loc) line() int {
	if at.node == nil {
		return 0
	}
	return at.node.Line
}

// sub is the path of key inside the mapping at path.
func sub(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// index is the path of the i-th item of the list at path.
func index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

// deref follows aliases and counts the visit against the budget.
func (p *parser) deref(n *yaml.Node) *yaml.Node {
	p.visits++
	if p.visits > p.maxVisits && !p.stopped {
		p.errs = append(p.errs, &Error{File: p.file, Line: n.Line, Column: n.Column,
			Problem: fmt.Sprintf("document too complex: its aliases expand to more than %d nodes", p.maxVisits)})
		p.stopped = true
	}
	for i := 0; i < 8 && n.Kind == yaml.AliasNode && n.Alias != nil; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == tagNull
}

// describe names what a node holds, for "expected X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case tagNull:
			return "no value"
		case tagBool:
			return "boolean " + n.Value
		case tagInt, tagFloat:
			return "number " + n.Value
		case tagStr:
			return "string " + quote(n.Value)
		default:
			return "a value tagged " + n.Tag
		}
	}
	return "an unresolved alias"
}

// quote quotes s for a message, shortened when long.
func quote(s string) string {
	const max = 40
	if utf8.RuneCountInString(s) > max {
		r := []rune(s)
		return fmt.Sprintf("%q...", string(r[:max]))
	}
	return fmt.Sprintf("%q", s)
}

// mapping is a decoded YAML mapping: its known keys and their values.
type mapping struct {
	node   *yaml.Node
	path   string
	fields map[string]field
}

type field struct {
	key, val *yaml.Node // val may be an alias
}

func (m *mapping) has(key string) bool { _, ok := m.fields[key]; return ok }

// at is the location of key's value, or of the mapping when key is absent.
func (m *mapping) at(key string) loc {
	if f, ok := m.fields[key]; ok {
		return loc{f.val, sub(m.path, key)}
	}
	return loc{m.node, sub(m.path, key)}
}

// keyAt is the location of key itself (for messages about the whole
// section), or of the mapping when key is absent.
func (m *mapping) keyAt(key string) loc {
	if f, ok := m.fields[key]; ok {
		return loc{f.key, sub(m.path, key)}
	}
	return loc{m.node, sub(m.path, key)}
}

// mapping decodes raw as a mapping with the given keys. Unknown keys,
// duplicate keys and keys that are not strings are errors; merge keys
// ("<<: *anchor") are followed, with keys written in the mapping itself
// taking precedence. It returns nil when raw is null (without an error:
// the caller decides what null means) or not a mapping (with an error).
func (p *parser) mapping(raw *yaml.Node, path string, known []string) *mapping {
	n := p.deref(raw)
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(loc{raw, path}, "expected a mapping, got %s", describe(n))
		return nil
	}
	m := &mapping{node: n, path: path, fields: map[string]field{}}
	p.collect(m, n, known, map[*yaml.Node]bool{n: true})
	if p.trace != nil {
		p.trace.mappings = append(p.trace.mappings, tracedMapping{path, known, slices.Sorted(maps.Keys(m.fields))})
	}
	return m
}

func (p *parser) collect(m *mapping, n *yaml.Node, known []string, seen map[*yaml.Node]bool) {
	var merges []*yaml.Node
	written := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content) && !p.stopped; i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		kd := p.deref(k)
		if kd.Kind == yaml.ScalarNode && kd.Value == "<<" && kd.ShortTag() == tagMerge {
			merges = append(merges, v)
			continue
		}
		if kd.Kind != yaml.ScalarNode || kd.ShortTag() != tagStr {
			p.errorf(loc{k, m.path}, "keys must be strings, got %s", describe(kd))
			continue
		}
		name := kd.Value
		path := sub(m.path, name)
		if first, dup := written[name]; dup {
			p.errorf(loc{k, path}, "duplicate key (first at line %d)", first.Line)
			continue
		}
		written[name] = k
		if !slices.Contains(known, name) {
			p.errorf(loc{k, path}, "unknown key%s", suggest(name, known))
			continue
		}
		if _, set := m.fields[name]; !set { // keys written over keys merged
			m.fields[name] = field{k, v}
		}
	}
	for _, raw := range merges {
		src := p.deref(raw)
		list := []*yaml.Node{raw}
		if src.Kind == yaml.SequenceNode {
			list = src.Content
		}
		for _, item := range list {
			if p.stopped {
				return
			}
			it := p.deref(item)
			switch {
			case it.Kind != yaml.MappingNode:
				p.errorf(loc{item, sub(m.path, "<<")}, "merge expects a mapping or a list of mappings, got %s", describe(it))
			case seen[it]:
				p.errorf(loc{item, sub(m.path, "<<")}, "merge includes a mapping that is already merged here")
			default:
				seen[it] = true
				p.collect(m, it, known, seen)
			}
		}
	}
}

// suggest returns ` (did you mean "x"?)` for the known key closest to
// name, or "" when none is close.
func suggest(name string, known []string) string {
	best, bestDist := "", 3
	for _, k := range known {
		if d := editDistance(strings.ToLower(name), k); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best == "" {
		return fmt.Sprintf(" (known keys: %s)", strings.Join(known, ", "))
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// value returns key's value when it is present and not null; a null value
// is reported as missing.
func (p *parser) value(m *mapping, key string) (*yaml.Node, loc, bool) {
	at := m.at(key)
	f, ok := m.fields[key]
	if !ok {
		return nil, at, false
	}
	n := p.deref(f.val)
	if isNull(n) {
		p.errorf(at, "missing value")
		return nil, at, false
	}
	return n, at, true
}

// section decodes key as a nested mapping. It returns nil when the key is
// absent, or after an error when its value is null or not a mapping.
func (p *parser) section(m *mapping, key string, known []string) *mapping {
	f, ok := m.fields[key]
	if !ok {
		return nil
	}
	s := p.mapping(f.val, sub(m.path, key), known)
	if s == nil && isNull(p.deref(f.val)) {
		p.errorf(m.at(key), "missing value: expected a mapping with keys %s", strings.Join(known, ", "))
	}
	return s
}

// list returns the raw items of key's list; null is an empty list. ok is
// false when key is absent or not a list (the latter reported).
func (p *parser) list(m *mapping, key string) ([]*yaml.Node, loc, bool) {
	at := m.at(key)
	f, ok := m.fields[key]
	if !ok {
		return nil, at, false
	}
	n := p.deref(f.val)
	if isNull(n) {
		return nil, at, true
	}
	if n.Kind != yaml.SequenceNode {
		p.errorf(at, "expected a list, got %s", describe(n))
		return nil, at, false
	}
	return n.Content, at, true
}

func (p *parser) str(m *mapping, key string) (string, loc, bool) {
	n, at, ok := p.value(m, key)
	if !ok {
		return "", at, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != tagStr {
		p.errorf(at, "expected a string, got %s", describe(n))
		return "", at, false
	}
	return n.Value, at, true
}

func (p *parser) boolean(m *mapping, key string) (bool, loc, bool) {
	n, at, ok := p.value(m, key)
	if !ok {
		return false, at, false
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != tagBool || n.Decode(&b) != nil {
		p.errorf(at, "expected true or false, got %s", describe(n))
		return false, at, false
	}
	return b, at, true
}

// number decodes a finite number (integer or float).
func (p *parser) number(m *mapping, key string) (float64, loc, bool) {
	n, at, ok := p.value(m, key)
	if !ok {
		return 0, at, false
	}
	var f float64
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || (tag != tagInt && tag != tagFloat) || n.Decode(&f) != nil {
		p.errorf(at, "expected a number, got %s", describe(n))
		return 0, at, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		p.errorf(at, "must be a finite number, got %s", n.Value)
		return 0, at, false
	}
	return f, at, true
}

// integer decodes an integer in [lo, hi].
func (p *parser) integer(m *mapping, key string, lo, hi int64) (int, loc, bool) {
	n, at, ok := p.value(m, key)
	if !ok {
		return 0, at, false
	}
	var v int64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != tagInt || n.Decode(&v) != nil {
		p.errorf(at, "expected an integer, got %s", describe(n))
		return 0, at, false
	}
	if v < lo || v > hi {
		p.errorf(at, "must be between %d and %d, got %d", lo, hi, v)
		return 0, at, false
	}
	return int(v), at, true
}

// duration decodes a Go duration string; it must be positive unless
// allowZero, and is never negative.
func (p *parser) duration(m *mapping, key string, allowZero bool) (time.Duration, loc, bool) {
	n, at, ok := p.value(m, key)
	if !ok {
		return 0, at, false
	}
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == tagInt || n.ShortTag() == tagFloat) {
		p.errorf(at, "%s has no unit: durations are Go durations such as \"500ms\" or \"10s\"", n.Value)
		return 0, at, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != tagStr {
		p.errorf(at, "expected a duration such as \"500ms\" or \"10s\", got %s", describe(n))
		return 0, at, false
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		p.errorf(at, "%s is not a duration (write e.g. \"500ms\", \"10s\" or \"1m30s\")", quote(n.Value))
		return 0, at, false
	}
	if d < 0 || (d == 0 && !allowZero) {
		if allowZero {
			p.errorf(at, "must not be negative, got %s", n.Value)
		} else {
			p.errorf(at, "must be positive, got %s", n.Value)
		}
		return 0, at, false
	}
	return d, at, true
}

// enum decodes a string that must be one of allowed.
func enum[T ~string](p *parser, m *mapping, key string, allowed ...T) (T, loc, bool) {
	s, at, ok := p.str(m, key)
	if !ok {
		return "", at, false
	}
	if p.trace != nil {
		names := make([]string, len(allowed))
		for i, a := range allowed {
			names[i] = string(a)
		}
		p.trace.enums = append(p.trace.enums, tracedEnum{at.path, at.node.Line, names})
	}
	for _, a := range allowed {
		if string(a) == s {
			return a, at, true
		}
	}
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = string(a)
	}
	p.errorf(at, "must be one of %s, got %s", strings.Join(names, ", "), quote(s))
	return "", at, false
}

// fraction decodes a number in [0, 1], or (0, 1] when !allowZero, or the
// open interval (0, 1) when open.
func (p *parser) fraction(m *mapping, key string, allowZero, allowOne bool) (float64, loc, bool) {
	v, at, ok := p.number(m, key)
	if !ok {
		return 0, at, false
	}
	lo, hi := "(0", "1)"
	if allowZero {
		lo = "[0"
	}
	if allowOne {
		hi = "1]"
	}
	if v < 0 || v > 1 || (v == 0 && !allowZero) || (v == 1 && !allowOne) {
		p.errorf(at, "must be in %s, %s, got %g", lo, hi, v)
		return 0, at, false
	}
	return v, at, true
}
