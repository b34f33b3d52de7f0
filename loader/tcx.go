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
