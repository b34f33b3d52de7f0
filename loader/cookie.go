//go:build linux

package loader

import (
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

// cookieCheck is the ACK side of SYN cookies, at TC ingress through a
// pinned tcx link. On a kernel without bpf_sk_assign_tcp_reqsk it does not
// load, and the error says so; the daemon then refuses rules with
// syn_cookies.
func (a *Attachment) cookieCheck() *tcxProgram {
	return &tcxProgram{
		pin:  filepath.Join(a.Dir, cookiePin),
		at:   ebpf.AttachTCXIngress,
		load: func() (tcProgram, error) { return a.objs.LoadCookieProgram(false) },
		attachErr: func(err error) error {
			return fmt.Errorf("attach the SYN cookie check at TC ingress of %s: %w", a.Iface, err)
		},
	}
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
