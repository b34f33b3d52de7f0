package maps

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

// TestMapClasses: configMaps, which a migration converts before the rules
// are written, are exactly the pinned maps whose comment in bpf/*.h says
// "Config." (written by the daemon); every other pinned map's says
// "State." (docs/design.md section 2). A map added later is classed by
// its comment, or this test names it.
func TestMapClasses(t *testing.T) {
	files, err := filepath.Glob("../bpf/*.h")
	if err != nil || len(files) == 0 {
		t.Fatalf("no headers: %v", err)
	}
	// A map's comment, its definition, its name.
	def := regexp.MustCompile(`(?s)/\*\s*(Config|State|Test only)[.,]((?:[^*]|\*[^/])*)\*/\s*struct\s*\{(?:[^}]*)\}\s*(xl_\w+)\s+SEC\("\.maps"\)`)
	class := map[string]string{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range def.FindAllSubmatch(src, -1) {
			class[string(m[3])] = string(m[1])
		}
	}
	for _, name := range PinnedNames() {
		c, ok := class[name]
		switch {
		case !ok:
			t.Errorf("%s: no map comment saying Config. or State. before its definition", name)
		case (c == "Config") != configMaps[name]:
			t.Errorf("%s: its comment says %s, the migration's configMaps %v", name, c, configMaps[name])
		}
	}
	for name := range configMaps {
		if !slices.Contains(PinnedNames(), name) {
			t.Errorf("configMaps names %s, which is not pinned", name)
		}
	}
}
