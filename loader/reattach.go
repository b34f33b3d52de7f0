//go:build linux

package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// Reattach attaches a's program, as it is loaded, to the interface now
// named a.Iface: the one it was attached to was deleted and created again
// under the same name, with a new index. The program, its maps and the
// pins stay: nothing is loaded or verified again, and the rules the maps
// hold are in force from the new interface's first packet. The stale
// pinned link (its interface is gone) is replaced. The TC programs this
// package attached besides XDP (the SYN cookies' ACK check at ingress, the
// response timer at egress) went with the old interface: they stay loaded
// and are linked again to the new one.
func (a *Attachment) Reattach(mode Mode) error {
	if a.objs == nil {
		return errors.New("reattach: the attachment is closed")
	}
	if mode == "" {
		mode = ModeAuto
	}
	nl, err := netlink.LinkByName(a.Iface)
	if err != nil {
		return fmt.Errorf("reattach: find interface %s: %w", a.Iface, err)
	}
	index := nl.Attrs().Index
	// The interface may be another device now: a program loaded with
	// XDP_TX is not attached where the preflight avoids it (the caller
	// attaches afresh, which loads one without).
	if !a.noTx {
		if d, _ := Preflight(a.Iface, mode); !d.XDPTx {
			return fmt.Errorf("reattach to %s: the driver's preflight avoids XDP_TX there now, and this program sends it", a.Iface)
		}
	}
	if a.Shared {
		return a.reattachShared(index, mode)
	}
	l, err := attach(a.objs.Program(), index, mode)
	if err != nil {
		return fmt.Errorf("reattach to %s: %w", a.Iface, err)
	}
	pin := filepath.Join(a.Dir, linkPin)
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		_ = old.Unpin()
		old.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		l.Close()
		return fmt.Errorf("reattach: load pinned link %s: %w", pin, err)
	}
	if err := l.Pin(pin); err != nil {
		l.Close()
		return fmt.Errorf("reattach: pin link: %w", err)
	}
	if a.link != nil {
		a.link.Close()
	}
	a.link, a.Ifindex, a.Adopted = l, index, false
	a.Mode = currentMode(index)
	return a.relinkTC(index)
}

// reattachShared is Reattach through libxdp's dispatcher: the dispatcher
// went with the old interface, so a new one runs xlimit's slot (the same
// freplace program, linked to it) and whatever programs the new interface
// already shares.
func (a *Attachment) reattachShared(index int, mode Mode) error {
	tx, err := beginShare(filepath.Dir(filepath.Dir(a.Dir)), index, mode, xlimitComponent())
	if err != nil {
		return fmt.Errorf("reattach to %s: %w", a.Iface, err)
	}
	defer tx.close()
	l, err := tx.commit(a.objs.Program())
	if err != nil {
		return fmt.Errorf("reattach to %s through libxdp's dispatcher: %w", a.Iface, err)
	}
	if a.link != nil {
		a.link.Close()
	}
	a.link, a.Ifindex, a.Adopted = l, index, false
	a.Mode = currentMode(index)
	return a.relinkTC(index)
}

// relinkTC links the TC programs again to the interface index.
func (a *Attachment) relinkTC(index int) error {
	// Keyed on the loaded program, not on its link: a relink that failed
	// left the link nil and the program loaded, and is tried again here.
	var errs []error
	for _, t := range []*tcxProgram{a.cookies, a.respTime, a.requests} {
		if t.loaded() {
			errs = append(errs, t.relink(index))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reattach the TC programs to %s: %w", a.Iface, err)
	}
	return nil
}
