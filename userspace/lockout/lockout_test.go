package lockout

import (
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

func TestWarnings(t *testing.T) {
	ls := []Listener{{Addr: netip.MustParseAddrPort("0.0.0.0:22"), Process: "sshd", PID: 7}, {Addr: netip.MustParseAddrPort("[::]:22"), Process: "sshd", PID: 7},
		{Addr: netip.MustParseAddrPort("0.0.0.0:80"), Process: "nginx", PID: 8}}
	compile := func(s *dataplane.Spec) *dataplane.Plan {
		p, err := dataplane.Compile(s, nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	web := dataplane.RuleSpec{Name: "web", Protocol: "tcp", Ports: []dataplane.PortRange{dataplane.Port(80)}, Rate: 10, Burst: 10}
	all := dataplane.RuleSpec{Name: "all-tcp", Protocol: "tcp", Rate: 10, Burst: 10}
	for _, c := range []struct {
		name string
		spec dataplane.Spec
		want []string
	}{
		{"a web rule", dataplane.Spec{Rules: []dataplane.RuleSpec{web}}, nil},
		{"every tcp port", dataplane.Spec{Rules: []dataplane.RuleSpec{web, all}}, []string{"rule(s) all-tcp limit new TCP connections to port 22, where sshd (pid 7) listens"}},
		{"every tcp port, 22 managed", dataplane.Spec{Rules: []dataplane.RuleSpec{all}, ExemptTCP: []dataplane.PortRange{dataplane.Port(22)}}, nil},
		{"deny everything", dataplane.Spec{Deny: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}, []string{"deny 0.0.0.0/0 drops every source"}},
	} {
		got := Warnings(compile(&c.spec), &c.spec, ls)
		if len(got) != len(c.want) {
			t.Errorf("%s: %q, want %d warning(s)", c.name, got, len(c.want))
			continue
		}
		for i := range got {
			if !strings.Contains(got[i], c.want[i]) {
				t.Errorf("%s: %q, want %q", c.name, got[i], c.want[i])
			}
		}
	}
}

// TestTCPListeners finds a listener this test opens, with its process.
func TestTCPListeners(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	want := netip.MustParseAddrPort(ln.Addr().String())
	ls, err := TCPListeners("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if l.Addr == want {
			if l.PID != os.Getpid() || l.Process == "" {
				t.Errorf("%v: pid %d process %q, want pid %d", want, l.PID, l.Process, os.Getpid())
			}
			return
		}
	}
	t.Errorf("listener %v not found among %d", want, len(ls))
}
