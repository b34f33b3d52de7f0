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
	dir := os.Args[1]
	fset := token.NewFileSet()
	bp, err := build.Default.ImportDir(dir, 0) // the files this build compiles
	if err != nil {
		fmt.Fprintln(os.Stderr, "arrows:", err)
		os.Exit(1)
	}
	var files []*ast.File
	for _, name := range bp.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "arrows:", err)
			os.Exit(1)
		}
		files = append(files, f)
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil), Error: func(error) {}}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	pkg, _ := conf.Check("p", fset, files, info)
	name := func(p token.Pos) string { return filepath.Base(fset.Position(p).Filename) }
	edges := map[[2]string]bool{}
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
			edges[e] = true
			if uses[e] == nil {
				uses[e] = map[string]bool{}
			}
			uses[e][obj.Name()] = true
		}
	}
	// Tarjan SCC
	adj := map[string][]string{}
	for e := range edges {
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
	cyc := 0
	size := map[int]int{}
	for _, v := range ns {
		size[comp[v]]++
	}
	var lines []string
	for e := range edges {
		in := comp[e[0]] == comp[e[1]]
		if in {
			cyc++
		}
		line := fmt.Sprintf("%s -> %s%s", e[0], e[1], map[bool]string{true: "  (cycle)"}[in])
		if in && len(os.Args) > 2 && os.Args[2] == "-s" {
			var names []string
			for n := range uses[e] {
				names = append(names, n)
			}
			sort.Strings(names)
			line += ": " + strings.Join(names, " ")
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	if len(os.Args) > 2 && (os.Args[2] == "-v" || os.Args[2] == "-s") {
		fmt.Println(strings.Join(lines, "\n"))
	}
	big := 0
	for _, s := range size {
		big = max(big, s)
	}
	fmt.Printf("%s: %d files, %d arrows, %d on cycles, largest cycle %d files\n", dir, len(ns), len(edges), cyc, big)
}
