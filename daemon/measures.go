package daemon

import (
	"errors"
	"fmt"
	"strings"

	"github.com/xlimit/xlimit/loader"
	"github.com/xlimit/xlimit/userspace/dataplane"
	xsignal "github.com/xlimit/xlimit/userspace/signal"
)

// kernelMeasures reads the kernel's per-rule measures of the protected
// services for the signal readers (signal.HandshakeCounter and
// signal.ResponseTimes): the handshakes the sock_ops program counted and
// the response times the XDP and TC egress programs took (bpf/resptime.h).
// It is used from the loop's goroutine only.
type kernelMeasures struct {
	// attached runs f with the attachments and the plans in force, under
	// the lock that guards them (the daemon's mu).
	attached func(f func(attach []*loader.Attachment, plans map[string]*dataplane.Plan))
	prev     map[string]respReading // per rule, the histogram last read
}

type respReading struct {
	hist  dataplane.RespHist
	slots string // the slots it was read from, per interface
}

// Handshakes returns the handshakes completed for the rule's ports. Every
// interface's sock_ops program sees every connection of the namespace, so
// they count the same connections: the largest count is taken.
func (k *kernelMeasures) Handshakes(rule *xsignal.Rule) (uint64, bool) {
	var best uint64
	ok := false
	k.each(rule, func(t measureTables, slot int) {
		if n, err := t.Handshakes(slot); err == nil {
			best, ok = max(best, n), true
		}
	})
	return best, ok
}

// InFlight returns the rule's connections in flight as the sock_ops
// program counts them (for its in-flight cap). As for the handshakes,
// every interface's program sees every connection of the namespace, and
// each counts a connection toward its own plan's slot: the largest count
// of a slot whose count belongs to the rule in force (its epoch) is taken.
func (k *kernelMeasures) InFlight(rule *xsignal.Rule) (int64, bool) {
	var best int64
	ok := false
	k.eachRule(rule, func(t measureTables, slot int, epoch uint32) {
		if c, err := t.Conns(slot); err == nil && c.Epoch == epoch {
			best, ok = max(best, c.Count), true
		}
	})
	return best, ok
}

// ResponseTime returns the rule's responses so far, summed over the
// interfaces (each sees its own flows), and the response time of those
// since the previous call (xsignal.TickResponseTime: the lower quartile).
func (k *kernelMeasures) ResponseTime(rule *xsignal.Rule) (xsignal.ResponseReading, bool) {
	var sum dataplane.RespHist
	var slots strings.Builder
	n := 0
	k.each(rule, func(t measureTables, slot int) {
		if h, err := t.ResponseTimes(slot); err == nil {
			sum.Add(&h)
			fmt.Fprintf(&slots, "%d,", slot)
			n++
		}
	})
	if n == 0 {
		return xsignal.ResponseReading{}, false
	}
	if k.prev == nil {
		k.prev = map[string]respReading{}
	}
	prev, seen := k.prev[rule.Name]
	cur := respReading{hist: sum, slots: slots.String()}
	k.prev[rule.Name] = cur
	r := xsignal.ResponseReading{Responses: sum.Count}
	if seen && prev.slots == cur.slots {
		if d, ok := sum.Sub(prev.hist); ok {
			r.Latency = xsignal.TickResponseTime(&d) // robust to stalling clients
		}
	}
	return r, true
}

// RequestsInFlight returns the requests in flight of a rule marked as
// counting them (signal.Rule.Requests), summed over the interfaces: each
// counts the requests of its own flows (bpf/request.h). ok is false for
// other rules, or where no interface's maps count requests (pins of an
// xlimit before them): the sampler then reads connections.
func (k *kernelMeasures) RequestsInFlight(rule *xsignal.Rule) (int64, bool) {
	if !rule.Requests {
		return 0, false
	}
	var sum int64
	ok := false
	k.each(rule, func(t measureTables, slot int) {
		if r, err := t.Requests(slot); err == nil {
			sum, ok = sum+max(r.InFlight, 0), true
		}
	})
	return sum, ok
}

// measureTables is what kernelMeasures reads of an interface's maps.
type measureTables interface {
	Requests(slot int) (dataplane.Requests, error)
	Handshakes(slot int) (uint64, error)
	ResponseTimes(slot int) (dataplane.RespHist, error)
	Conns(slot int) (dataplane.Conns, error)
}

// each calls f with the tables and the rule's slot of every interface
// whose plan in force has the rule.
func (k *kernelMeasures) each(rule *xsignal.Rule, f func(t measureTables, slot int)) {
	k.eachRule(rule, func(t measureTables, slot int, _ uint32) { f(t, slot) })
}

// eachRule is each with the epoch of the rule in the slot.
func (k *kernelMeasures) eachRule(rule *xsignal.Rule, f func(t measureTables, slot int, epoch uint32)) {
	k.attached(func(attach []*loader.Attachment, plans map[string]*dataplane.Plan) {
		for _, a := range attach {
			p := plans[a.Iface]
			if p == nil {
				continue
			}
			if slot := p.Slot(rule.Name); slot >= 0 {
				f(a.Tables(), slot, p.Rules[slot].Epoch)
			}
		}
	})
}

// checkKernel refuses plans that ask the kernel for what an interface's
// attachment cannot do: response_time where the response timer could not
// be attached (its error names the kernel feature it lacks).
func checkKernel(attach []*loader.Attachment, plans map[string]*dataplane.Plan) error {
	var errs []error
	for _, a := range attach {
		p := plans[a.Iface]
		if p == nil || p.Globals.RespTime == 0 || a.RespTimeErr == nil {
			continue
		}
		var names []string
		for i := range p.Rules {
			if p.Rules[i].Active() && p.Globals.RespTime>>i&1 != 0 {
				names = append(names, p.Rules[i].Name)
			}
		}
		errs = append(errs, fmt.Errorf("rules %s use signal response_time on %s: %w", strings.Join(names, ", "), a.Iface, a.RespTimeErr))
	}
	return errors.Join(errs...)
}
