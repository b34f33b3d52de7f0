package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

var topKeys = []string{"interfaces", "allow", "deny", "malformed", "source_table_size", "rules", "system", "management", "syn_cookies", "resets"}

// Parse decodes and validates a rules file. file names the file in error
// messages. On failure it returns a nil *Config and the errors.Join of
// every problem found, each an *Error, sorted by line (see Errors).
func Parse(file string, data []byte) (cfg *Config, err error) {
	return parse(file, data, nil)
}

// parse is Parse, recording what it saw in tr when tr is not nil.
func parse(file string, data []byte, tr *trace) (cfg *Config, err error) {
	if err := checkSize(file, int64(len(data))); err != nil {
		return nil, err
	}
	if err := checkNodes(file, data); err != nil {
		return nil, err
	}
	p := &parser{file: file, maxVisits: maxVisitsFloor + maxVisitsPerByte*len(data), trace: tr}
	defer func() {
		// The YAML parser is third-party code; whatever it does, Parse
		// returns an error and never panics.
		if r := recover(); r != nil {
			cfg = nil
			err = joinErrors([]*Error{{File: file, Problem: fmt.Sprintf("internal error while parsing (please report): %v", r)}})
		}
	}()
	root := p.document(data)
	if root == nil {
		return nil, joinErrors(p.errs)
	}
	c := p.config(root)
	if len(p.errs) > 0 || c == nil {
		return nil, joinErrors(p.errs)
	}
	sortErrors(p.warns)
	c.Warnings = p.warns
	return c, nil
}

// document parses data as exactly one YAML document and returns its root
// node, or nil after recording an error.
func (p *parser) document(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			p.errs = append(p.errs, &Error{File: p.file, Problem: "file is empty: expected a mapping with keys such as rules, allow and deny"})
		} else {
			p.syntaxError(err, data)
		}
		return nil
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		if root := docRoot(&next); root != nil && !isNull(root) {
			p.errs = append(p.errs, &Error{File: p.file, Line: root.Line, Column: root.Column,
				Problem: "a second YAML document: a rules file holds exactly one"})
			return nil
		}
	case !errors.Is(err, io.EOF):
		p.syntaxError(err, data)
		return nil
	}
	root := docRoot(&doc)
	if root == nil || isNull(root) {
		p.errs = append(p.errs, &Error{File: p.file, Line: doc.Line, Problem: "file is empty: expected a mapping with keys such as rules, allow and deny"})
		return nil
	}
	return root
}

func docRoot(doc *yaml.Node) *yaml.Node {
	if doc.Kind != yaml.DocumentNode {
		return doc
	}
	if len(doc.Content) == 0 {
		return nil
	}
	return doc.Content[0]
}

var (
	yamlLineError    = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
	yamlUnknownAlias = regexp.MustCompile(`^yaml: unknown anchor '(.*)' referenced$`)
)

// syntaxError records an error of the YAML parser with its line. The YAML
// parser leaves the line out when it is the first; it never gives one for
// an unknown anchor, whose first use is searched for instead.
func (p *parser) syntaxError(err error, data []byte) {
	msg := err.Error()
	e := &Error{File: p.file, Line: 1}
	if m := yamlLineError.FindStringSubmatch(msg); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		msg = m[2]
	} else if m := yamlUnknownAlias.FindStringSubmatch(msg); m != nil {
		if i := bytes.Index(data, []byte("*"+m[1])); i >= 0 {
			e.Line = 1 + bytes.Count(data[:i], []byte("\n"))
		}
	}
	e.Problem = "invalid YAML: " + strings.TrimPrefix(msg, "yaml: ")
	p.errs = append(p.errs, e)
}

// config decodes the top-level mapping.
func (p *parser) config(root *yaml.Node) *Config {
	m := p.mapping(root, "", topKeys)
	if m == nil {
		return nil
	}
	c := &Config{Malformed: VerdictDrop, SourceTableSize: DefaultSourceTableSize}

	if items, at, ok := p.list(m, "interfaces"); ok {
		seen := map[string]int{}
		for i, raw := range items {
			item := loc{raw, index(at.path, i)}
			n := p.deref(raw)
			if n.Kind != yaml.ScalarNode || n.ShortTag() != tagStr {
				p.errorf(item, "expected an interface name, got %s", describe(n))
				continue
			}
			if problem := checkInterfaceName(n.Value); problem != "" {
				p.errorf(item, "%s", problem)
				continue
			}
			if first, dup := seen[n.Value]; dup {
				p.errorf(item, "duplicate interface %s (first at line %d)", quote(n.Value), first)
				continue
			}
			seen[n.Value] = item.line()
			c.Interfaces = append(c.Interfaces, n.Value)
		}
	}

	c.Allow, _, _, _ = p.prefixes(m, "allow")
	c.Deny, _, _, _ = p.prefixes(m, "deny")
	p.warnEverything(m, "allow", c.Allow, "allows every %s source: no rule limits %s traffic")
	p.warnEverything(m, "deny", c.Deny, "denies every %s source: all %s traffic outside allow is dropped")

	if v, _, ok := enum(p, m, "malformed", VerdictDrop, VerdictPass); ok {
		c.Malformed = v
	}
	if v, _, ok := p.integer(m, "source_table_size", 1, MaxSourceTableSize); ok {
		c.SourceTableSize = v
	}
	if s := p.section(m, "system", []string{"cpu_high", "pressure_high"}); s != nil {
		c.System = &System{}
		if v, _, ok := p.fraction(s, "cpu_high", false, true); ok {
			c.System.CPUHigh = v
		} else if !s.has("cpu_high") {
			p.errorf(s.at("cpu_high"), "required key is missing")
		}
		if v, _, ok := p.fraction(s, "pressure_high", false, true); ok {
			c.System.PressureHigh = v
		}
	}

	c.Management = p.management(m)
	p.synCookies(m, c) // syncookies.go
	p.resets(m, c)     // resets.go

	items, at, _ := p.list(m, "rules")
	names := map[string]int{}
	for i, raw := range items {
		if p.stopped {
			break
		}
		path := index(at.path, i)
		if i == MaxRules {
			p.errorf(loc{raw, path}, "too many rules: at most %d are allowed, the file has %d", MaxRules, len(items))
		}
		r, nameAt := p.rule(raw, path)
		if r == nil {
			continue
		}
		if r.Name != "" {
			if first, dup := names[r.Name]; dup {
				p.errorf(nameAt, "duplicate rule name %s (first at line %d)", quote(r.Name), first)
			} else {
				names[r.Name] = nameAt.line()
			}
		}
		c.Rules = append(c.Rules, *r)
	}
	p.checkLimits(m, c)
	p.checkSynCookies(m, c)
	p.checkManaged(m, c)
	p.checkFleet(c)
	return c
}

// warnEverything warns about a /0 prefix in allow or deny.
func (p *parser) warnEverything(m *mapping, key string, list []netip.Prefix, format string) {
	for _, pfx := range list {
		if pfx.Bits() == 0 {
			family := "IPv4"
			if pfx.Addr().Is6() {
				family = "IPv6"
			}
			p.warnf(m.keyAt(key), format, family, family)
		}
	}
}
