//go:build linux

package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xlimit/xlimit/maps"
)

// An upgrade across a change of a pinned map's layout migrates the pins
// (maps/migrate.go): the new program is loaded with maps of its layout in
// a staging directory, the old maps' entries are converted into them, the
// rules are written, the program of the pinned link is swapped in one
// BPF_LINK_UPDATE and the staged pins replace the old ones. The interface
// always has a program: the old one until the swap, the new one after.

// migratingDir is the staging directory of a migration, in the
// interface's pin directory (under its lock; bpffs refuses names with
// dots).
const migratingDir = "migrating"

// testCrash, in tests, ends Attach at a step of a migration as a daemon
// killed there would: nothing is cleaned up.
var testCrash func(step string) bool

var errTestCrash = errors.New("test: killed here")

func crashAt(step string) error {
	if testCrash != nil && testCrash(step) {
		return errTestCrash
	}
	return nil
}

// resumeMigration finishes or forgets what a migration left in the
// staging directory when its daemon died: when the pinned link runs the
// program the migration pinned there before its swap, the swap happened
// and the pins are replaced now; otherwise the old program still runs on
// the old pins and the staged maps are garbage.
func resumeMigration(dir string) (resumed bool, err error) {
	stage := filepath.Join(dir, migratingDir)
	staged, exists, err := maps.StagedProgramID(stage)
	if err != nil || !exists {
		return false, err
	}
	if staged != 0 && linkProgram(dir) == staged {
		if err := maps.CommitStaged(dir, stage); err != nil {
			return false, fmt.Errorf("complete the migration of %s: %w", dir, err)
		}
		return true, nil
	}
	if err := os.RemoveAll(stage); err != nil {
		return false, fmt.Errorf("remove the migration left in %s: %w", stage, err)
	}
	return false, nil
}

// linkProgram is the id of the program of the XDP link pinned in dir, or
// 0.
func linkProgram(dir string) ebpf.ProgramID {
	l, err := link.LoadPinnedLink(filepath.Join(dir, linkPin), nil)
	if err != nil {
		return 0
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return 0
	}
	return info.Program
}
