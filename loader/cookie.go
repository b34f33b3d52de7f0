//go:build linux

package loader

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/xlimit/xlimit/maps"
)

// cookiePin is the pin of the TC (tcx ingress) link of the SYN cookies'
// ACK side, beside the XDP link.
const cookiePin = "cookie_link"

// CookieSupport reports whether this kernel can run rules with
// syn_cookies: nil, or an error naming the missing kernel function
// (maps.ErrCookieKernel).
func CookieSupport() error { return maps.CookieSupport() }

// attachCookies loads the ACK side of SYN cookies and attaches it at TC
// ingress through a pinned tcx link, or replaces the program of the
// pinned link in place (a restarted daemon adopts it like the XDP link).
// On a kernel without bpf_sk_assign_tcp_reqsk nothing is attached and the
// error says so; the daemon then refuses rules with syn_cookies.
func (a *Attachment) attachCookies() error {
	cp, err := a.objs.LoadCookieProgram(false)
	if err != nil {
		return err
	}
	if err := a.linkCookies(cp); err != nil {
		cp.Close()
		return err
	}
	return nil
}

// relinkCookies attaches the loaded ACK side again, to the interface's
// current index (it was re-created, and its TCX links went with it). The
// program stays loaded: verifying it again (942 295 instructions) took
// 1.7 s of the daemon's loop on the 2-CPU VM, with no control tick and no
// ACK checked meanwhile, and made the re-attach miss its second
// (TestInterfaceComesBack).
func (a *Attachment) relinkCookies() error {
	if a.cookieLink != nil {
		_ = a.cookieLink.Close() // detached with the old interface
		a.cookieLink = nil
	}
	if a.cookieProg == nil {
		return a.attachCookies()
	}
	return a.linkCookies(a.cookieProg)
}

// linkCookies attaches cp at TC ingress through the pinned tcx link
// (tcxLink). It leaves cp open on failure.
func (a *Attachment) linkCookies(cp *maps.CookieProgram) error {
	l, err := tcxLink(filepath.Join(a.Dir, cookiePin), a.Ifindex, cp.Program(), ebpf.AttachTCXIngress)
	if err != nil {
		return fmt.Errorf("attach the SYN cookie check at TC ingress of %s: %w", a.Iface, err)
	}
	a.cookieProg, a.cookieLink = cp, l
	return nil
}

// RefreshCookieLink writes the MSS that cookie SYN-ACKs announce, from the
// interface's MTU (maps.MSSForMTU), into the attachment's xl_cookie_link,
// drawing its cookie offset when it has none. Attach does it before the
// program sees a packet; the daemon again on every link change, so an
// MTU change is followed (docs/dataplane.md, "SYN cookies").
func (a *Attachment) RefreshCookieLink() error {
	nl, err := netlink.LinkByIndex(a.Ifindex)
	if err != nil {
		return fmt.Errorf("read the MTU of %s: %w", a.Iface, err)
	}
	if err := a.Tables().SetCookieMTU(nl.Attrs().MTU); err != nil {
		return fmt.Errorf("cookie settings of %s: %w", a.Iface, err)
	}
	return nil
}

func (a *Attachment) closeCookies() error {
	var errs []error
	if a.cookieLink != nil {
		errs = append(errs, a.cookieLink.Close())
		a.cookieLink = nil
	}
	if a.cookieProg != nil {
		errs = append(errs, a.cookieProg.Close())
		a.cookieProg = nil
	}
	return errors.Join(errs...)
}
