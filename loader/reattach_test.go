//go:build linux

package loader

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// TestReattachTCPrograms: an interface deleted and created again under its
// name gets the loaded XDP program back, and the TC programs attached
// beside it (the SYN cookies' ACK check at ingress, the response timer at
// egress) too, on the new index. Both are attached as they are loaded, not
// loaded and verified again: for the cookie check that took 1.7 s of the
// daemon's loop and made tests.TestInterfaceComesBack miss its second.
func TestReattachTCPrograms(t *testing.T) {
	l, bpffs := setup(t)
	a, err := attachIn(t, l, bpffs, ModeAuto)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.CookieErr != nil || a.RespTimeErr != nil {
		t.Skipf("loader: the TC programs are not supported by this kernel (cookies: %v; response time: %v)", a.CookieErr, a.RespTimeErr)
	}
	oldIndex := a.Ifindex
	// The programs' IDs, as the TCX links attach them.
	progID := func(l link.Link) ebpf.ProgramID {
		if l == nil {
			return 0
		}
		info, err := l.Info()
		if err != nil {
			t.Fatalf("link info: %v", err)
		}
		return info.Program
	}
	cookieID := func() ebpf.ProgramID { return progID(a.cookieLink) }
	respID := func() ebpf.ProgramID { return progID(a.respTime) }
	oldCookie, oldResp := cookieID(), respID()
	if oldCookie == 0 || oldResp == 0 {
		t.Fatalf("the attachment holds no loaded TC program (cookie check %d, response timer %d)", oldCookie, oldResp)
	}
	var newIndex int
	err = l.Server.Do(func() error {
		nl, err := netlink.LinkByName(l.ServerIf)
		if err != nil {
			return err
		}
		if err := netlink.LinkDel(nl); err != nil {
			return err
		}
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: l.ServerIf}, PeerName: l.ServerIf + "p"}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(v); err != nil {
			return err
		}
		nl, err = netlink.LinkByName(l.ServerIf)
		if err != nil {
			return err
		}
		newIndex = nl.Attrs().Index
		return a.Reattach(ModeGeneric)
	})
	if err != nil {
		t.Fatalf("reattach: %v", err)
	}
	if newIndex == oldIndex || a.Ifindex != newIndex {
		t.Fatalf("index %d → %d, attachment on %d", oldIndex, newIndex, a.Ifindex)
	}
	for name, l := range map[string]link.Link{"cookie check": a.cookieLink, "response timer": a.respTime} {
		if l == nil || !sameTCX(l, newIndex) {
			t.Errorf("the %s is not attached to the new interface %d", name, newIndex)
		}
	}
	if now := cookieID(); now != oldCookie {
		t.Errorf("the cookie check was loaded again: program %d → %d, want the loaded one attached again", oldCookie, now)
	}
	if now := respID(); now != oldResp {
		t.Errorf("the response timer was loaded again: program %d → %d, want the loaded one attached again", oldResp, now)
	}
	if st, err := Inspect(bpffs, l.ServerIf); err != nil || !st.Attached || st.Ifindex != newIndex {
		t.Errorf("XDP after reattach: %+v, %v", st, err)
	}
}
