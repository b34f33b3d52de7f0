//go:build linux

package daemon

import (
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/maps"
)

// An interface of the rules may go away and come back: a veth re-created,
// a VF reset, a bond rebuilt. The kernel detaches the program when the
// interface is deleted, and the one created under the same name has none:
// the daemon watches the link events (and checks every linkRecheck, in
// case an event was lost) and attaches again to the new interface,
// adopting the pinned maps, so the rules keep their slots and buckets and
// the per-source table its state. xlimit_interface_attached{iface} and the
// log say which interfaces are protected.

// linkRecheck is how often the daemon checks its interfaces without an
// event: the bound on how long a re-created interface goes unprotected.
const linkRecheck = 500 * time.Millisecond

// links is the part that attaches the program to the configured
// interfaces and keeps it attached. It is given how to reach the
// attachments (the daemon's list, under the daemon's lock), the rules to
// write before an attach and what to do after a re-attach; it keeps which
// interfaces are protected. Its methods but status run on the loop
// goroutine.
type links struct {
	log    *slog.Logger
	ifaces []string       // the configured interfaces
	opts   loader.Options // how to attach (BPFFS, Mode, SourceTableSize); Fill is set per attach
	// attachments runs f with the daemon's attachments under the lock
	// that guards them; f may replace entries.
	attachments func(f func(list *[]*loader.Attachment))
	// fill writes the rules in force into an interface's maps before its
	// program is attached (loader.Options.Fill).
	fill func(iface string) func(*maps.Tables) error
	// back commits the rules in force again once an interface is attached
	// again (for the queues and the loop's targets).
	back func(iface string)

	reattachErr map[string]string // the last error of attaching again, logged once

	mu       sync.Mutex      // guards attached against the metrics collector and the API
	attached map[string]bool // configured interface → the program is attached
}

// attachAll attaches to every interface, adopting what an earlier daemon
// left pinned, with fill's rules written before the program is attached
// (no window with an empty program).
func (l *links) attachAll(fill func(iface string) func(*maps.Tables) error) error {
	l.reattachErr = map[string]string{}
	for _, iface := range l.ifaces {
		o := l.opts
		o.Fill = fill(iface)
		a, err := loader.Attach(iface, o)
		if err != nil {
			return err
		}
		l.attachments(func(list *[]*loader.Attachment) { *list = append(*list, a) })
		l.setAttached(iface, true)
		id, _ := a.ProgramID()
		l.log.Info("attached", "iface", iface, "mode", a.Mode, "shared", a.Shared, "adopted", a.Adopted, "program_id", id, "pins", a.Dir)
		logPreflight(l.log, a) // answer.go
		if a.Resumed {
			l.log.Warn("completed the migration of the pins that a daemon stopped in the middle of", "iface", iface)
		}
		if len(a.Migrated) > 0 {
			reports := make([]string, len(a.Migrated))
			for i, r := range a.Migrated {
				reports[i] = r.String()
			}
			l.log.Warn("pins of an xlimit with other map layouts migrated to this version's: same link, program swapped, state converted", "iface", iface, "maps", strings.Join(reports, "; "))
		}
		if a.SourcesReset {
			l.log.Warn("the per-source table changed size: per-source buckets start afresh", "iface", iface, "size", l.opts.SourceTableSize)
		}
		if a.ConnCountErr != nil {
			l.log.Warn("connections in flight are not counted: concurrency limits refuse nothing", "iface", iface, "err", a.ConnCountErr)
		}
		if err := a.HostAddrs.Err; err != nil {
			l.log.Warn("cannot write the host's addresses: rules are enforced, answers (resets, SYN cookies) go by the addresses last written; retried on the next address event", "iface", iface, "err", err)
		}
	}
	return nil
}

// linkEvent is a netlink change of an interface of the rules.
type linkEvent struct {
	name    string
	index   int
	deleted bool
	up      bool // administratively up
}

// watch subscribes to link changes in the daemon's network namespace
// (call it on the daemon's goroutine) and forwards those of the
// configured interfaces. The returned stop ends the watch.
func (l *links) watch() (<-chan linkEvent, func()) {
	updates, done := make(chan netlink.LinkUpdate, 64), make(chan struct{})
	err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { l.log.Debug("netlink link watch", "err", err) },
	})
	if err != nil {
		l.log.Warn("not watching link events; interfaces that come back are re-attached within "+linkRecheck.String(), "err", err)
		return nil, func() {}
	}
	want := map[string]bool{}
	for _, i := range l.ifaces {
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
func (l *links) setAttached(iface string, attached bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.attached == nil {
		l.attached = map[string]bool{}
	}
	l.attached[iface] = attached
}

func (l *links) isAttached(iface string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.attached[iface]
}

// status is xlimit_interface_attached: every configured interface, and
// whether the program is attached to it. Safe from any goroutine.
func (l *links) status() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]bool, len(l.attached))
	for k, v := range l.attached {
		out[k] = v
	}
	return out
}

// attachment returns the attachment of iface, or nil.
func (l *links) attachment(iface string) *loader.Attachment {
	var found *loader.Attachment
	l.attachments(func(list *[]*loader.Attachment) {
		for _, a := range *list {
			if a.Iface == iface {
				found = a
			}
		}
	})
	return found
}

// onEvent handles a link event.
func (l *links) onEvent(ev linkEvent) {
	a := l.attachment(ev.name)
	switch {
	case ev.deleted && a != nil && ev.index == a.Ifindex:
		if l.isAttached(ev.name) {
			l.setAttached(ev.name, false)
			l.log.Error("interface deleted: UNPROTECTED until it comes back; then it is attached again", "iface", ev.name, "ifindex", ev.index)
		}
	case !ev.deleted && ev.up && (a == nil || ev.index != a.Ifindex || !l.isAttached(ev.name)):
		// Attached once it is up: a down interface receives nothing, and
		// whoever creates it configures it (offloads) while it is down.
		l.reattach(ev.name)
	}
}

// check is the periodic check: an interface whose index changed (deleted
// and created again, events lost) or that is not attached is attached
// again if it exists.
func (l *links) check() {
	for _, iface := range l.ifaces {
		nl, err := netlink.LinkByName(iface)
		if err != nil {
			if l.isAttached(iface) {
				l.setAttached(iface, false)
				l.log.Error("interface gone: UNPROTECTED until it comes back; then it is attached again", "iface", iface, "err", err)
			}
			continue
		}
		if nl.Attrs().Flags&net.FlagUp == 0 {
			continue
		}
		if a := l.attachment(iface); a == nil || a.Ifindex != nl.Attrs().Index || !l.isAttached(iface) {
			l.reattach(iface)
		}
	}
}

// reattach attaches to iface again (its interface was re-created): the
// program already loaded, with its pinned maps, so the rules keep their
// slots, buckets and counters and are in force from the first packet;
// failing that, a fresh attach adopting the pins, with the rules in
// force written before the program is attached. Then back.
func (l *links) reattach(iface string) {
	a := l.attachment(iface)
	err := errors.New("not attached")
	if a != nil {
		err = a.Reattach(l.opts.Mode)
	}
	if err != nil {
		if a != nil {
			_ = a.Close() // this process's handles; the pins stay
		}
		o := l.opts
		o.Fill = l.fill(iface)
		fresh, ferr := loader.Attach(iface, o)
		l.attachments(func(list *[]*loader.Attachment) {
			*list = removeAttachment(*list, a)
			if ferr == nil {
				*list = append(*list, fresh)
			}
		})
		if ferr != nil {
			l.setAttached(iface, false)
			if msg := ferr.Error(); msg != l.reattachErr[iface] {
				l.reattachErr[iface] = msg
				l.log.Error("cannot attach again: UNPROTECTED; retrying", "iface", iface, "err", ferr, "reattach_err", err)
			}
			return
		}
		a = fresh
	}
	delete(l.reattachErr, iface)
	l.setAttached(iface, true)
	id, _ := a.ProgramID()
	l.log.Warn("interface back: attached again, protected", "iface", iface, "ifindex", a.Ifindex, "mode", a.Mode, "program_id", id, "pins", a.Dir)
	l.back(iface)
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
