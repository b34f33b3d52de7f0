//go:build linux

package tests

import (
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xlimit/xlimit/userspace/api"
)

// TestResourceBounds: `xlimit status` reports the kernel memory of every
// map of the attachment (text and JSON) and the per-source table follows
// source_table_size; `xlimit check` rejects a file whose maps would exceed
// the memory ceiling, with FILE:LINE.
func TestResourceBounds(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(e.writeRules("rules.yaml", "source_table_size: 200000\n"+limitRules()))

	out, err := e.xlimit("status", "--json", "--iface", e.lab.ServerIf)
	if err != nil {
		t.Fatalf("status: %v: %s", err, out)
	}
	var rep api.StatusReport
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Interfaces) != 1 || rep.Interfaces[0].Memory == nil {
		t.Fatalf("status --json has no memory (%v): %s", err, out)
	}
	mem := rep.Interfaces[0].Memory
	var sources *api.MapMemory
	var sum uint64
	for i, m := range mem.Maps {
		sum += m.MemlockBytes
		if m.Name == "xl_src_table" {
			sources = &mem.Maps[i]
		}
	}
	t.Logf("e2e bounds: %d maps, kernel memlock %d B, estimate %d B", len(mem.Maps), mem.MemlockBytes, mem.EstimateBytes)
	// 200000 sources rounded up to 262144 ways, 65536 sets of four.
	if sources == nil || sources.MaxEntries != 65536 {
		t.Fatalf("xl_src_table missing or not sized by source_table_size: %+v", sources)
	}
	// 65536 sets of 128 B (xl_src_exts again as much), on whole pages
	// after the header's own page: the table is BPF_F_MMAPABLE
	// (dataplane.MapArrayMmap, as the kernel's array_map_mem_usage counts it).
	if want := uint64(4096 + 65536*128); sources.EstimateBytes != want {
		t.Errorf("xl_src_table estimate %d B, want %d", sources.EstimateBytes, want)
	}
	if sum != mem.MemlockBytes || mem.MemlockBytes < sources.EstimateBytes {
		t.Errorf("total memlock %d B: maps add up to %d B, the per-source table alone is %d B", mem.MemlockBytes, sum, sources.EstimateBytes)
	}
	text, err := e.xlimit("status", "--iface", e.lab.ServerIf)
	if err != nil || !strings.Contains(string(text), "memory: ") || !strings.Contains(string(text), "xl_src_table") {
		t.Errorf("status text has no memory line (%v):\n%s", err, text)
	}
	t.Logf("e2e bounds: xlimit status:\n%s", text)

	big := e.writeRules("big.yaml", "source_table_size: 33554432\n"+limitRules())
	out, err = exec.Command(xlimitBin, "check", big).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("check of a file over the memory ceiling: %v, want exit status 1:\n%s", err, out)
	}
	t.Logf("e2e bounds: xlimit check %s:\n%s", filepath.Base(big), out)
	if want := filepath.Base(big) + ":1: source_table_size: the per-source table of 33554432 entries"; !strings.Contains(string(out), want) {
		t.Errorf("check output lacks %q:\n%s", want, out)
	}
}
