package main

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

// The product's packages stand in layers (docs/design.md §3), each
// importing only its own layer and those below it: no arrow runs back up.
// From the bottom: the kernel/daemon contract (userspace/dataplane); the
// control plane, which sees the kernel through interfaces (userspace/*);
// typed map access (maps); loading, attaching and reading the pins
// (loader, loader/*); the daemon; the CLI. No product package imports the
// test side (tests/, bench/), which may import anything.
const module = "github.com/xlimit/xlimit/"

var layers = []struct {
	name     string
	packages func(p string) bool
}{
	{"the contract", func(p string) bool { return p == "userspace/dataplane" }},
	{"the control plane", func(p string) bool { return strings.HasPrefix(p, "userspace/") }},
	{"the maps", func(p string) bool { return p == "maps" }},
	{"the loader", func(p string) bool { return p == "loader" || strings.HasPrefix(p, "loader/") }},
	{"the daemon", func(p string) bool { return p == "daemon" }},
	{"the CLI", func(p string) bool { return p == "cmd/xlimit" }},
}

// layerOf is p's layer (an index into layers), or -1 for a package outside
// the product.
func layerOf(p string) int {
	for i, l := range layers {
		if l.packages(p) {
			return i
		}
	}
	return -1
}

// upward lists the imports of the module's packages (p: its imports, in
// `go list` form "PKG: IMP IMP ...", module prefix trimmed) that run from
// a product package to a higher layer or out of the product.
func upward(graph []string) []string {
	var bad []string
	for _, line := range graph {
		pkg, imps, _ := strings.Cut(line, ":")
		from := layerOf(pkg)
		if from < 0 {
			continue // the test side
		}
		for _, imp := range strings.Fields(imps) {
			to := layerOf(imp)
			switch {
			case to < 0:
				bad = append(bad, fmt.Sprintf("%s (%s) imports %s, outside the product", pkg, layers[from].name, imp))
			case to > from:
				bad = append(bad, fmt.Sprintf("%s (%s) imports %s (%s), a layer above", pkg, layers[from].name, imp, layers[to].name))
			}
		}
	}
	return bad
}

// TestDesignLayers fails when an import of the product runs back up a
// layer, in the release build and the test build (tag xlimit_faults). The
// demo's build (tag xlimit_demo) imports the test kit by design, into the
// CLI alone: TestReleaseDepsNoKit keeps it out of the others.
func TestDesignLayers(t *testing.T) {
	for _, tags := range []string{"", "xlimit_faults"} {
		cmd := exec.Command("go", "list", "-tags", tags, "-f", `{{.ImportPath}}:{{range .Imports}} {{.}}{{end}}`, "./...")
		cmd.Dir = repoRoot
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -tags %q ./...: %v", tags, err)
		}
		var graph []string
		products := 0
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			pkg, imps, _ := strings.Cut(line, ":")
			pkg = strings.TrimPrefix(pkg, module)
			var mine []string // the module's imports only
			for _, imp := range strings.Fields(imps) {
				if rest, ok := strings.CutPrefix(imp, module); ok {
					mine = append(mine, rest)
				}
			}
			if layerOf(pkg) >= 0 {
				products++
			}
			graph = append(graph, pkg+": "+strings.Join(mine, " "))
		}
		if products < 15 {
			t.Fatalf("tags %q: %d product packages in go list's output: not the module", tags, products)
		}
		for _, b := range upward(graph) {
			t.Errorf("tags %q: %s", tags, b)
		}
	}
	// The check itself: an arrow up and one out are found.
	if got := upward([]string{"userspace/lockout: maps userspace/dataplane", "loader: tests/kit/frame maps"}); len(got) != 2 {
		t.Errorf("upward on two planted imports found %d: %q", len(got), got)
	}
}
