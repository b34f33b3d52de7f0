//go:build linux

package maps

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// maxCombinedStack is the most stack a chain of BPF calls may use, as the
// oldest kernel xlimit supports (6.1) counts it: each frame rounded up to
// 32 bytes, and at least 32 (docs/kernels.md). A newer verifier counts less, so a program
// that passes 6.18 can still be refused by 6.1; this test says so without
// booting 6.1 (`make test-kernel-qemu` does).
const maxCombinedStack = 512

// frameStack returns, for each function of a program (its entry and the
// bpf-to-bpf functions it calls), the stack it uses and the functions it
// calls.
func frameStack(insns asm.Instructions) (depth map[string]int, calls map[string][]string) {
	depth, calls = map[string]int{}, map[string][]string{}
	fn := ""
	for _, ins := range insns {
		if sym := ins.Symbol(); sym != "" {
			fn = sym
			depth[fn] = 0
		}
		if ins.IsFunctionCall() {
			calls[fn] = append(calls[fn], ins.Reference())
		}
		if (ins.Src == asm.R10 || ins.Dst == asm.R10) && ins.Offset < 0 {
			if d := -int(ins.Offset); d > depth[fn] {
				depth[fn] = d
			}
		}
	}
	return depth, calls
}

// TestCombinedStack: the deepest chain of calls of every program stays
// within 6.1's combined stack limit.
func TestCombinedStack(t *testing.T) {
	specs := map[string]func() (*ebpf.CollectionSpec, error){"xdp": loadXdp, "syncookie": loadSyncookie, "resptime": loadResptime}
	for obj, load := range specs {
		spec, err := load()
		if err != nil {
			t.Fatal(err)
		}
		for name, p := range spec.Programs {
			depth, calls := frameStack(p.Instructions)
			var deepest func(fn string, seen map[string]bool) (int, []string)
			deepest = func(fn string, seen map[string]bool) (int, []string) {
				if seen[fn] {
					t.Fatalf("%s/%s: recursive call through %s", obj, name, fn)
				}
				seen[fn] = true
				defer delete(seen, fn)
				best, chain := 0, []string(nil)
				for _, c := range calls[fn] {
					if d, ch := deepest(c, seen); d > best {
						best, chain = d, ch
					}
				}
				return (max(depth[fn], 1)+31)/32*32 + best, append([]string{fn}, chain...)
			}
			total, chain := deepest(p.Instructions[0].Symbol(), map[string]bool{})
			t.Logf("%s/%s: %d bytes through %v", obj, name, total, chain)
			if total > maxCombinedStack {
				t.Errorf("%s/%s: the calls %v take %d bytes of stack as 6.1 counts it, more than %d",
					obj, name, chain, total, maxCombinedStack)
			}
		}
	}
}
