//go:build linux

package gen

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// TestResyn: a receiver that grows the frame and overwrites its first byte
// sees the frame put back before every repeat (it drops the frame when the
// byte is the original one, and passes it otherwise, so a repeat that saw
// its own rewrite would pass), and a frame of the wrong length is refused.
func TestResyn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to load BPF programs")
	}
	// r6 = ctx; if data[0] != 0xaa: pass; grow the frame by 20 bytes;
	// data[0] = 0x55; drop.
	rcv, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		// The attach type of xlgen_resyn's ELF section: a tail call
		// reaches only a program of the same.
		Type: ebpf.XDP, AttachType: ebpf.AttachXDP, License: "Dual BSD/GPL",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.LoadMem(asm.R2, asm.R6, 0, asm.Word),
			asm.LoadMem(asm.R3, asm.R6, 4, asm.Word),
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, 1),
			asm.JGT.Reg(asm.R4, asm.R3, "pass"),
			asm.LoadMem(asm.R4, asm.R2, 0, asm.Byte),
			asm.JNE.Imm(asm.R4, 0xaa, "pass"),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Imm(asm.R2, 20),
			asm.FnXdpAdjustTail.Call(),
			asm.JNE.Imm(asm.R0, 0, "pass"),
			asm.LoadMem(asm.R2, asm.R6, 0, asm.Word),
			asm.LoadMem(asm.R3, asm.R6, 4, asm.Word),
			asm.Mov.Reg(asm.R4, asm.R2),
			asm.Add.Imm(asm.R4, 1),
			asm.JGT.Reg(asm.R4, asm.R3, "pass"),
			asm.StoreImm(asm.R2, 0, 0x55, asm.Byte),
			asm.Mov.Imm(asm.R0, 1), // XDP_DROP
			asm.Return(),
			asm.Mov.Imm(asm.R0, 2).WithSymbol("pass"), // XDP_PASS
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	frame := make([]byte, 60)
	frame[0] = 0xaa
	r, err := NewResyn(rcv, frame)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ret, _, err := r.Run(100)
	if err != nil {
		t.Fatal(err)
	}
	if ret != 1 {
		t.Errorf("after 100 repeats the receiver returned %d, want XDP_DROP (1): a repeat saw the frame it had rewritten", ret)
	}
	if _, err := NewResyn(rcv, make([]byte, frameMax+1)); err == nil {
		t.Errorf("a frame of %d bytes was taken", frameMax+1)
	}
}
