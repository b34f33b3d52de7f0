//go:build linux

package loader

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// tcxLink attaches prog at the TCX hook at of ifindex through the link
// pinned at pin. When the pinned link is still on this interface its
// program is replaced in place (a restarted daemon adopts it like the XDP
// link). Otherwise (the interface was re-created and its TCX links went
// with it, or the link was detached) the stale pin is removed and a new
// link is attached and pinned. The caller keeps prog open or closes it:
// the link holds its own reference.
func tcxLink(pin string, ifindex int, prog *ebpf.Program, at ebpf.AttachType) (link.Link, error) {
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		if sameTCX(l, ifindex) {
			if err := l.Update(prog); err == nil {
				return l, nil
			}
		}
		_ = l.Unpin()
		l.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("load pinned link %s: %w", pin, err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
	if err != nil {
		return nil, fmt.Errorf("attach at %v of interface %d: %w", at, ifindex, err)
	}
	if err := l.Pin(pin); err != nil {
		l.Close()
		return nil, fmt.Errorf("pin link %s: %w", pin, err)
	}
	return l, nil
}

// sameTCX reports whether l is a TCX link on ifindex.
func sameTCX(l link.Link, ifindex int) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	t := info.TCX()
	return t != nil && int(t.Ifindex) == ifindex
}

// tcxProgram is a TC program kept loaded behind a pinned TCX link: the
// SYN cookies' ACK check at ingress (cookie.go), the response timer at
// egress (resptime.go). The program outlives its link: when the interface
// is re-created only the link is made again (relink), since verifying the
// program again stalls the daemon's loop (1.7 s for the cookie check on
// the 2-CPU VM, which made TestInterfaceComesBack miss its second).
type tcxProgram struct {
	pin  string // path of the link's pin
	at   ebpf.AttachType
	load func() (tcProgram, error)
	// attachErr words an error of tcxLink for the attachment's interface.
	attachErr func(error) error

	prog tcProgram // nil until loaded
	link link.Link // nil while not linked
}

// tcProgram is what maps loads for a TC program (maps.CookieProgram,
// maps.RespProgram).
type tcProgram interface {
	Program() *ebpf.Program
	Close() error
}

// attach loads the program and links it to ifindex through the pinned
// link (tcxLink: adopted and updated in place after a restart). On failure
// nothing stays loaded.
func (t *tcxProgram) attach(ifindex int) error {
	prog, err := t.load()
	if err != nil {
		return err // prog may be a nil pointer in a non-nil interface
	}
	if err := t.linkTo(ifindex, prog); err != nil {
		prog.Close()
		return err
	}
	return nil
}

// relink links the loaded program again, to ifindex: the interface was
// re-created and its TCX links went with the old one. It loads the
// program only if it never was. On failure the program stays loaded and
// the link nil, for the next relink to try again.
func (t *tcxProgram) relink(ifindex int) error {
	if t.link != nil {
		_ = t.link.Close() // detached with the old interface
		t.link = nil
	}
	if t.prog == nil {
		return t.attach(ifindex)
	}
	return t.linkTo(ifindex, t.prog)
}

// loaded reports whether the program is held, linked or not.
func (t *tcxProgram) loaded() bool { return t != nil && t.prog != nil }

// linkTo links prog to ifindex; it leaves prog open on failure.
func (t *tcxProgram) linkTo(ifindex int, prog tcProgram) error {
	l, err := tcxLink(t.pin, ifindex, prog.Program(), t.at)
	if err != nil {
		return t.attachErr(err)
	}
	t.prog, t.link = prog, l
	return nil
}

// close releases this process's handles on the link and the program; the
// pinned link keeps the program attached.
func (t *tcxProgram) close() error {
	if t == nil {
		return nil
	}
	var errs []error
	if t.link != nil {
		errs = append(errs, t.link.Close())
		t.link = nil
	}
	if t.prog != nil {
		errs = append(errs, t.prog.Close())
		t.prog = nil
	}
	return errors.Join(errs...)
}
