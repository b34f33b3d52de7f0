package main

import (
	"bytes"
	"context"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// docs/design.md is kept true by these tests: its command and flag table
// (§10) against every command's --help, its file map (§3) against the
// tree. maps.TestDesignPrograms checks its program list (§2) against the
// generated objects.

// repoRoot is the repository's top, two levels above this package.
const repoRoot = "../.."

// designSection returns the text of docs/design.md from the line that
// starts with from to the next line that starts with until.
func designSection(t *testing.T, from, until string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "design.md"))
	if err != nil {
		t.Fatalf("read docs/design.md: %v", err)
	}
	s := string(b)
	i := strings.Index(s, "\n"+from)
	if i < 0 {
		t.Fatalf("docs/design.md: no line starting with %q", from)
	}
	s = s[i+1:]
	if j := strings.Index(s[len(from):], "\n"+until); j >= 0 {
		s = s[:len(from)+j+1]
	}
	return s
}

var flagRE = regexp.MustCompile(`--[a-z][a-z0-9-]*`)

// docCommands returns the commands of §10's Commands block ("run",
// "rules push", ...) with the flags each names.
func docCommands(t *testing.T) map[string][]string {
	t.Helper()
	sec := designSection(t, "### Commands", "### ")
	a := strings.Index(sec, "```\n")
	b := strings.LastIndex(sec, "```")
	if a < 0 || b <= a {
		t.Fatal("docs/design.md §10: no code block under ### Commands")
	}
	cmds := map[string][]string{}
	cur := ""
	for _, line := range strings.Split(sec[a+4:b], "\n") {
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "xlimit" {
			cur = f[1]
			// A command with subcommands ("xlimit rules push") names
			// one on its line: a lowercase word, not a flag or argument.
			if len(f) >= 3 && regexp.MustCompile(`^[a-z]+$`).MatchString(f[2]) {
				cur += " " + f[2]
			}
			if _, dup := cmds[cur]; dup {
				t.Errorf("docs/design.md §10: %q listed twice", cur)
			}
			cmds[cur] = []string{}
		} else if strings.TrimSpace(line) == "" {
			continue
		} else if cur == "" {
			t.Fatalf("docs/design.md §10: line %q before any command", line)
		}
		for _, fl := range flagRE.FindAllString(line, -1) {
			if !slices.Contains(cmds[cur], fl) {
				cmds[cur] = append(cmds[cur], fl)
			}
		}
	}
	return cmds
}

// runHelp runs the CLI in-process with args and returns its stdout.
func runHelp(t *testing.T, args ...string) string {
	t.Helper()
	var o, e bytes.Buffer
	if code := mainWithArgs(context.Background(), &env{stdout: &o, stderr: &e}, args); code != 0 {
		t.Fatalf("xlimit %s: exit %d, stderr %q", strings.Join(args, " "), code, e.String())
	}
	return o.String()
}

var (
	helpCommandRE = regexp.MustCompile(`(?m)^  ([a-z]+) `)
	helpFlagRE    = regexp.MustCompile(`(?m)^ {2,6}(?:-[a-zA-Z], )?(--[a-z][a-z0-9-]*)`)
	helpSubRE     = regexp.MustCompile(`(?m)^Usage: xlimit [a-z]+ ([a-z]+(?:\|[a-z]+)+)\b`)
)

// helpFlags returns the flags a --help output lists, but --help.
func helpFlags(out string) []string {
	i := strings.Index(out, "\nFlags:\n")
	if i < 0 {
		return nil
	}
	var flags []string
	for _, m := range helpFlagRE.FindAllStringSubmatch(out[i:], -1) {
		if m[1] != "--help" {
			flags = append(flags, m[1])
		}
	}
	return flags
}

// cliCommands returns every command of `xlimit --help` (and the
// subcommands of those whose usage is "a|b"), with the flags of their
// --help.
func cliCommands(t *testing.T) map[string][]string {
	t.Helper()
	top := runHelp(t, "--help")
	i := strings.Index(top, "\nCommands:\n")
	if i < 0 {
		t.Fatalf("xlimit --help: no Commands: list in %q", top)
	}
	cmds := map[string][]string{}
	for _, m := range helpCommandRE.FindAllStringSubmatch(top[i:], -1) {
		out := runHelp(t, m[1], "--help")
		if sub := helpSubRE.FindStringSubmatch(out); sub != nil {
			for _, s := range strings.Split(sub[1], "|") {
				cmds[m[1]+" "+s] = helpFlags(runHelp(t, m[1], s, "--help"))
			}
			continue
		}
		cmds[m[1]] = helpFlags(out)
	}
	if len(cmds) < 5 {
		t.Fatalf("xlimit --help: found only %v", cmds)
	}
	return cmds
}

// TestDesignCommands checks §10's Commands block against the CLI: every
// command and every flag of its --help is in the block, and the block
// names no command or flag the CLI does not have.
func TestDesignCommands(t *testing.T) {
	doc, cli := docCommands(t), cliCommands(t)
	for name, flags := range cli {
		dflags, ok := doc[name]
		if !ok {
			t.Errorf("docs/design.md §10: command %q missing (it is in xlimit --help)", "xlimit "+name)
			continue
		}
		for _, f := range flags {
			if !slices.Contains(dflags, f) {
				t.Errorf("docs/design.md §10: xlimit %s: flag %s missing (it is in --help)", name, f)
			}
		}
		for _, f := range dflags {
			if !slices.Contains(flags, f) {
				t.Errorf("docs/design.md §10: xlimit %s: flag %s is not in its --help", name, f)
			}
		}
	}
	for name := range doc {
		if _, ok := cli[name]; !ok {
			t.Errorf("docs/design.md §10: command %q is not in xlimit --help", "xlimit "+name)
		}
	}
}

var (
	backtickRE = regexp.MustCompile("`([^`]+)`")
	pathRE     = regexp.MustCompile(`^\.?[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)*/?$`)
	fileExts   = []string{".c", ".h", ".go", ".o", ".sh", ".md", ".yaml", ".json", ".service", ".mod"}
)

// pathLike says whether a backticked token of §3 names a path.
func pathLike(s string) bool {
	if !pathRE.MatchString(s) {
		return false
	}
	return strings.Contains(s, "/") || slices.Contains(fileExts, path.Ext(s))
}

// layoutRows returns §3's table rows: the paths of the first cell, and the
// path-like tokens of the rest, each resolved against the row (as the
// candidates it may mean: relative to the row's directory, else to the
// top of the tree).
func layoutRows(t *testing.T) (rows []string, named map[string][][]string) {
	t.Helper()
	sec := designSection(t, "## 3. Layout", "### 3.1")
	named = map[string][][]string{}
	for _, line := range strings.Split(sec, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.SplitN(line, "|", 3)
		if len(cells) < 3 {
			continue
		}
		var own []string
		for _, m := range backtickRE.FindAllStringSubmatch(cells[1], -1) {
			p := strings.TrimSuffix(m[1], "/")
			rows = append(rows, p)
			own = append(own, m[1])
		}
		if len(own) == 0 {
			continue
		}
		base := own[0]
		if !strings.HasSuffix(base, "/") {
			if _, err := os.Stat(filepath.Join(repoRoot, base)); err == nil {
				if fi, _ := os.Stat(filepath.Join(repoRoot, base)); !fi.IsDir() {
					base = path.Dir(base)
				}
			}
		}
		for _, m := range backtickRE.FindAllStringSubmatch(cells[2], -1) {
			if !pathLike(m[1]) {
				continue
			}
			named[line] = append(named[line], []string{path.Join(base, m[1]), m[1]})
		}
	}
	return rows, named
}

// layoutRoots are the directories whose every subdirectory §3 names (to
// depth 2 from the top; to depth 3 in deepRoots), and bpf/, whose every
// file it names, and daemon/, whose every Go file but tests it names.
var (
	layoutRoots = []string{"bpf", "userspace", "maps", "loader", "daemon", "cmd", "tests", "vagrant", "deploy", "bench"}
	deepRoots   = []string{"userspace", "deploy"}
)

// requiredPaths returns what §3 must name, from the tree.
func requiredPaths(t *testing.T) []string {
	t.Helper()
	var req []string
	var walk func(dir string, depth, max int)
	walk = func(dir string, depth, max int) {
		ents, err := os.ReadDir(filepath.Join(repoRoot, dir))
		if err != nil {
			t.Fatalf("read %s: %v", dir, err)
		}
		for _, e := range ents {
			p := path.Join(dir, e.Name())
			switch {
			case strings.HasPrefix(e.Name(), "."):
			case !e.IsDir():
				if dir == "bpf" || dir == "daemon" && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
					req = append(req, p)
				}
			case e.Name() == "testdata" || dir == "bench/results":
			default:
				req = append(req, p)
				if depth < max {
					walk(p, depth+1, max)
				}
			}
		}
	}
	for _, r := range layoutRoots {
		req = append(req, r)
		max := 2
		if slices.Contains(deepRoots, r) {
			max = 3
		}
		walk(r, 2, max)
	}
	sort.Strings(req)
	return req
}

// TestDesignLayout checks §3's file map against the tree: every directory
// down to the packages, and every file of bpf/, has a row; every path the
// table names exists.
func TestDesignLayout(t *testing.T) {
	rows, named := layoutRows(t)
	for _, p := range requiredPaths(t) {
		if !slices.Contains(rows, p) {
			t.Errorf("docs/design.md §3: no row for %s (it is in the tree)", p)
		}
	}
	for _, r := range rows {
		if _, err := os.Stat(filepath.Join(repoRoot, r)); err != nil {
			t.Errorf("docs/design.md §3: row %s: not in the tree", r)
		}
	}
	for line, cands := range named {
		for _, c := range cands {
			ok := false
			for _, p := range c {
				if _, err := os.Stat(filepath.Join(repoRoot, p)); err == nil {
					ok = true
				}
			}
			if !ok {
				t.Errorf("docs/design.md §3: %s (in the row %.40s...) is not in the tree", c[1], line)
			}
		}
	}
}
