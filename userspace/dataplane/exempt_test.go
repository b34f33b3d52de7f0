package dataplane

import "testing"

// TestExemptPorts: management ports match no rule, port rules or rules
// without ports; every other port still does, and rules without ports
// keep non-first fragments.
func TestExemptPorts(t *testing.T) {
	p, err := Compile(&Spec{ExemptTCP: []PortRange{Port(22)}, Rules: []RuleSpec{
		{Name: "all-tcp", Protocol: "tcp", Rate: 10, Burst: 10},
		{Name: "ssh", Protocol: "tcp", Ports: []PortRange{{20, 23}}, Rate: 10, Burst: 10},
		{Name: "udp", Protocol: "udp", Rate: 10, Burst: 10},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	all, ssh, udp := uint64(1)<<p.Slot("all-tcp"), uint64(1)<<p.Slot("ssh"), uint64(1)<<p.Slot("udp")
	if m := p.Ports[PortKey(ProtoTCP, 22)]; m != 0 {
		t.Errorf("tcp/22: mask %b, want none", m)
	}
	if m := p.Ports[PortKey(ProtoTCP, 21)]; m != all|ssh {
		t.Errorf("tcp/21: mask %b, want %b", m, all|ssh)
	}
	if m := p.Ports[PortKey(ProtoTCP, 443)]; m != all {
		t.Errorf("tcp/443: mask %b, want %b", m, all)
	}
	g := p.Globals
	if g.Portless[ProtoTCP] != 0 || g.FragMatch[ProtoTCP]&all == 0 || g.Portless[ProtoUDP] != udp {
		t.Errorf("portless %b frag %b", g.Portless, g.FragMatch)
	}
}
