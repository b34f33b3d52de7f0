package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The test kit (tests/kit: the lab, the frame builder, the corpus, the XDP
// pass program) serves tests and `xlimit demo`; the release binary must not
// carry it. These tests ask the go command for the binary's dependency
// graph as the release targets build it (make build-release, make deb,
// make image: no tags, CGO_ENABLED=0).

// kitPrefix is what no package of the release binary's graph may start with.
const kitPrefix = "github.com/xlimit/xlimit/tests/"

// deps returns the import paths ./cmd/xlimit depends on, built with tags.
func deps(t *testing.T, tags string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-tags", tags, "-f", "{{.ImportPath}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list -deps -tags %q .: %v\n%s", tags, err, msg)
	}
	return strings.Fields(string(out))
}

// TestReleaseDepsNoKit fails when the release build of ./cmd/xlimit (no
// tags) depends on any package under tests/, and checks that the demo's
// build (tag xlimit_demo: make build, make build-test) still reaches the
// lab and, without -short, compiles.
func TestReleaseDepsNoKit(t *testing.T) {
	for _, tags := range []string{"", "xlimit_faults"} {
		var bad []string
		for _, p := range deps(t, tags) {
			if strings.HasPrefix(p, kitPrefix) {
				bad = append(bad, p)
			}
		}
		if len(bad) > 0 {
			t.Errorf("the release binary (go list -deps -tags %q ./cmd/xlimit) reaches the test kit: %s", tags, strings.Join(bad, " "))
		} else {
			t.Logf("tags %q: no dependency under %s", tags, kitPrefix)
		}
	}
	if d := deps(t, "xlimit_demo"); !slices.Contains(d, kitPrefix+"kit/lab") {
		t.Errorf("the demo's build (tag xlimit_demo) does not reach %skit/lab: is xlimit demo wired?", kitPrefix)
	}
	if testing.Short() {
		return // the two builds below take most of a minute uncached
	}
	for _, tags := range []string{"xlimit_demo", "xlimit_faults,xlimit_demo"} {
		cmd := exec.Command("go", "build", "-tags", tags, "-o", os.DevNull, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("go build -tags %s ./cmd/xlimit: %v\n%s", tags, err, out)
		} else {
			t.Logf("go build -tags %s ./cmd/xlimit: ok", tags)
		}
	}
}
