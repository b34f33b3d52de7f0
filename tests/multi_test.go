//go:build linux

package tests

import (
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestSeveralInterfaces: one daemon protects two interfaces, each with its
// own pins; status lists both; detach removes one and leaves the other.
func TestSeveralInterfaces(t *testing.T) {
	e := newEnv(t)
	second, peer := e.lab.ServerIf+"b", e.lab.ServerIf+"p"
	err := e.lab.Server.Do(func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: second}, PeerName: peer}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		return netlink.LinkSetUp(v)
	})
	if err != nil {
		t.Fatalf("create second veth: %v", err)
	}
	t.Cleanup(func() {
		if out, err := e.xlimit("detach", "--iface", second); err != nil && !strings.Contains(string(out), "nothing pinned") {
			t.Errorf("cleanup detach %s: %v: %s", second, err, out)
		}
	})

	d := e.startDaemon(e.writeRules("rules.yaml", limitRules()), "--iface", second)
	if n := strings.Count(d.Log(), "msg=attached"); n != 2 {
		t.Fatalf("attached %d times, want 2:\n%s", n, d.Log())
	}
	out, err := e.xlimit("status")
	if err != nil {
		t.Fatalf("status: %v: %s", err, out)
	}
	for _, iface := range []string{e.lab.ServerIf, second} {
		if !strings.Contains(string(out), iface+": attached") {
			t.Errorf("status does not show %s attached:\n%s", iface, out)
		}
	}
	if out, err := e.xlimit("detach", "--iface", second); err != nil {
		t.Fatalf("detach %s: %v: %s", second, err, out)
	}
	out, _ = e.xlimit("status")
	if strings.Contains(string(out), second) || !strings.Contains(string(out), e.lab.ServerIf+": attached") {
		t.Errorf("after detaching %s:\n%s", second, out)
	}
}
