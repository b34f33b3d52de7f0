package maps

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// TestDesignPrograms checks docs/design.md §2's program table against the
// generated objects (unprivileged: it reads their ELF specs, loads nothing):
// every program of every object in maps/ has a row naming its object and
// the source bpf2go.go compiles it from, and every row names a program that
// is there. The prose's counts ("Four programs ... three objects") follow.
func TestDesignPrograms(t *testing.T) {
	doc, err := os.ReadFile("../docs/design.md")
	if err != nil {
		t.Fatalf("read docs/design.md: %v", err)
	}
	s := string(doc)
	a := strings.Index(s, "\n## 2. Architecture")
	b := strings.Index(s, "\n## 3. ")
	if a < 0 || b < a {
		t.Fatal("docs/design.md: no §2")
	}
	s = s[a:b]

	// The objects' sources, from the go:generate lines of bpf2go.go.
	gen, err := os.ReadFile("../bpf2go.go")
	if err != nil {
		t.Fatalf("read bpf2go.go: %v", err)
	}
	sources := map[string]string{} // maps/IDENT_bpfel.o -> bpf/SOURCE.c
	for _, m := range regexp.MustCompile(`(?m)^//go:generate .*-output-dir maps .* ([a-z]+) (bpf/[a-z_]+\.c) --`).FindAllStringSubmatch(string(gen), -1) {
		sources["maps/"+m[1]+"_bpfel.o"] = m[2]
	}

	// What the objects hold.
	objs, err := filepath.Glob("*_bpfel.o")
	if err != nil || len(objs) == 0 {
		t.Fatalf("no generated objects in maps/ (%v)", err)
	}
	type row struct{ prog, src, obj string }
	var have []row
	for _, o := range objs {
		spec, err := ebpf.LoadCollectionSpec(o)
		if err != nil {
			t.Fatalf("read %s: %v", o, err)
		}
		src, ok := sources["maps/"+o]
		if !ok {
			t.Errorf("bpf2go.go: no go:generate line makes maps/%s", o)
		}
		for name := range spec.Programs {
			have = append(have, row{name, src, "maps/" + o})
		}
	}

	// What the table says.
	var want []row
	rowRE := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| `(bpf/[^`]+)` → `(maps/[^`]+)` \\|")
	for _, m := range rowRE.FindAllStringSubmatch(s, -1) {
		want = append(want, row{m[1], m[2], m[3]})
	}
	less := func(x, y row) int { return strings.Compare(x.prog+x.obj, y.prog+y.obj) }
	slices.SortFunc(have, less)
	slices.SortFunc(want, less)
	for _, h := range have {
		if !slices.Contains(want, h) {
			t.Errorf("docs/design.md §2: no row | `%s` | `%s` → `%s` | (the object has the program)", h.prog, h.src, h.obj)
		}
	}
	for _, w := range want {
		if !slices.Contains(have, w) {
			t.Errorf("docs/design.md §2: row | `%s` | `%s` → `%s` |: no such program in that object", w.prog, w.src, w.obj)
		}
	}

	// The counts in prose.
	words := []string{"zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
	m := regexp.MustCompile(`(?i)\b([a-z]+) programs run in the kernel, compiled from ([a-z]+) objects`).FindStringSubmatch(s)
	if m == nil {
		t.Fatal(`docs/design.md §2: no "N programs run in the kernel, compiled from M objects"`)
	}
	nobj := map[string]bool{}
	for _, h := range have {
		nobj[h.obj] = true
	}
	if got := slices.Index(words, strings.ToLower(m[1])); got != len(have) {
		t.Errorf("docs/design.md §2: says %s programs, the objects hold %d", m[1], len(have))
	}
	if got := slices.Index(words, strings.ToLower(m[2])); got != len(nobj) {
		t.Errorf("docs/design.md §2: says %s objects, maps/ has %d", m[2], len(nobj))
	}
	names := make([]string, 0, len(have))
	for _, h := range have {
		names = append(names, h.prog)
	}
	sort.Strings(names)
	t.Logf("programs: %v in %d objects", names, len(nobj))
}

// TestDesignPins checks docs/design.md §6's "Pins." paragraph against the
// pins (unprivileged: PinnedNames reads the embedded object): it names
// every pinned map, and no map that is not pinned, beside xl_layouts.
func TestDesignPins(t *testing.T) {
	doc, err := os.ReadFile("../docs/design.md")
	if err != nil {
		t.Fatalf("read docs/design.md: %v", err)
	}
	_, s, ok := strings.Cut(string(doc), "- **Pins.**")
	if !ok {
		t.Fatal("docs/design.md: no \"- **Pins.**\" paragraph")
	}
	s, _, _ = strings.Cut(s, "\n- **")
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`(xl_[a-z0-9_]+)`").FindAllStringSubmatch(s, -1) {
		named[m[1]] = true
	}
	pinned := append(PinnedNames(), layoutsPin)
	for _, name := range pinned {
		if !named[name] {
			t.Errorf("docs/design.md, Pins.: %s is pinned but not named", name)
		}
	}
	for name := range named {
		if !slices.Contains(pinned, name) {
			t.Errorf("docs/design.md, Pins.: names %s, which is not pinned", name)
		}
	}
}

// TestPinnedNames: the pins are read from the embedded object, not the
// test clock (which is never pinned), and the maps every version had.
func TestPinnedNames(t *testing.T) {
	got := PinnedNames()
	for _, want := range []string{xdpMapXlGen, xdpMapXlRules, xdpMapXlStats, xdpMapXlCookieShare, xdpMapXlRequests} {
		if !slices.Contains(got, want) {
			t.Errorf("PinnedNames lacks %s: %v", want, got)
		}
	}
	if slices.Contains(got, xdpMapXlClock) {
		t.Errorf("PinnedNames has the test clock %s", xdpMapXlClock)
	}
}
