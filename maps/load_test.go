//go:build linux

package maps

import (
	"os"
	"testing"
)

// requireRoot skips a test that needs to load BPF programs.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs (CI runs it as root)")
	}
}

func TestLoadVerifies(t *testing.T) {
	requireRoot(t)
	o, err := Load(Options{FakeClock: true})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	info, err := o.Program().Info()
	if err != nil {
		t.Fatal(err)
	}
	insns, _ := info.Instructions()
	t.Logf("program %s: %d instructions", info.Name, len(insns))
}
