//go:build linux

package loader

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xlimit/xlimit/tests/kit/lab"
)

// TestReattachTCPrograms: an interface deleted and created again under its
// name gets the loaded XDP program back, and the TC programs attached
// beside it (the SYN cookies' ACK check at ingress, the response timer at
// egress) too, on the new index. Both are attached as they are loaded, not
// loaded and verified again: for the cookie check that took 1.7 s of the
// daemon's loop and made tests.TestInterfaceComesBack miss its second.
func TestReattachTCPrograms(t *testing.T) {
	l, bpffs, a := attachWithTC(t)
	oldIndex := a.Ifindex
	cookieID := func() ebpf.ProgramID { return linkProgID(t, a.cookies.link) }
	respID := func() ebpf.ProgramID { return linkProgID(t, a.respTime.link) }
	oldCookie, oldResp := cookieID(), respID()
	if oldCookie == 0 || oldResp == 0 {
		t.Fatalf("the attachment holds no loaded TC program (cookie check %d, response timer %d)", oldCookie, oldResp)
	}
	newIndex, err := recreateAndReattach(l, a)
	if err != nil {
		t.Fatalf("reattach: %v", err)
	}
	if newIndex == oldIndex || a.Ifindex != newIndex {
		t.Fatalf("index %d → %d, attachment on %d", oldIndex, newIndex, a.Ifindex)
	}
	for name, l := range map[string]link.Link{"cookie check": a.cookies.link, "response timer": a.respTime.link} {
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

// TestReattachRetriesFailedRelink: when linking a TC program to the new
// interface fails, the program stays loaded and the next Reattach (the
// interface came back once more) links it again, the same program. The
// failure is made by a directory where the TCX links are pinned: tcxLink
// cannot load the pin, as with any pin it cannot read.
func TestReattachRetriesFailedRelink(t *testing.T) {
	l, bpffs, a := attachWithTC(t)
	cookieLink := func() link.Link { return a.cookies.link }
	respLink := func() link.Link { return a.respTime.link }
	oldCookie, oldResp := linkProgID(t, cookieLink()), linkProgID(t, respLink())
	if oldCookie == 0 || oldResp == 0 {
		t.Fatalf("the attachment holds no loaded TC program (cookie check %d, response timer %d)", oldCookie, oldResp)
	}
	pins := []string{filepath.Join(a.Dir, cookiePin), filepath.Join(a.Dir, respTimePin)}
	for _, pin := range pins {
		if err := os.Remove(pin); err != nil {
			t.Fatalf("unpin %s: %v", pin, err)
		}
		if err := os.Mkdir(pin, 0o700); err != nil {
			t.Fatalf("block %s: %v", pin, err)
		}
	}
	if _, err := recreateAndReattach(l, a); err == nil {
		t.Fatal("reattach linked the TC programs through unreadable pins")
	} else {
		t.Logf("first reattach, as meant: %v", err)
	}
	for _, pin := range pins {
		if err := os.Remove(pin); err != nil {
			t.Fatalf("unblock %s: %v", pin, err)
		}
	}
	newIndex, err := recreateAndReattach(l, a)
	if err != nil {
		t.Fatalf("second reattach: %v", err)
	}
	if a.Ifindex != newIndex {
		t.Fatalf("attachment on %d, interface %d", a.Ifindex, newIndex)
	}
	for name, l := range map[string]link.Link{"cookie check": cookieLink(), "response timer": respLink()} {
		if l == nil || !sameTCX(l, newIndex) {
			t.Errorf("the %s is not attached to the new interface %d after a failed relink", name, newIndex)
		}
	}
	if now := linkProgID(t, cookieLink()); now != oldCookie {
		t.Errorf("cookie check: program %d → %d, want the loaded one attached again", oldCookie, now)
	}
	if now := linkProgID(t, respLink()); now != oldResp {
		t.Errorf("response timer: program %d → %d, want the loaded one attached again", oldResp, now)
	}
	for _, pin := range pins {
		if _, err := os.Stat(pin); err != nil {
			t.Errorf("link pin %s: %v", pin, err)
		}
	}
	if st, err := Inspect(bpffs, l.ServerIf); err != nil || !st.Attached || st.Ifindex != newIndex {
		t.Errorf("XDP after reattach: %+v, %v", st, err)
	}
}

// attachWithTC attaches in a new lab, and skips the test where the kernel
// cannot run both TC programs.
func attachWithTC(t *testing.T) (*lab.Lab, string, *Attachment) {
	t.Helper()
	l, bpffs := setup(t)
	a, err := attachIn(t, l, bpffs, ModeAuto)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() }) // runs before setup's, which closes the lab
	if a.CookieErr != nil || a.RespTimeErr != nil {
		t.Skipf("loader: the TC programs are not supported by this kernel (cookies: %v; response time: %v)", a.CookieErr, a.RespTimeErr)
	}
	return l, bpffs, a
}

// recreateAndReattach re-creates the server's interface under its name
// (recreateIf) and re-attaches a to it; it returns the new index.
func recreateAndReattach(l *lab.Lab, a *Attachment) (int, error) {
	var index int
	err := l.Server.Do(func() error {
		var err error
		if index, err = recreateIf(l.ServerIf); err != nil {
			return err
		}
		return a.Reattach(ModeGeneric)
	})
	return index, err
}

// linkProgID is the ID of the program that the TCX link l attaches, 0 for
// no link.
func linkProgID(t *testing.T, l link.Link) ebpf.ProgramID {
	t.Helper()
	if l == nil {
		return 0
	}
	info, err := l.Info()
	if err != nil {
		t.Fatalf("link info: %v", err)
	}
	return info.Program
}
