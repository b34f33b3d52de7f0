//go:build linux

package maps

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// TestCookieSupport: CookieSupport agrees with the kernel's BTF, and where
// the kfunc is missing (Linux 6.1, the kernel tier's second kernel) the
// refusal names it and the version that has it; LoadCookieProgram refuses
// with the same error there. The XDP object loads either way
// (TestLoadVerifies).
func TestCookieSupport(t *testing.T) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatalf("kernel BTF: %v", err)
	}
	var fn *btf.Func
	has := spec.TypeByName(CookieKfunc, &fn) == nil
	err = CookieSupport()
	t.Logf("kernel %s: %s present: %v; CookieSupport: %v", kernelRelease(), CookieKfunc, has, err)
	if has {
		if err != nil {
			t.Fatalf("the kernel has %s, CookieSupport says %v", CookieKfunc, err)
		}
		return
	}
	if !errors.Is(err, ErrCookieKernel) {
		t.Fatalf("no %s, CookieSupport: %v, want ErrCookieKernel", CookieKfunc, err)
	}
	for _, want := range []string{"syn_cookies", "bpf_sk_assign_tcp_reqsk", "Linux 6.9"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not name %q", err, want)
		}
	}
	h := newHarness(t)
	if p, err := h.obj.LoadCookieProgram(true); !errors.Is(err, ErrCookieKernel) {
		if p != nil {
			p.Close()
		}
		t.Errorf("LoadCookieProgram without the kfunc: %v, want ErrCookieKernel", err)
	}
}
