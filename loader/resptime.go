//go:build linux

package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// respTimePin is the pin of the TCX link that attaches the response
// timer (bpf/resptime_tc.c) to the interface's egress, beside the XDP link.
const respTimePin = "resptime_link"

// ErrRespTimeKernel says why a kernel cannot run rules with signal
// response_time: its responses are timed by a TC egress program attached
// through a TCX link, which Linux has since 6.6.
var ErrRespTimeKernel = errors.New("signal response_time needs TCX (BPF links for tc egress, Linux 6.6 or newer), which this kernel lacks")

// attachRespTime loads the response timer over the XDP object's maps and
// attaches it to the interface's egress through a pinned TCX link, or
// replaces the program of the pinned link in place (a restart adopts it).
func (a *Attachment) attachRespTime() error {
	prog, err := a.objs.LoadRespProgram(false)
	if err != nil {
		return err
	}
	defer prog.Close() // the link holds the program
	pin := filepath.Join(a.Dir, respTimePin)
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		if sameTCX(l, a.Ifindex) {
			if err := l.Update(prog.Program()); err == nil {
				a.respTime = l
				return nil
			}
		}
		// The interface was deleted (its TCX links with it), or the
		// link detached: start anew.
		_ = l.Unpin()
		l.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("load pinned link %s: %w", pin, err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: a.Ifindex, Program: prog.Program(), Attach: ebpf.AttachTCXEgress})
	if err != nil {
		if errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("%w (%v)", ErrRespTimeKernel, err)
		}
		return fmt.Errorf("attach the response timer to %s egress: %w", a.Iface, err)
	}
	if err := l.Pin(pin); err != nil {
		l.Close()
		return fmt.Errorf("pin the response timer's link: %w", err)
	}
	a.respTime = l
	return nil
}

func sameTCX(l link.Link, ifindex int) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	t := info.TCX()
	return t != nil && int(t.Ifindex) == ifindex
}
