package config

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

func TestManagement(t *testing.T) {
	c, err := Parse("f", []byte("management:\n  tcp_ports: [22, \"9000-9001\"]\n  udp_ports: [53]\n  sources: [192.0.2.0/24]\nrules:\n  - name: ssh\n    protocol: tcp\n    ports: [22]\n    rate: 10\n"))
	if err != nil {
		t.Fatal(err)
	}
	g := c.Management
	if g == nil || len(g.TCPPorts) != 2 || g.TCPPorts[1] != (dataplane.PortRange{Lo: 9000, Hi: 9001}) || len(g.UDPPorts) != 1 || g.Sources[0] != netip.MustParsePrefix("192.0.2.0/24") {
		t.Fatalf("management %+v", g)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0].Error(), `f:1: management: rule "ssh" limits nothing: its ports are all management ports`) {
		t.Errorf("warnings %v", c.Warnings)
	}
	_, err = Parse("f", []byte("management:\n  tcp_ports: [0]\n  sources: [192.0.2.1/24]\n  ports: [22]\n"))
	for _, want := range []string{"f:2: management.tcp_ports[0]:", "f:3: management.sources[0]:", "f:4: management.ports: unknown key"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad management: %v, want %q", err, want)
		}
	}
}
