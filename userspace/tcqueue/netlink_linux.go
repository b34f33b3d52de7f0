//go:build linux

package tcqueue

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Manager creates, updates and removes kernel queues over netlink in one
// network namespace. It is safe for concurrent use.
type Manager struct {
	h    *netlink.Handle
	sock *nl.SocketHandle // for the messages the library cannot build (TBF mpu and burst, fifo limits)

	mu      sync.Mutex
	inForce map[string]map[string]inForce // iface → rule → what this manager last wrote or adopted
	writes  int                           // netlink changes made (tests check that a reconcile of what exists writes nothing)
}

func (m *Manager) wrote() {
	m.mu.Lock()
	m.writes++
	m.mu.Unlock()
}

type inForce struct {
	q     Queue
	shape Shape
	frame uint32
}

// Open returns a manager for the network namespace ns, or for the calling
// thread's namespace when ns is netns.None().
func Open(ns netns.NsHandle) (*Manager, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	return &Manager{h: h, sock: &nl.SocketHandle{Socket: s}, inForce: map[string]map[string]inForce{}}, nil
}

// Close releases the netlink sockets. The queues stay.
func (m *Manager) Close() error {
	m.h.Close()
	m.sock.Close()
	return nil
}

// Apply makes iface's queues what s says: an IFB with its TBF per queue,
// the ingress filters, and nothing of tcqueue's that s does not name. What
// already matches (after a daemon restart, say) is adopted untouched.
func (m *Manager) Apply(iface string, s Spec) error {
	link, err := m.h.LinkByName(iface)
	if err != nil {
		return fmt.Errorf("find interface %s: %w", iface, err)
	}
	frame := uint32(link.Attrs().MTU) + 18 // Ethernet header and one VLAN tag
	want, err := Filters(iface, s)
	if err != nil {
		return err
	}
	shapes := make([]Shape, len(s.Queues))
	for i, q := range s.Queues {
		if shapes[i], err = ShapeFor(q.Rate, q.Bytes, q.MaxQueue, frame); err != nil {
			return fmt.Errorf("rule %s: %w", q.Rule, err)
		}
	}
	// The IFBs first: a filter must never redirect to a missing device.
	ifbs := map[string]int{}
	now := map[string]inForce{}
	for i, q := range s.Queues {
		idx, err := m.ensureIFB(iface, q.Rule, link.Attrs().MTU)
		if err != nil {
			return err
		}
		if err := m.ensureShape(idx, shapes[i]); err != nil {
			return fmt.Errorf("rule %s: %w", q.Rule, err)
		}
		ifbs[IFBName(iface, q.Rule)] = idx
		now[q.Rule] = inForce{q: q, shape: shapes[i], frame: frame}
	}
	if len(want) > 0 {
		if err := m.ensureIngress(link.Attrs().Index); err != nil {
			return err
		}
	}
	deleted, err := m.syncFilters(link.Attrs().Index, want, ifbs)
	if err != nil {
		return err
	}
	removed, err := m.removeIFBs(iface, ifbs)
	if err != nil {
		return err
	}
	// The clsact qdisc goes with the last queue, if nobody else's filter
	// is on it; an interface where tcqueue had nothing is not touched.
	if len(want) == 0 && deleted+removed > 0 {
		if err := m.dropIngressIfEmpty(link.Attrs().Index); err != nil {
			return err
		}
	}
	m.mu.Lock()
	if len(now) == 0 {
		delete(m.inForce, iface)
	} else {
		m.inForce[iface] = now
	}
	m.mu.Unlock()
	return nil
}

// Remove takes every queue of tcqueue's off iface (xlimit detach).
//
// An interface that no longer exists took its filters with it; only its IFB
// devices (named after it) can remain, and they go.
func (m *Manager) Remove(iface string) error {
	_, err := m.h.LinkByName(iface)
	var gone netlink.LinkNotFoundError
	if !errors.As(err, &gone) {
		return m.Apply(iface, Spec{})
	}
	_, err = m.removeIFBs(iface, nil)
	m.mu.Lock()
	delete(m.inForce, iface)
	m.mu.Unlock()
	return err
}

// SetRate puts a new rate (from the control loop) in force for a queued
// rule, rewriting the TBF only when the rate changed by more than
// RateChanged's margin. It reports whether it wrote.
func (m *Manager) SetRate(iface, rule string, rate float64) (bool, error) {
	m.mu.Lock()
	cur, ok := m.inForce[iface][rule]
	m.mu.Unlock()
	if !ok || !RateChanged(cur.shape.Rate(), rate) {
		return false, nil
	}
	shape, err := ShapeFor(rate, cur.q.Bytes, cur.q.MaxQueue, cur.frame)
	if err != nil {
		return false, fmt.Errorf("rule %s: %w", rule, err)
	}
	link, err := m.h.LinkByName(IFBName(iface, rule))
	if err != nil {
		return false, fmt.Errorf("find the queue of rule %s: %w", rule, err)
	}
	if err := m.putTBF(link.Attrs().Index, shape); err != nil {
		return false, fmt.Errorf("rule %s: %w", rule, err)
	}
	cur.shape = shape
	m.mu.Lock()
	if _, ok := m.inForce[iface][rule]; ok {
		m.inForce[iface][rule] = cur
	}
	m.mu.Unlock()
	return true, nil
}

// Stat is a queue's state from its TBF's statistics.
type Stat struct {
	Iface, Rule      string
	Rate             float64 // rule's unit per second
	Backlog          uint32  // packets waiting
	BacklogBytes     uint32
	Sent             uint64 // packets sent on
	Drops            uint64 // packets dropped because the queue was full
	MaxQueuedPackets uint32 // packet rules: the queue's bound
}

// Stats reads every queue this manager keeps.
func (m *Manager) Stats() ([]Stat, error) {
	m.mu.Lock()
	type key struct{ iface, rule string }
	var keys []key
	rates := map[key]inForce{}
	for iface, rules := range m.inForce {
		for rule, f := range rules {
			keys = append(keys, key{iface, rule})
			rates[key{iface, rule}] = f
		}
	}
	m.mu.Unlock()
	var out []Stat
	var errs []error
	for _, k := range keys {
		f := rates[k]
		st := Stat{Iface: k.iface, Rule: k.rule, Rate: f.shape.Rate()}
		if f.shape.Packets {
			st.MaxQueuedPackets = f.shape.Limit
		}
		link, err := m.h.LinkByName(IFBName(k.iface, k.rule))
		if err != nil {
			errs = append(errs, fmt.Errorf("find the queue of rule %s: %w", k.rule, err))
			continue
		}
		qs, err := m.h.QdiscList(link)
		if err != nil {
			errs = append(errs, fmt.Errorf("list qdiscs of %s: %w", link.Attrs().Name, err))
			continue
		}
		for _, q := range qs {
			a := q.Attrs()
			if a.Parent != netlink.HANDLE_ROOT || a.Statistics == nil {
				continue
			}
			if b := a.Statistics.Basic; b != nil {
				st.Sent = uint64(b.Packets)
			}
			if s := a.Statistics.Queue; s != nil {
				st.Backlog, st.BacklogBytes, st.Drops = s.Qlen, s.Backlog, uint64(s.Drops)
			}
		}
		out = append(out, st)
	}
	return out, errors.Join(errs...)
}

// ensureIFB returns the ifindex of the rule's IFB, creating it (with the
// interface's MTU, up) when missing. A device of that name that tcqueue did
// not make is an error, never touched.
func (m *Manager) ensureIFB(iface, rule string, mtu int) (int, error) {
	name, alias := IFBName(iface, rule), Alias(iface, rule)
	l, err := m.h.LinkByName(name)
	if err == nil {
		if l.Type() != "ifb" || l.Attrs().Alias != alias {
			return 0, fmt.Errorf("rule %s: device %s exists and is not xlimit's queue (type %s, alias %q)", rule, name, l.Type(), l.Attrs().Alias)
		}
	} else {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return 0, fmt.Errorf("find device %s: %w", name, err)
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.MTU = name, mtu
		m.wrote()
		if err := m.h.LinkAdd(&netlink.Ifb{LinkAttrs: attrs}); err != nil {
			return 0, fmt.Errorf("create IFB %s: %w", name, err)
		}
		if l, err = m.h.LinkByName(name); err != nil {
			return 0, fmt.Errorf("find device %s: %w", name, err)
		}
		if err := m.h.LinkSetAlias(l, alias); err != nil {
			return 0, errors.Join(fmt.Errorf("name IFB %s: %w", name, err), m.h.LinkDel(l))
		}
	}
	if l.Attrs().MTU != mtu {
		m.wrote()
		if err := m.h.LinkSetMTU(l, mtu); err != nil {
			return 0, fmt.Errorf("set MTU of %s: %w", name, err)
		}
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		m.wrote()
		if err := m.h.LinkSetUp(l); err != nil {
			return 0, fmt.Errorf("set %s up: %w", name, err)
		}
	}
	return l.Attrs().Index, nil
}

// removeIFBs deletes tcqueue's IFBs of iface that keep is missing and
// returns how many it deleted.
func (m *Manager) removeIFBs(iface string, keep map[string]int) (int, error) {
	links, err := m.h.LinkList()
	if err != nil {
		return 0, fmt.Errorf("list devices: %w", err)
	}
	var errs []error
	n := 0
	for _, l := range links {
		a := l.Attrs()
		if l.Type() != "ifb" || !strings.HasPrefix(a.Name, IFBPrefix) || !strings.HasPrefix(a.Alias, AliasPrefix+iface+":") {
			continue
		}
		if _, ok := keep[a.Name]; ok {
			continue
		}
		m.wrote()
		if err := m.h.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete IFB %s: %w", a.Name, err))
		}
		n++
	}
	return n, errors.Join(errs...)
}

// qdiscState reads what an IFB holds.
func (m *Manager) qdiscState(ifindex int) (QdiscState, error) {
	var st QdiscState
	qs, err := m.h.QdiscList(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Index: ifindex}})
	if err != nil {
		return st, fmt.Errorf("list qdiscs: %w", err)
	}
	for _, q := range qs {
		a := q.Attrs()
		switch {
		case a.Parent == netlink.HANDLE_ROOT && a.Handle == RootHandle:
			if t, ok := q.(*netlink.Tbf); ok {
				st.RootTBF, st.RateBytes, st.Limit = true, t.Rate, t.Limit
			}
		case a.Parent == RootHandle|1:
			// Only tcqueue's own fifo counts (the TBF's default bfifo is
			// not even listed).
			if a.Handle == ChildHandle {
				st.ChildKind = q.Type()
			}
		}
	}
	return st, nil
}

func (m *Manager) ensureShape(ifindex int, s Shape) error {
	have, err := m.qdiscState(ifindex)
	if err != nil {
		return err
	}
	if !NeedsShape(have, s) {
		return nil
	}
	if err := m.putTBF(ifindex, s); err != nil {
		return err
	}
	switch {
	case s.Packets && have.ChildKind != "pfifo":
		return m.putFifo(ifindex, "pfifo", s.Limit)
	case !s.Packets && have.ChildKind != "bfifo":
		return m.putFifo(ifindex, "bfifo", s.Limit)
	}
	return nil
}

func (m *Manager) request(msgType, flags int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(msgType, flags|unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: m.sock}
	return req
}

// putTBF creates or changes the IFB's root TBF. netlink.Tbf cannot carry
// the rate's mpu nor TCA_TBF_BURST, so the message is built here. A change
// keeps the queued packets; the kernel applies the limit to the child
// fifo (fifo_set_limit) and refills the bucket.
func (m *Manager) putTBF(ifindex int, s Shape) error {
	req := m.request(unix.RTM_NEWQDISC, unix.NLM_F_CREATE|unix.NLM_F_REPLACE)
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(ifindex), Handle: RootHandle, Parent: netlink.HANDLE_ROOT})
	req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated("tbf")))
	opts := nl.NewRtAttr(nl.TCA_OPTIONS, nil)
	var q nl.TcTbfQopt
	q.Rate.Rate = uint32(min(s.RateBytes, math.MaxUint32))
	q.Rate.Mpu = s.MPU
	q.Rate.Linklayer = 1 // TC_LINKLAYER_ETHERNET
	q.Limit = s.Limit
	opts.AddRtAttr(nl.TCA_TBF_PARMS, q.Serialize())
	if s.RateBytes >= 1<<32 {
		opts.AddRtAttr(nl.TCA_TBF_RATE64, nl.Uint64Attr(s.RateBytes))
	}
	opts.AddRtAttr(nl.TCA_TBF_BURST, nl.Uint32Attr(s.Burst))
	req.AddData(opts)
	m.wrote()
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("put tbf (rate %d B/s, mpu %d, limit %d): %w", s.RateBytes, s.MPU, s.Limit, err)
	}
	return nil
}

// putFifo grafts a pfifo (limit in packets) or bfifo (bytes) under the TBF.
func (m *Manager) putFifo(ifindex int, kind string, limit uint32) error {
	req := m.request(unix.RTM_NEWQDISC, unix.NLM_F_CREATE|unix.NLM_F_REPLACE)
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(ifindex), Handle: ChildHandle, Parent: RootHandle | 1})
	req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated(kind)))
	req.AddData(nl.NewRtAttr(nl.TCA_OPTIONS, nl.Uint32Attr(limit))) // struct tc_fifo_qopt
	m.wrote()
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("put %s (limit %d): %w", kind, limit, err)
	}
	return nil
}

// ensureIngress adds a clsact qdisc unless the interface has clsact or
// ingress already (either takes ingress filters at ffff:fff2).
func (m *Manager) ensureIngress(ifindex int) error {
	has, err := m.ingressQdisc(ifindex)
	if err != nil || has != nil {
		return err
	}
	q := &netlink.Clsact{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	m.wrote()
	if err := m.h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	return nil
}

func (m *Manager) ingressQdisc(ifindex int) (netlink.Qdisc, error) {
	qs, err := m.h.QdiscList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: ifindex}})
	if err != nil {
		return nil, fmt.Errorf("list qdiscs: %w", err)
	}
	for _, q := range qs {
		if t := q.Type(); t == "clsact" || t == "ingress" {
			return q, nil
		}
	}
	return nil, nil
}

// dropIngressIfEmpty deletes the clsact or ingress qdisc when no filter of
// anybody's is left on it: tcqueue added it, or nobody uses it.
func (m *Manager) dropIngressIfEmpty(ifindex int) error {
	q, err := m.ingressQdisc(ifindex)
	if err != nil || q == nil {
		return err
	}
	link := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		if q.Type() == "ingress" && parent == netlink.HANDLE_MIN_EGRESS {
			continue
		}
		fs, err := m.h.FilterList(link, parent)
		if err != nil {
			return fmt.Errorf("list filters: %w", err)
		}
		if len(fs) > 0 {
			return nil
		}
	}
	m.wrote()
	if err := m.h.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("delete %s qdisc: %w", q.Type(), err)
	}
	return nil
}

// syncFilters makes the filters in tcqueue's prefs the wanted ones and
// returns how many prefs it deleted.
func (m *Manager) syncFilters(ifindex int, want []Filter, ifbs map[string]int) (int, error) {
	link := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}
	have := map[uint16]string{}
	handles := map[uint16]uint32{}
	if q, err := m.ingressQdisc(ifindex); err != nil {
		return 0, err
	} else if q != nil {
		fs, err := m.h.FilterList(link, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			return 0, fmt.Errorf("list ingress filters: %w", err)
		}
		names := map[int]string{}
		for name, idx := range ifbs {
			names[idx] = name
		}
		for _, f := range fs {
			a := f.Attrs()
			if a.Priority < FirstPref || a.Priority >= FirstPref+MaxFilters {
				continue
			}
			if _, dup := have[a.Priority]; dup {
				have[a.Priority] = "several filters"
				continue
			}
			have[a.Priority] = sigOf(f, names)
			handles[a.Priority] = a.Handle
		}
	}
	plan := PlanFilters(have, want)
	var errs []error
	for _, pref := range plan.Delete {
		if err := m.delPref(ifindex, pref); err != nil {
			errs = append(errs, err)
		}
	}
	for _, f := range plan.Put {
		nf, err := encode(ifindex, f, ifbs)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.wrote()
		if _, seen := have[f.Pref]; seen {
			// Replace in place when the pref holds one u32 filter of the
			// same protocol; otherwise start afresh.
			nf.Handle = handles[f.Pref]
			if err = m.h.FilterReplace(nf); err != nil {
				if err = m.delPref(ifindex, f.Pref); err == nil {
					nf.Handle = 0
					err = m.h.FilterAdd(nf)
				}
			}
		} else {
			err = m.h.FilterAdd(nf) // the kernel numbers the node 8xx::800
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("put filter pref %d: %w", f.Pref, err))
		}
	}
	return len(plan.Delete), errors.Join(errs...)
}

// u32Node is the node part of the handle the kernel gives the first node
// of a u32 filter (its root hash table, "8xx:", varies per pref).
const u32Node = 0x800

// delPref deletes every filter at a pref (the whole tcf_proto).
func (m *Manager) delPref(ifindex int, pref uint16) error {
	m.wrote()
	req := m.request(unix.RTM_DELTFILTER, 0)
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(ifindex), Parent: netlink.HANDLE_MIN_INGRESS,
		Info: netlink.MakeHandle(pref, 0)})
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete filter pref %d: %w", pref, err)
	}
	return nil
}

// sigOf is the signature of a filter found in tcqueue's prefs; one that
// tcqueue would not have made gets a signature no wanted filter has.
func sigOf(f netlink.Filter, ifbNames map[int]string) string {
	u, ok := f.(*netlink.U32)
	if !ok || u.Sel == nil || u.Handle&0xfffff != u32Node || u.Link != 0 || u.ClassId != 0 || u.Sel.Flags != nl.TC_U32_TERMINAL {
		return "foreign"
	}
	keys := make([]Key, 0, len(u.Sel.Keys))
	for _, k := range u.Sel.Keys {
		if k.OffMask != 0 {
			return "foreign"
		}
		keys = append(keys, Key{Off: k.Off, Val: k.Val, Mask: k.Mask})
	}
	target := ""
	switch len(u.Actions) {
	case 0:
	case 1:
		a, ok := u.Actions[0].(*netlink.MirredAction)
		name, known := ifbNames[a.Ifindex]
		if !ok || !known || a.MirredAction != netlink.TCA_EGRESS_REDIR || a.Attrs().Action != netlink.TC_ACT_STOLEN {
			return "foreign"
		}
		target = name
	default:
		return "foreign"
	}
	return Sig(u.Protocol, keys, target)
}

// encode builds the u32 filter of f: one terminal node whose tc protocol
// is the family, with a mirred redirect to the IFB, or no action (u32 then
// returns TC_ACT_OK: the packet goes on unqueued and no later filter runs).
func encode(ifindex int, f Filter, ifbs map[string]int) (*netlink.U32, error) {
	sel := &netlink.TcU32Sel{Flags: nl.TC_U32_TERMINAL}
	keys := f.Keys()
	// Exact capacity: the library sends cap(Keys) keys.
	sel.Keys = make([]netlink.TcU32Key, 0, len(keys))
	for _, k := range keys {
		sel.Keys = append(sel.Keys, netlink.TcU32Key{Off: k.Off, Val: k.Val, Mask: k.Mask})
	}
	u := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_INGRESS,
			Priority: f.Pref, Protocol: f.EthType},
		Sel: sel,
	}
	if f.Target == "" {
		return u, nil
	}
	idx, ok := ifbs[f.Target]
	if !ok {
		return nil, fmt.Errorf("filter pref %d: no device %s", f.Pref, f.Target)
	}
	u.Actions = []netlink.Action{netlink.NewMirredAction(idx)}
	return u, nil
}
