//go:build linux

package loader

import (
	"os"
	"testing"

	"github.com/cilium/ebpf/link"

	"github.com/xlimit/xlimit/maps"
)

// TestExtensionLoads: xlimit's program loads as an freplace program into a
// slot of bpf/dispatcher.c and links to it, as sharing the interface needs.
func TestExtensionLoads(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs")
	}
	if err := FreplaceSupported(); err != nil {
		t.Skipf("this kernel refuses freplace programs, which sharing needs (libxdp falls back to one program alone here too): %v", err)
	}
	conf := maps.DispatcherConfig{NumProgsEnabled: 1}
	conf.ChainCallActions[0] = 1<<xdpPass | 1<<maps.DispatcherRetval
	disp, err := maps.LoadDispatcher(conf)
	if err != nil {
		t.Fatal(err)
	}
	defer disp.Close()
	o, err := maps.Load(maps.Options{Extend: &maps.Extension{Target: disp, Func: "prog0"}})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	l, err := link.AttachFreplace(disp, "prog0", o.Program())
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	got, err := maps.ReadDispatcherConfig(disp)
	if err != nil || got.NumProgsEnabled != 1 || got.Magic != maps.DispatcherMagic {
		t.Fatalf("read back the dispatcher's config: %+v, %v", got, err)
	}
}

// TestSharePlanOrder: the slots run by priority, then by name (libxdp's
// order), xlimit at SharePriority before libxdp's default 50, and each
// slot's chain actions keep the dispatcher's own return value.
func TestSharePlanOrder(t *testing.T) {
	comps := []component{
		{name: "zfilter", prio: 50, chain: 1 << xdpPass},
		{name: "afilter", prio: 50, chain: 1 << xdpPass},
		{name: "first", prio: 5, chain: 1<<xdpPass | 1<<1},
		{name: xlimitProgName, prio: SharePriority, chain: 1 << xdpPass, xlimit: true},
	}
	got, conf := planSlots(comps)
	var names []string
	for _, c := range got {
		names = append(names, c.name)
	}
	want := []string{"first", xlimitProgName, "afilter", "zfilter"}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("slot order %v, want %v", names, want)
		}
	}
	if conf.NumProgsEnabled != 4 || conf.RunPrios[1] != SharePriority || conf.ChainCallActions[1] != 1<<xdpPass|1<<maps.DispatcherRetval || conf.ChainCallActions[0] != 1<<xdpPass|1<<1|1<<maps.DispatcherRetval {
		t.Errorf("config %+v", conf)
	}
}

func TestParseShare(t *testing.T) {
	for _, s := range []string{"auto", "always", "never"} {
		if v, err := ParseShare(s); err != nil || string(v) != s {
			t.Errorf("ParseShare(%q) = %q, %v", s, v, err)
		}
	}
	if _, err := ParseShare("yes"); err == nil {
		t.Errorf("ParseShare(yes) accepted")
	}
}
