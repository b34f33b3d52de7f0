package tests

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestFragmentBypassLive is issue 16's measured bypass, end to end: a byte
// rule of 200 kB/s on a UDP port, and a client sending 60 kB datagrams at
// 3 MB/s, which its kernel fragments on the veth (MTU 1500) into 41
// frames each. Before the fix only each datagram's first fragment (1.5 kB)
// met the rule and 2.98 MB/s reached the socket; now every fragment is
// charged to the rule of its first, so the socket gets at most the rule's
// rate and burst.
func TestFragmentBypassLive(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		t.Run(map[bool]string{false: "ipv4", true: "ipv6"}[ipv6], func(t *testing.T) {
			e := newEnv(t)
			udp, _ := e.services(ipv6)
			const rate, burst = 200e3, 65535
			e.startDaemon(e.writeRules("rules.yaml", fmt.Sprintf(`rules:
  - name: big-udp
    protocol: udp
    ports: [%d]
    unit: bytes
    rate: %d
    burst: %d
`, udpPort, int(rate), burst)))

			const size, perSecond, dur = 60000, 50, 4 * time.Second
			sent, elapsed := sendDatagrams(t, e, udp.Addr().Addr(), size, perSecond, dur)
			udp.Settle(300*time.Millisecond, 3*time.Second)
			offered := float64(sent*size) / elapsed.Seconds()
			// The counter reads into a small buffer: count datagrams, which
			// the socket gets whole (reassembled) or not at all.
			received := udp.Count() * size
			got := float64(received) / elapsed.Seconds()
			st := e.status()
			pass, drop, _, _ := st.rule("big-udp")
			t.Logf("e2e %s: offered %.2f MB/s (%d datagrams of %d B in %v); the socket received %d datagrams, %.1f kB/s (limit %.0f kB/s + %d B burst); kernel rule pass %d drop %d frames",
				map[bool]string{false: "ipv4", true: "ipv6"}[ipv6], offered/1e6, sent, size, elapsed.Round(time.Millisecond),
				udp.Count(), got/1e3, rate/1e3, burst, pass, drop)
			if offered < 10*rate {
				t.Fatalf("offered only %.0f B/s: not over the limit", offered)
			}
			// The rate and the burst, with 10 % for the clock of a busy host.
			if limit := (rate*elapsed.Seconds() + burst) * 1.1; float64(received) > limit {
				t.Errorf("the socket received %d bytes through a %.0f B/s rule in %v (at most %.0f): fragments bypass it",
					received, rate, elapsed.Round(time.Millisecond), limit)
			}
			if drop == 0 {
				t.Errorf("the rule dropped no fragment")
			}
		})
	}
}

// sendDatagrams sends datagrams of size bytes from the client to the UDP
// service at addr, perSecond a second for dur, and returns how many it
// sent and over how long.
func sendDatagrams(t *testing.T, e *env, addr netip.Addr, size, perSecond int, dur time.Duration) (int, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dur+10*time.Second)
	defer cancel()
	var sent int
	start := time.Now()
	err := e.lab.Client.Do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, udpPort)))
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, size)
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		for time.Since(start) < dur {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			if _, err := c.Write(buf); err != nil {
				return err
			}
			sent++
		}
		return nil
	})
	if err != nil {
		t.Fatalf("send datagrams: %v", err)
	}
	return sent, time.Since(start)
}

// TestFragmentWholeDatagrams is issue 26's fragment finding, end to end:
// the offer of TestFragmentBypassLive (60 kB datagrams at 3 MB/s into a
// byte rule of 200 kB/s) for 8 s. Charged fragment by fragment, the rule's
// frames were spread over every datagram and 1 of 200 arrived whole; now
// each datagram is decided whole at its first fragment, so at least 80 %
// of the datagrams the rate can carry (rate × time ÷ the datagram's frames
// on the wire) reach the socket, and what it receives stays within 1.05 ×
// the rate over the run.
func TestFragmentWholeDatagrams(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		fam := map[bool]string{false: "ipv4", true: "ipv6"}[ipv6]
		t.Run(fam, func(t *testing.T) {
			e := newEnv(t)
			udp, _ := e.services(ipv6)
			const rate, burst = 200e3, 65535
			e.startDaemon(e.writeRules("rules.yaml", fmt.Sprintf(`rules:
  - name: big-udp
    protocol: udp
    ports: [%d]
    unit: bytes
    rate: %d
    burst: %d
`, udpPort, int(rate), burst)))

			const size, perSecond, dur = 60000, 50, 8 * time.Second
			sent, elapsed := sendDatagrams(t, e, udp.Addr().Addr(), size, perSecond, dur)
			udp.Settle(300*time.Millisecond, 3*time.Second)
			// A datagram's frames on the veth (MTU 1500): 41 of 1480 bytes
			// of IPv4 payload, or 42 of 1448 after IPv6's fragment header,
			// each with its Ethernet and IP headers.
			wire := float64(size+8) + 41*(14+20)
			if ipv6 {
				wire = float64(size+8) + 42*(14+40+8)
			}
			carry := rate * elapsed.Seconds() / wire
			whole := udp.Count()
			got := float64(whole*size) / elapsed.Seconds()
			pass, drop, _, _ := e.status().rule("big-udp")
			t.Logf("e2e %s: offered %.2f MB/s (%d datagrams of %d B in %v); the socket received %d datagrams whole, %.1f kB/s; the rate carries %.1f (%.1f a second, %.0f B on the wire each); %.0f %% of them; kernel rule pass %d drop %d frames",
				fam, float64(sent*size)/elapsed.Seconds()/1e6, sent, size, elapsed.Round(time.Millisecond),
				whole, got/1e3, carry, carry/elapsed.Seconds(), wire, 100*float64(whole)/carry, pass, drop)
			if float64(sent*size)/elapsed.Seconds() < 10*rate {
				t.Fatalf("offered only %d datagrams: not over the limit", sent)
			}
			if float64(whole) < 0.8*carry {
				t.Errorf("%d datagrams arrived whole, want at least 80 %% of the %.1f the rate carries", whole, carry)
			}
			if got > 1.05*rate {
				t.Errorf("the socket received %.1f kB/s through a %.0f kB/s rule: over 1.05 ×", got/1e3, rate/1e3)
			}
		})
	}
}
