//go:build linux

package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
)

// upgradeRules is the rules file of the upgrade steps: one rule that every
// earlier version takes.
const upgradeRules = `interfaces: [xlg0]
rules:
  - name: flood
    protocol: udp
    ports: [9000]
    rate: 1000
    burst: 100
`

// statusOf reads `xlimit status --json` of the installed binary: the
// link's id and the flood rule's pass and drop counters.
func statusOf(t *testing.T) (link uint32, pass, drop uint64) {
	t.Helper()
	var rep struct {
		Interfaces []struct {
			LinkID uint32 `json:"link_id"`
			Rules  []struct {
				Name     string `json:"name"`
				Counters struct {
					Packets map[string]uint64 `json:"packets"`
				} `json:"counters"`
			} `json:"rules"`
		} `json:"interfaces"`
	}
	out := run(t, "xlimit", "status", "--json", "--iface", guestIf)
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Interfaces) != 1 {
		t.Fatalf("status: %v: %s", err, out)
	}
	for _, r := range rep.Interfaces[0].Rules {
		if r.Name == "flood" {
			return rep.Interfaces[0].LinkID, r.Counters.Packets["pass"], r.Counters.Packets["drop"]
		}
	}
	t.Fatalf("status has no rule flood: %s", out)
	return 0, 0, 0
}

// stepUpgrade installs an earlier version's package, starts it on the
// flood rule, floods at 20 times the limit, and installs deb over it (the
// postinst restarts the running daemon): the limit holds throughout (the
// rate over the whole span from a second before the upgrade, and every
// second, sampled every 100 ms, at most 1.05 x the limit unless the three
// seconds before stayed within the limit: tokens banked while the flood
// generator stalled), the link is the same, the counters carry on. Then
// the package is purged, so that the steps after start from a first
// install.
func stepUpgrade(t *testing.T, old, deb string) {
	t.Logf("dpkg -i %s:\n%s", old, run(t, "dpkg", "-i", old))
	if err := os.WriteFile("/etc/xlimit/rules.yaml", []byte(upgradeRules), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "systemctl", "enable", "--now", unit)
	from := strings.TrimSpace(run(t, "xlimit", "version"))

	guest := &lab.NS{Name: "guest", Path: "/proc/1/ns/net"}
	c, err := lab.ListenUDPCounter(guest, netip.AddrPortFrom(guestIP, floodPort))
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer c.Close()
	const d = 14 * time.Second
	done := make(chan lab.FloodResult, 1)
	start := time.Now()
	go func() {
		res, err := lab.Flood(context.Background(), lab.FloodSpec{
			NS: &lab.NS{Name: floodNS, Path: "/run/netns/" + floodNS}, Ifname: floodIf,
			SrcMAC: mac(t, floodNS, floodIf), DstMAC: mac(t, "", guestIf), Src: floodIP, Dst: guestIP,
			DstPort: floodPort, PayloadLen: 64, Rate: 20 * rateLimit, Duration: d,
		})
		if err != nil {
			t.Errorf("flood: %v", err)
		}
		done <- res
	}()
	time.Sleep(4 * time.Second)
	link0, p0, d0 := statusOf(t)
	upgrade := time.Now()
	out := run(t, "dpkg", "-i", deb)
	took := time.Since(upgrade)
	res := <-done
	c.Settle(200*time.Millisecond, 2*time.Second)
	link1, p1, d1 := statusOf(t)
	to := strings.TrimSpace(run(t, "xlimit", "version"))

	end := start.Add(d - 200*time.Millisecond)
	var worst float64
	var excused []string
	for at := start.Add(2500 * time.Millisecond); at.Before(end); at = at.Add(100 * time.Millisecond) {
		n := float64(c.CountBetween(at.Add(-time.Second), at))
		worst = max(worst, n)
		if n > 1.05*rateLimit {
			three := float64(c.CountBetween(at.Add(-3*time.Second), at))
			what := fmt.Sprintf("%.0f in the second before %v (%.0f in the three before)", n, at.Sub(start).Round(100*time.Millisecond), three)
			if three > 3*rateLimit*1.02 {
				t.Errorf("the limit did not hold through the upgrade: %s", what)
			}
			excused = append(excused, what)
		}
	}
	span := float64(c.CountBetween(upgrade.Add(-time.Second), end)) / end.Sub(upgrade.Add(-time.Second)).Seconds()
	journal := run(t, "journalctl", "-u", unit, "--no-pager", "-o", "cat")
	t.Logf("upgrade %s -> %s under %.0f pps: dpkg -i took %v; %.1f pps from a second before it to the end, worst second %.0f (limit %d); link %d -> %d; counters pass/drop %d/%d -> %d/%d; socket %d",
		from, to, res.PPS(), took.Round(time.Millisecond), span, worst, rateLimit, link0, link1, p0, d0, p1, d1, c.Count())
	if len(excused) > 0 {
		t.Logf("seconds above 1.05 x paid for by a stall of the flood just before: %s", strings.Join(excused, "; "))
	}
	if i := strings.LastIndex(journal, "msg=attached"); i >= 0 {
		for _, l := range strings.Split(journal[i:], "\n") {
			if strings.Contains(l, "msg=attached") || strings.Contains(l, "migrated") {
				t.Logf("the new daemon: %s", l)
			}
		}
	}
	t.Logf("dpkg -i:\n%s", out)
	if res.PPS() < 5*rateLimit {
		t.Fatalf("the flood offered only %.0f pps", res.PPS())
	}
	if from == to {
		t.Errorf("the version did not change: %s", to)
	}
	if span > 1.02*rateLimit {
		t.Errorf("%.1f pps from a second before the upgrade to the end, want at most 1.02 x %d", span, rateLimit)
	}
	if link1 != link0 || !strings.Contains(journal[strings.LastIndex(journal, "msg=attached"):], "adopted=true") {
		t.Errorf("the new daemon did not adopt the link: %d -> %d", link0, link1)
	}
	if p1 < p0 || d1 <= d0 || p1+d1 < uint64(0.99*float64(res.Sent)) {
		t.Errorf("counters lost across the upgrade: %d/%d -> %d/%d for %d sent", p0, d0, p1, d1, res.Sent)
	}

	t.Logf("dpkg --purge:\n%s", run(t, "dpkg", "--purge", "xlimit"))
	if _, err := os.Stat("/sys/fs/bpf/xlimit/" + guestIf); err == nil {
		t.Errorf("the purge left the pins of %s", guestIf)
	}
	_, _ = try("systemctl", "reset-failed", unit)
	run(t, "systemctl", "daemon-reload")
}
