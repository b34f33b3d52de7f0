//go:build linux

package tests

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xlimit/xlimit/maps"
	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/userspace/dataplane"
)

// hostAddrsCapacity is what xl_host_addrs holds (bpf/types.h
// XL_HOST_ADDRS_MAX): the MAC of the attached interface, IPs and, when not
// all fit, one entry for the mark that the map is incomplete.
const hostAddrsCapacity = 65536

// addServerAddrs gives the server's namespace n more IPv4 /32 addresses
// (10.64.0.0 upwards, outside the lab's 198.18/15): the first onVeth on
// the server's veth, the rest spread over pairs of veths made inside the
// namespace, 2000 an interface (the kernel's address lists are linear: one
// interface with 70 000 takes minutes to fill, 35 with 2000 seconds). The
// namespace, and with it every interface and address, goes with the lab.
func (e *env) addServerAddrs(n, onVeth int) {
	e.t.Helper()
	const perIf = 2000
	var b strings.Builder
	ip := func(i int) string { return fmt.Sprintf("10.%d.%d.%d", 64+i>>16, i>>8&0xff, i&0xff) }
	i := 0
	for ; i < onVeth && i < n; i++ {
		fmt.Fprintf(&b, "addr add %s/32 dev %s\n", ip(i), e.lab.ServerIf)
	}
	for pair := 0; i < n; pair++ {
		a, z := fmt.Sprintf("xlha%d", pair), fmt.Sprintf("xlhz%d", pair)
		fmt.Fprintf(&b, "link add %s type veth peer name %s\nlink set %s up\nlink set %s up\n", a, z, a, z)
		for _, dev := range []string{a, z} {
			for j := 0; j < perIf && i < n; j, i = j+1, i+1 {
				fmt.Fprintf(&b, "addr add %s/32 dev %s\n", ip(i), dev)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := e.lab.Server.Command(ctx, "ip", "-batch", "-")
	cmd.Stdin = strings.NewReader(b.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		e.t.Fatalf("add %d addresses: %v: %s", n, err, out)
	}
	e.t.Logf("added %d addresses to the server's namespace in %v", n, time.Since(start).Round(time.Millisecond))
}

// serverHostAddrs counts the distinct addresses loader.HostAddrs reads in
// the server's namespace (loopback, multicast and unspecified left out),
// plus the attached interface's MAC: what xl_host_addrs would hold with
// room for all.
func (e *env) serverHostAddrs() int {
	e.t.Helper()
	seen := map[dataplane.HostKey]bool{}
	err := e.lab.Server.Do(func() error {
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || ip.Unmap().IsLoopback() || ip.IsMulticast() || ip.IsUnspecified() {
				continue
			}
			seen[dataplane.IPKey(ip)] = true
		}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return len(seen) + 1
}

// TestManyHostAddresses: a host with more addresses than xlimit used to
// list (4096: a Kubernetes node, a load balancer with many VIPs) and one
// with more than xl_host_addrs holds (65536). The daemon starts, keeps
// running and enforces: a UDP flood at a 1000/s port gets 0.98-1.02 of
// the rate through. In the overflow case it lists what fits and says how
// many it left out (xlimit_host_addrs_unlisted).
func TestManyHostAddresses(t *testing.T) {
	for _, tc := range []struct {
		name        string
		n, onVeth   int
		wantOverrun bool
	}{
		{"10000-on-the-interface", 10000, 10000, false},
		{"70000-beyond-the-map", 70000, 10000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			udp, _ := e.services(false)
			e.addServerAddrs(tc.n, tc.onVeth)
			total := e.serverHostAddrs()
			const metricsAddr = "127.0.0.1:19626"
			d := e.startDaemon(e.writeRules("rules.yaml", limitRules()), "--metrics-addr", metricsAddr)

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const offered, dur = 50000.0, 6 * time.Second
			wait := e.flood(ctx, false, offered, dur)
			sent := wait()
			udp.Settle(200*time.Millisecond, 2*time.Second)
			got := admittedRate(udp.Count(), limitPPS, sent.Elapsed)
			st := e.status()
			_, drop, _, _ := st.rule("udp-flood")

			metrics := scrapeMetricsAt(t, e.lab.Server, metricsAddr)
			unlisted := -1
			if m := regexp.MustCompile(`(?m)^xlimit_host_addrs_unlisted\{iface="` + e.lab.ServerIf + `"\} (\d+)$`).FindStringSubmatch(metrics); m != nil {
				unlisted, _ = strconv.Atoi(m[1])
			}
			wantUnlisted := 0
			if total > hostAddrsCapacity-1 { // one entry is the daemon's lease
				wantUnlisted = total - (hostAddrsCapacity - 2) // and one the mark
			}
			t.Logf("e2e %s: %d host addresses (MAC included), capacity %d; offered %.0f pkt/s (sent %d in %v); the socket received %d = burst %d + %.1f pkt/s (limit %d, ratio %.3f); kernel drop %d; xlimit_host_addrs_unlisted %d (want %d)",
				tc.name, total, hostAddrsCapacity, sent.PPS(), sent.Sent, sent.Elapsed.Round(time.Millisecond), udp.Count(), limitPPS, got, limitPPS, got/limitPPS, drop, unlisted, wantUnlisted)
			select {
			case <-d.exited:
				t.Fatalf("the daemon exited (%v)", d.exitErr)
			default:
			}
			if sent.PPS() < 5*limitPPS {
				t.Fatalf("the flood reached only %.0f pkt/s: not a flood", sent.PPS())
			}
			if r := got / limitPPS; r < 0.98 || r > 1.02 {
				t.Errorf("admitted %.1f pkt/s beyond the burst: %.3f of the %d/s limit, want 0.98-1.02", got, r, limitPPS)
			}
			if (total > hostAddrsCapacity-1) != tc.wantOverrun {
				t.Fatalf("the namespace has %d host addresses: overrun %v, want %v", total, total > hostAddrsCapacity-1, tc.wantOverrun)
			}
			if unlisted != wantUnlisted {
				t.Errorf("xlimit_host_addrs_unlisted = %d, want %d (%d addresses, %d entries)", unlisted, wantUnlisted, total, hostAddrsCapacity)
			}
			// What the kernel holds: the attached interface's MAC and all of
			// its addresses (the 10 000 added and the lab's), and the mark
			// exactly when not all fit.
			tab, err := maps.OpenPinned(filepath.Join(e.bpffs, "xlimit", e.lab.ServerIf), true)
			if err != nil {
				t.Fatal(err)
			}
			defer tab.Close()
			host, err := tab.HostAddrs()
			if err != nil {
				t.Fatal(err)
			}
			missing := 0
			for _, k := range []dataplane.HostKey{dataplane.MACKey(e.lab.ServerMAC), dataplane.IPKey(e.lab.ServerIP4), dataplane.IPKey(e.lab.ServerIP6)} {
				if !host.Has(k) {
					missing++
				}
			}
			for i := range tc.onVeth {
				if !host.Has(dataplane.IPKey(netip.AddrFrom4([4]byte{10, byte(64 + i>>16), byte(i >> 8), byte(i)}))) {
					missing++
				}
			}
			wantLen := min(total+1, hostAddrsCapacity) // the addresses and the lease
			t.Logf("xl_host_addrs: %d entries (want %d), incomplete mark %v; of the attached interface's MAC and addresses %d missing", len(host), wantLen, host.Incomplete(), missing)
			if missing > 0 || len(host) != wantLen || host.Incomplete() != tc.wantOverrun || !host.Has(dataplane.LeaseKey) {
				t.Errorf("xl_host_addrs holds %d entries (want %d), incomplete %v (want %v), %d of the attached interface's addresses missing (want 0)", len(host), wantLen, host.Incomplete(), tc.wantOverrun, missing)
			}
			wantListed := wantLen - 1 // the lease
			if tc.wantOverrun {
				wantListed-- // the mark
			}
			if h := st.Interfaces[0].HostAddrs; h == nil || h.Listed != wantListed || h.Incomplete != tc.wantOverrun {
				t.Errorf("xlimit status host_addrs %+v, want %d listed, incomplete %v", h, wantListed, tc.wantOverrun)
			}
			if tc.wantOverrun && strings.Count(d.Log(), "host addresses unlisted") != 1 {
				t.Errorf("want one warning of the unlisted host addresses in the log, got %d", strings.Count(d.Log(), "host addresses unlisted"))
			}
		})
	}
}

// TestHostAddrAddedWhileDaemonStopped (issue 41 M1): the daemon is
// killed (SIGKILL: no exit hook), then the server takes a new address (a
// VIP failing over). The program keeps enforcing a `syn_cookies: always`
// rule, but no daemon writes the address into xl_host_addrs: once the
// daemon's lease on the map has run out, the SYNs that the map cannot
// vouch for go to the rule's bucket and the kernel answers them, so
// connections to the new address succeed (before: every SYN to it was
// dropped as dst_ip, 0 of 10), and those to the old address still do.
func TestHostAddrAddedWhileDaemonStopped(t *testing.T) {
	e := newEnv(t)
	e.clientXDPPass(t)
	const port = 18443
	rules := fmt.Sprintf(`rules:
  - name: svc
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: 1000
    burst: 100
    syn_cookies: always
`, port)
	plainEcho(t, e.lab.Server, netip.AddrPortFrom(e.lab.ServerIP4, port))
	d := e.startDaemon(e.writeRules("rules.yaml", rules))
	probe := func(what string, addr netip.Addr) lab.ProbeResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		r, err := lab.TCPProbe(ctx, e.lab.Client, netip.AddrPortFrom(addr, port), 10, 100*time.Millisecond, 3*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("e2e %s: %d of %d connections to %s succeeded (p99 %v); errors %v", what, r.Successes, r.Attempts, addr,
			r.LatencyPercentile(0.99).Round(time.Microsecond), r.Errors)
		return r
	}
	if r := probe("daemon running, the old address", e.lab.ServerIP4); r.Successes != 10 {
		t.Fatalf("with the daemon running, %d of 10 connections succeeded", r.Successes)
	}

	if err := d.signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	added := e.lab.Subnet4.Addr().Next().Next().Next().Next().Next().Next().Next().Next().Next().Next() // .10
	if out, err := e.lab.Server.Command(context.Background(), "ip", "addr", "add", added.String()+"/32", "dev", e.lab.ServerIf).CombinedOutput(); err != nil {
		t.Fatalf("add %s: %v: %s", added, err, out)
	}
	plainEcho(t, e.lab.Server, netip.AddrPortFrom(added, port))
	// The killed daemon's last lease runs out at most
	// dataplane.HostLeaseSeconds (5) after its last renewal.
	time.Sleep(6 * time.Second)
	toNew := probe("daemon killed, the address added since", added)
	toOld := probe("daemon killed, the old address", e.lab.ServerIP4)
	if toNew.Successes != 10 {
		t.Errorf("daemon killed: %d of 10 connections to the address added since succeeded, want 10", toNew.Successes)
	}
	if toOld.Successes != 10 {
		t.Errorf("daemon killed: %d of 10 connections to the old address succeeded, want 10", toOld.Successes)
	}
}

// plainEcho serves one echoed line per connection (what lab.TCPProbe
// checks) on addr in ns, over a plain TCP listener: Go's default is MPTCP
// where the kernel has it, and bpf_sk_assign_tcp_reqsk refuses MPTCP
// listeners (docs/dataplane.md, "SYN cookies"). Closed when the test ends.
func plainEcho(t *testing.T, ns *lab.NS, addr netip.AddrPort) {
	t.Helper()
	var l net.Listener
	if err := ns.Do(func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		var err error
		l, err = lc.Listen(context.Background(), "tcp", addr.String())
		return err
	}); err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				line, err := bufio.NewReader(c).ReadSlice('\n')
				if err == nil {
					_, _ = c.Write(line)
				}
			}()
		}
	}()
}
