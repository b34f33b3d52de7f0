//go:build linux

package maps

import (
	"testing"

	"github.com/cilium/ebpf/asm"
)

// TestCookieAnswerWork: the SYN-ACK rewrite (xl_reply_cookie and the
// functions it calls) does no work that the answer does not need: it sums
// its checksums from the words it writes, calling bpf_csum_diff for none
// of them, and has at most one clock read (taken only when its caller has
// no time to give it: xl_cookie_take read it for the budget, and the
// answer reuses it; the profile in
// bench/results/issue28/cookie-ab-0f8c292-1f0f4fb.md shows one read per
// answer).
func TestCookieAnswerWork(t *testing.T) {
	spec, err := loadXdp()
	if err != nil {
		t.Fatal(err)
	}
	p := spec.Programs["xlimit_xdp"]
	if p == nil {
		t.Fatal("no xlimit_xdp program")
	}
	// The instructions of each function, and the functions it calls.
	body := map[string]asm.Instructions{}
	fn := ""
	for _, ins := range p.Instructions {
		if sym := ins.Symbol(); sym != "" {
			fn = sym
		}
		body[fn] = append(body[fn], ins)
	}
	if body["xl_reply_cookie"] == nil {
		t.Fatal("no xl_reply_cookie in xlimit_xdp")
	}
	helpers := map[asm.BuiltinFunc]int{}
	seen := map[string]bool{}
	var walk func(string)
	walk = func(f string) {
		if seen[f] {
			return
		}
		seen[f] = true
		for _, ins := range body[f] {
			switch {
			case ins.IsFunctionCall():
				walk(ins.Reference())
			case ins.IsBuiltinCall():
				helpers[asm.BuiltinFunc(ins.Constant)]++
			}
		}
	}
	walk("xl_reply_cookie")
	if n := helpers[asm.FnCsumDiff]; n > 0 {
		t.Errorf("the answer calls bpf_csum_diff %d times, want none (the checksums summed from the words written)", n)
	}
	if n := helpers[asm.FnKtimeGetNs]; n > 1 {
		t.Errorf("the answer has %d clock reads, want at most one", n)
	}
	t.Logf("helpers the answer calls: %v", helpers)
}
