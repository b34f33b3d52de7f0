//go:build linux

package loader

import (
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// TestFillBeforeAttach: on a fresh attach the rules are written while the
// interface has no program yet, so the program enforces them from its
// first packet: there is no window with an empty program.
func TestFillBeforeAttach(t *testing.T) {
	l, bpffs := setup(t)
	plan, err := dataplane.Compile(&dataplane.Spec{
		Deny:  []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		Rules: []dataplane.RuleSpec{{Name: "udp", Protocol: "udp", Ports: []dataplane.PortRange{dataplane.Port(9000)}, Rate: 1000, Burst: 100}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var attachedWhenFilled, filled bool
	var a *Attachment
	err = l.Server.Do(func() error {
		var err error
		a, err = Attach(l.ServerIf, Options{BPFFS: bpffs, Mode: ModeGeneric, Fill: func(tb *maps.Tables) error {
			filled = true
			nl, err := netlink.LinkByName(l.ServerIf)
			if err != nil {
				return err
			}
			attachedWhenFilled = nl.Attrs().Xdp != nil && nl.Attrs().Xdp.Attached
			return tb.Apply(plan)
		}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if !filled || attachedWhenFilled {
		t.Fatalf("Fill ran: %v; the interface had a program then: %v (want run, and no program yet)", filled, attachedWhenFilled)
	}
	got, err := a.Tables().ReadPlan()
	if err != nil {
		t.Fatal(err)
	}
	if got.Slot("udp") < 0 {
		t.Errorf("after attach the maps hold no rule udp: %+v", got.Rules[0])
	}
	if st, _ := Inspect(bpffs, l.ServerIf); !st.Attached {
		t.Errorf("not attached after Attach: %+v", st)
	}
}
