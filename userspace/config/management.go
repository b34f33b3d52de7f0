package config

import (
	"net/netip"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// managementKeys are the keys of the management section.
var managementKeys = []string{"tcp_ports", "udp_ports", "sources"}

// Management is what no rule may throttle, so that the host's operator
// keeps a way in whatever the rules say (docs/operations.md):
//
//   - TCPPorts, UDPPorts: packets to these ports of the host match no
//     rule (port rules do not cover them, and rules without ports cover
//     every other port). allow, deny and the malformed verdict still
//     apply, and so do fragments' policies to non-first fragments (they
//     carry no port).
//   - Sources: every packet from them passes, as allow (deny and every
//     rule included).
//
// The management section of the local rules file (--config) stays in
// force whatever document runs: the daemon adds it, and the file's allow
// list, to every document from the API or the rules source.
type Management struct {
	TCPPorts, UDPPorts []dataplane.PortRange
	Sources            []netip.Prefix
}

// management decodes the management section, nil when absent.
func (p *parser) management(m *mapping) *Management {
	s := p.section(m, "management", managementKeys)
	if s == nil {
		return nil
	}
	g := &Management{}
	for _, key := range []string{"tcp_ports", "udp_ports"} {
		items, at, _ := p.list(s, key)
		for i, item := range items {
			if pr, ok := p.port(item, index(at.path, i)); ok {
				if key == "tcp_ports" {
					g.TCPPorts = append(g.TCPPorts, pr)
				} else {
					g.UDPPorts = append(g.UDPPorts, pr)
				}
			}
		}
	}
	g.Sources, _, _, _ = p.prefixes(s, "sources")
	if len(g.TCPPorts)+len(g.UDPPorts)+len(g.Sources) == 0 {
		p.warnf(m.keyAt("management"), "empty: no port and no source is kept from the rules")
	}
	return g
}

// checkManaged warns, once the rules are decoded, about a rule whose ports
// are all management ports of its protocol: it limits nothing.
func (p *parser) checkManaged(m *mapping, c *Config) {
	g := c.Management
	if g == nil {
		return
	}
	covered := func(exempt []dataplane.PortRange, r dataplane.PortRange) bool {
		for port := int(r.Lo); port <= int(r.Hi); port++ {
			in := false
			for _, e := range exempt {
				if e.Contains(uint16(port)) {
					in = true
					break
				}
			}
			if !in {
				return false
			}
		}
		return true
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		if len(r.Ports) == 0 {
			continue
		}
		all := true
		for _, pr := range r.Ports {
			tcp := (r.Protocol == ProtoTCP || r.Protocol == ProtoAny) && !covered(g.TCPPorts, pr)
			udp := (r.Protocol == ProtoUDP || r.Protocol == ProtoAny) && !covered(g.UDPPorts, pr)
			if tcp || udp {
				all = false
				break
			}
		}
		if all {
			p.warnf(m.keyAt("management"), "rule %s limits nothing: its ports are all management ports", quote(r.Name))
		}
	}
}
