//go:build linux

package daemon

import (
	"errors"
	"net"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// An interface of the rules may go away and come back: a veth re-created,
// a VF reset, a bond rebuilt. The kernel detaches the program when the
// interface is deleted, and the one created under the same name has none:
// the daemon watches the link events (and checks every second, in case an
// event was lost) and attaches again to the new interface, adopting the
// pinned maps, so the rules keep their slots and buckets and the per-source
// table its state. xlimit_interface_attached{iface} and the log say which
// interfaces are protected.

// linkRecheck is how often the daemon checks its interfaces without an
// event: the bound on how long a re-created interface goes unprotected.
const linkRecheck = 500 * time.Millisecond

// linkEvent is a netlink change of an interface of the rules.
type linkEvent struct {
	name    string
	index   int
	deleted bool
	up      bool // administratively up
}

// watchLinks subscribes to link changes in the daemon's network namespace
// (call it on the daemon's goroutine) and forwards those of the
// interfaces of the rules. The returned stop ends the watch.
func (d *daemon) watchLinks(ifaces []string) (<-chan linkEvent, func()) {
	updates, done := make(chan netlink.LinkUpdate, 64), make(chan struct{})
	err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { d.log.Debug("netlink link watch", "err", err) },
	})
	if err != nil {
		d.log.Warn("not watching link events; interfaces that come back are re-attached within "+linkRecheck.String(), "err", err)
		return nil, func() {}
	}
	want := map[string]bool{}
	for _, i := range ifaces {
		want[i] = true
	}
	out := make(chan linkEvent, 64)
	go func() {
		for u := range updates {
			if u.Link == nil || !want[u.Link.Attrs().Name] {
				continue
			}
			ev := linkEvent{name: u.Link.Attrs().Name, index: u.Link.Attrs().Index, deleted: u.Header.Type == unix.RTM_DELLINK,
				up: u.Link.Attrs().Flags&net.FlagUp != 0}
			select {
			case out <- ev:
			default: // the periodic check catches up
			}
		}
	}()
	return out, func() {
		close(done)
		// netlink closes updates once it sees done; the goroutine above
		// drains it until then.
	}
}

// setAttached records whether iface is protected, for the metric and the
// API's status.
func (d *daemon) setAttached(iface string, attached bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.attached == nil {
		d.attached = map[string]bool{}
	}
	d.attached[iface] = attached
}

// interfacesAttached is xlimit_interface_attached: every configured
// interface, and whether the program is attached to it.
func (d *daemon) interfacesAttached() map[string]bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]bool, len(d.attached))
	for k, v := range d.attached {
		out[k] = v
	}
	return out
}

// attachment returns the attachment of iface, or nil.
func (d *daemon) attachment(iface string) *loader.Attachment {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, a := range d.attach {
		if a.Iface == iface {
			return a
		}
	}
	return nil
}

// onLink handles a link event on the loop goroutine.
func (d *daemon) onLink(ev linkEvent) {
	a := d.attachment(ev.name)
	switch {
	case ev.deleted && a != nil && ev.index == a.Ifindex:
		if d.isAttached(ev.name) {
			d.setAttached(ev.name, false)
			d.log.Error("interface deleted: UNPROTECTED until it comes back; then it is attached again", "iface", ev.name, "ifindex", ev.index)
		}
	case !ev.deleted && ev.up && (a == nil || ev.index != a.Ifindex || !d.isAttached(ev.name)):
		// Attached once it is up: a down interface receives nothing, and
		// whoever creates it configures it (offloads) while it is down.
		d.reattach(ev.name)
	}
}

func (d *daemon) isAttached(iface string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.attached[iface]
}

// checkLinks is the periodic check: an interface whose index changed
// (deleted and created again, events lost) or that is not attached is
// attached again if it exists.
func (d *daemon) checkLinks(ifaces []string) {
	for _, iface := range ifaces {
		nl, err := netlink.LinkByName(iface)
		if err != nil {
			if d.isAttached(iface) {
				d.setAttached(iface, false)
				d.log.Error("interface gone: UNPROTECTED until it comes back; then it is attached again", "iface", iface, "err", err)
			}
			continue
		}
		if nl.Attrs().Flags&net.FlagUp == 0 {
			continue
		}
		if a := d.attachment(iface); a == nil || a.Ifindex != nl.Attrs().Index || !d.isAttached(iface) {
			d.reattach(iface)
		}
	}
}

// reattach attaches to iface again (its interface was re-created): the
// program already loaded, with its pinned maps, so the rules keep their
// slots, buckets and counters and are in force from the first packet;
// failing that, a fresh attach adopting the pins, with the rules in
// force written before the program is attached. Then the rules are
// committed again for the queues and the loop's targets.
func (d *daemon) reattach(iface string) {
	a := d.attachment(iface)
	err := errors.New("not attached")
	if a != nil {
		err = a.Reattach(d.opts.Mode)
	}
	if err != nil {
		if a != nil {
			_ = a.Close() // this process's handles; the pins stay
		}
		fresh, ferr := loader.Attach(iface, loader.Options{BPFFS: d.opts.BPFFS, Mode: d.opts.Mode, SourceTableSize: d.sourceTableSize, Fill: d.fill(iface, d.specs)})
		d.mu.Lock()
		d.attach = removeAttachment(d.attach, a)
		if ferr == nil {
			d.attach = append(d.attach, fresh)
		}
		d.mu.Unlock()
		if ferr != nil {
			d.setAttached(iface, false)
			if msg := ferr.Error(); msg != d.reattachErr[iface] {
				d.reattachErr[iface] = msg
				d.log.Error("cannot attach again: UNPROTECTED; retrying", "iface", iface, "err", ferr, "reattach_err", err)
			}
			return
		}
		a = fresh
	}
	delete(d.reattachErr, iface)
	d.setAttached(iface, true)
	id, _ := a.ProgramID()
	d.log.Warn("interface back: attached again, protected", "iface", iface, "ifindex", a.Ifindex, "mode", a.Mode, "program_id", id, "pins", a.Dir)
	if err := d.apply(&prepared{specs: d.specs}); err != nil {
		d.log.Error("after attaching again: the rules in force could not be committed again (the kernel has them; queues and steering may lag)", "iface", iface, "err", err)
	}
}

func removeAttachment(list []*loader.Attachment, a *loader.Attachment) []*loader.Attachment {
	out := list[:0:0]
	for _, x := range list {
		if x != a {
			out = append(out, x)
		}
	}
	return out
}

// fill writes s's rules into an interface's maps before the program is
// attached (loader.Options.Fill), compiled against what the maps already
// hold so that every rule keeps its slot, bucket and counters.
func (d *daemon) fill(iface string, s *Specs) func(t *maps.Tables) error {
	return func(t *maps.Tables) error {
		if s == nil {
			return errors.New("no rules to write")
		}
		d.settlePending(iface, t) // confirm.go
		var prev *dataplane.Plan
		if p, err := t.ReadPlan(); err == nil && len(p.ActiveSlots()) > 0 {
			prev = p
		}
		plan, err := compileAgainst(iface, s.Dataplane, prev) // prepare.go
		if err != nil {
			return err
		}
		if err := t.Apply(plan); err != nil {
			return err
		}
		d.mu.Lock()
		d.plans[iface] = plan
		d.mu.Unlock()
		return nil
	}
}
