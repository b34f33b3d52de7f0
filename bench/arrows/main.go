// Command arrows counts the arrows between the files of one Go package: a
// file points at another when it uses a package-level name, a method or a
// field declared there (non-test files, resolved by go/types). It says how
// many arrows sit on a cycle (files that call each other, found as
// strongly connected components) and the largest cycle: issue 29's measure
// of the daemon's parts. Usage: go run ./bench/arrows DIR [-v|-s]: -v lists
// the arrows, -s also the names each arrow on a cycle is made of.
package main

import (
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: arrows DIR [-v|-s]")
		os.Exit(2)
	}
	dir := os.Args[1]
	r, err := analyze(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "arrows:", err)
		os.Exit(1)
	}
	if len(os.Args) > 2 && (os.Args[2] == "-v" || os.Args[2] == "-s") {
		fmt.Println(strings.Join(r.lines(os.Args[2] == "-s"), "\n"))
	}
	fmt.Printf("%s: %d files, %d arrows, %d on cycles, largest cycle %d files\n", dir, r.files, len(r.edges), r.onCycles(), r.largest)
}

// report is one package's arrows among its files.
type report struct {
	files   int
	edges   map[[2]string]map[string]bool // arrow -> the names it is made of
	comp    map[string]int                // file -> its strongly connected component
	largest int                           // files in the largest component
}

// cyclic reports whether arrow e lies on a cycle.
func (r *report) cyclic(e [2]string) bool { return r.comp[e[0]] == r.comp[e[1]] }

// onCycles counts the arrows on a cycle.
func (r *report) onCycles() int {
	n := 0
	for e := range r.edges {
		if r.cyclic(e) {
			n++
		}
	}
	return n
}

// lines lists the arrows, sorted, those on a cycle marked and, with
// names, followed by what they use.
func (r *report) lines(names bool) []string {
	var lines []string
	for e, uses := range r.edges {
		in := r.cyclic(e)
		line := fmt.Sprintf("%s -> %s%s", e[0], e[1], map[bool]string{true: "  (cycle)"}[in])
		if in && names {
			var ns []string
			for n := range uses {
				ns = append(ns, n)
			}
			sort.Strings(ns)
			line += ": " + strings.Join(ns, " ")
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	return lines
}

// analyze reads the non-test files of the package in dir that the default
// build compiles and finds the arrows among them.
func analyze(dir string) (*report, error) {
	fset := token.NewFileSet()
	bp, err := build.Default.ImportDir(dir, 0) // the files this build compiles
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil), Error: func(error) {}}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	pkg, _ := conf.Check("p", fset, files, info)
	name := func(p token.Pos) string { return filepath.Base(fset.Position(p).Filename) }
	uses := map[[2]string]map[string]bool{} // the names each arrow is made of
	nodes := map[string]bool{}
	for _, f := range files {
		nodes[name(f.Pos())] = true
	}
	for id, obj := range info.Uses {
		if obj == nil || obj.Pkg() != pkg || !obj.Pos().IsValid() {
			continue
		}
		// package-level objects, methods and fields of package types
		local := obj.Parent() == pkg.Scope()
		if fn, ok := obj.(*types.Func); ok && fn.Type().(*types.Signature).Recv() != nil {
			local = true
		}
		if v, ok := obj.(*types.Var); ok && v.IsField() {
			local = true
		}
		if !local {
			continue
		}
		a, b := name(id.Pos()), name(obj.Pos())
		if a != b && nodes[b] {
			e := [2]string{a, b}
			if uses[e] == nil {
				uses[e] = map[string]bool{}
			}
			uses[e][obj.Name()] = true
		}
	}
	// Tarjan SCC
	adj := map[string][]string{}
	for e := range uses {
		adj[e[0]] = append(adj[e[0]], e[1])
	}
	idx, low, on := map[string]int{}, map[string]int{}, map[string]bool{}
	comp := map[string]int{}
	var st []string
	n, c := 0, 0
	var visit func(v string)
	visit = func(v string) {
		idx[v], low[v] = n, n
		n++
		st = append(st, v)
		on[v] = true
		for _, w := range adj[v] {
			if _, ok := idx[w]; !ok {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], idx[w])
			}
		}
		if low[v] == idx[v] {
			for {
				w := st[len(st)-1]
				st = st[:len(st)-1]
				on[w] = false
				comp[w] = c
				if w == v {
					break
				}
			}
			c++
		}
	}
	var ns []string
	for v := range nodes {
		ns = append(ns, v)
	}
	sort.Strings(ns)
	for _, v := range ns {
		if _, ok := idx[v]; !ok {
			visit(v)
		}
	}
	big := 0
	size := map[int]int{}
	for _, v := range ns {
		size[comp[v]]++
		big = max(big, size[comp[v]])
	}
	return &report{files: len(ns), edges: uses, comp: comp, largest: big}, nil
}
