package preflight

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// virtio is a virtio_net interface with combined of max pairs in use,
// cpus possible CPUs and no XDP program attached (as many real tx as rx
// queues as pairs).
func virtio(combined, maxPairs uint32, cpus int) Facts {
	return Facts{Iface: "eth0", Driver: "virtio_net", Kernel: "6.12.118+deb12-cloud-amd64",
		PossibleCPUs: cpus, HasChannels: true, Combined: combined, MaxCombined: maxPairs,
		RxQueues: int(combined), TxQueues: int(combined), MTU: 1500}
}

func TestDecide(t *testing.T) {
	attached := virtio(4, 4, 2) // 2 stack pairs + 2 XDP pairs: what ethtool shows with XDP attached
	attached.TxQueues = 2
	for _, c := range []struct {
		name   string
		f      Facts
		tx     bool
		native bool
		rule   string
		level  Level
	}{
		// The real-host lab of 2026-12-02, runs 3-5: every pair in use, 2
		// vCPUs: the shared mode's lock-free branch runs past the pairs.
		{"virtio 4 of 4, 2 CPUs (the panic)", virtio(4, 4, 2), false, true, "virtio_net-xdp-tx", Avoid},
		{"virtio 3 of 4, 2 CPUs", virtio(3, 4, 2), false, true, "virtio_net-xdp-tx", Avoid},
		// Runs 1-2: two pairs free for two CPUs.
		{"virtio 2 of 4, 2 CPUs", virtio(2, 4, 2), true, true, "virtio_net-xdp-tx", Info},
		// The same lab restarted with xlimit attached: the XDP pairs are in
		// ethtool's combined count, not among the real tx queues.
		{"virtio 2+2 of 4 attached, 2 CPUs", attached, true, true, "virtio_net-xdp-tx", Info},
		// A cloud VM: as many pairs as vCPUs, all in use: the locked branch.
		{"virtio 2 of 2, 2 CPUs (cloud)", virtio(2, 2, 2), true, true, "virtio_net-xdp-tx", Warn},
		{"virtio 1 of 1, 1 CPU", virtio(1, 1, 1), true, true, "virtio_net-xdp-tx", Warn},
		// More possible CPUs (hotplug slots) than pairs: locked, in bounds.
		{"virtio 2 of 2, 8 possible CPUs", virtio(2, 2, 8), true, true, "virtio_net-xdp-tx", Warn},
		{"virtio 8 of 8, 4 CPUs", virtio(8, 8, 4), false, true, "virtio_net-xdp-tx", Avoid},
		{"virtio 4 of 8, 4 CPUs", virtio(4, 8, 4), true, true, "virtio_net-xdp-tx", Info},
		{"virtio, channels unknown", Facts{Iface: "eth0", Driver: "virtio_net", PossibleCPUs: 2}, false, true, "virtio_net-xdp-tx", Avoid},
		{"ena 8 of 8", Facts{Iface: "ens5", Driver: "ena", HasChannels: true, Combined: 8, MaxCombined: 8, MTU: 1500}, true, false, "ena-queues", Warn},
		{"ena 4 of 8", Facts{Iface: "ens5", Driver: "ena", HasChannels: true, Combined: 4, MaxCombined: 8, MTU: 1500}, true, true, "", 0},
		{"ena jumbo", Facts{Iface: "ens5", Driver: "ena", HasChannels: true, Combined: 4, MaxCombined: 8, MTU: 9001}, true, false, "ena-mtu", Warn},
		{"gve rx != tx", Facts{Iface: "ens4", Driver: "gve", HasChannels: true, RxCount: 4, TxCount: 2, MaxRx: 8, MaxTx: 8}, true, false, "gve-queues", Warn},
		{"gve tx over half", Facts{Iface: "ens4", Driver: "gve", HasChannels: true, RxCount: 8, TxCount: 8, MaxRx: 8, MaxTx: 8}, true, false, "gve-queues", Warn},
		{"gve 4 of 8", Facts{Iface: "ens4", Driver: "gve", HasChannels: true, RxCount: 4, TxCount: 4, MaxRx: 8, MaxTx: 8}, true, true, "", 0},
		{"mlx5 jumbo", Facts{Iface: "enp1s0", Driver: "mlx5_core", MTU: 9000}, true, false, "mtu-native", Warn},
		{"mlx5 1500", Facts{Iface: "enp1s0", Driver: "mlx5_core", MTU: 1500}, true, true, "", 0},
		{"veth", Facts{Iface: "veth0", Driver: "veth", MTU: 1500}, true, true, "veth-peer", Info},
		{"loopback", Facts{Iface: "lo", MTU: 65536}, true, false, "no-driver", Info},
		{"e1000e", Facts{Iface: "eno1", Driver: "e1000e", MTU: 1500}, true, true, "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Decide(c.f)
			if d.XDPTx != c.tx || d.Native != c.native {
				t.Errorf("%s: %s, want xdp_tx=%v native=%v; findings %v", c.name, d.Summary(), c.tx, c.native, d.Findings)
			}
			if c.rule == "" {
				if len(d.Findings) != 0 {
					t.Errorf("%s: findings %v, want none", c.name, d.Findings)
				}
				return
			}
			for _, f := range d.Findings {
				if f.Rule == c.rule {
					if f.Level != c.level {
						t.Errorf("%s: %s is %s, want %s", c.name, f.Rule, f.Level, c.level)
					}
					if f.Level == Avoid && !strings.Contains(f.Fix, c.f.Iface) && c.f.HasChannels {
						t.Errorf("%s: the fix %q does not name the interface", c.name, f.Fix)
					}
					return
				}
			}
			t.Errorf("%s: no finding %s in %v", c.name, c.rule, d.Findings)
		})
	}
}

// The Avoid fix for the panic's configuration is one that takes the
// interface out of it: applying the suggested combined count gives a
// decision with XDP_TX.
func TestDecideFixWorks(t *testing.T) {
	for _, f := range []Facts{virtio(4, 4, 2), virtio(3, 4, 2), virtio(8, 8, 4), virtio(16, 16, 4)} {
		d := Decide(f)
		var n uint32
		if _, err := fmt.Sscanf(d.Findings[0].Fix, "ethtool -L eth0 combined %d", &n); err != nil {
			t.Fatalf("%v: fix %q: %v", f, d.Findings[0].Fix, err)
		}
		g := virtio(n, f.MaxCombined, f.PossibleCPUs)
		if !Decide(g).XDPTx {
			t.Errorf("%d of %d, %d CPUs: the fix (combined %d) still avoids XDP_TX", f.Combined, f.MaxCombined, f.PossibleCPUs, n)
		}
	}
}

func TestCountCPUs(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0-1": 2, "0-7": 8, "0,2-5": 6, "0-3,8": 9} {
		if got, err := CountCPUs(in); err != nil || got != want {
			t.Errorf("CountCPUs(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "0-y"} {
		if _, err := CountCPUs(in); err == nil {
			t.Errorf("CountCPUs(%q): no error", in)
		}
	}
}

type fakeEthtool struct {
	driver string
	ch     Channels
	ok     bool
}

func (e fakeEthtool) Driver(string) (string, error) { return e.driver, nil }
func (e fakeEthtool) Channels(string) (Channels, bool, error) {
	return e.ch, e.ok, nil
}

// writeSysfs lays out a recorded host under root: the interface's driver
// link (when driver is set), MTU and real queues, the kernel's release and
// the possible CPUs.
func writeSysfs(t *testing.T, root, iface, driver, possible string, rx, tx, mtu int) {
	t.Helper()
	dev := filepath.Join(root, "sys/class/net", iface)
	for _, d := range []string{filepath.Join(dev, "queues"), filepath.Join(root, "proc/sys/kernel"), filepath.Join(root, "sys/devices/system/cpu")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range rx {
		if err := os.Mkdir(filepath.Join(dev, "queues", fmt.Sprintf("rx-%d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range tx {
		if err := os.Mkdir(filepath.Join(dev, "queues", fmt.Sprintf("tx-%d", i)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if driver != "" {
		drv := filepath.Join(root, "sys/bus/virtio/drivers", driver)
		if err := os.MkdirAll(drv, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(dev, "device"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(drv, filepath.Join(dev, "device/driver")); err != nil {
			t.Fatal(err)
		}
	}
	for name, s := range map[string]string{
		filepath.Join(dev, "mtu"):                              fmt.Sprint(mtu),
		filepath.Join(root, "proc/sys/kernel/osrelease"):       "6.12.118+deb12-cloud-amd64\n",
		filepath.Join(root, "sys/devices/system/cpu/possible"): possible + "\n",
	} {
		if err := os.WriteFile(name, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRead(t *testing.T) {
	for _, c := range []struct {
		name     string
		driver   string // the sysfs driver link ("": none)
		eth      fakeEthtool
		possible string
		rx, tx   int
		want     Facts
		wantTx   bool
	}{
		{"the panic's guest", "virtio_net", fakeEthtool{ch: Channels{Combined: 4, MaxCombined: 4}, ok: true}, "0-1", 4, 4,
			Facts{Driver: "virtio_net", PossibleCPUs: 2, HasChannels: true, Combined: 4, MaxCombined: 4, RxQueues: 4, TxQueues: 4}, false},
		{"the same, xlimit attached with XDP pairs", "virtio_net", fakeEthtool{ch: Channels{Combined: 4, MaxCombined: 4}, ok: true}, "0-1", 4, 2,
			Facts{Driver: "virtio_net", PossibleCPUs: 2, HasChannels: true, Combined: 4, MaxCombined: 4, RxQueues: 4, TxQueues: 2}, true},
		{"a veth (driver from ethtool)", "", fakeEthtool{driver: "veth", ch: Channels{Rx: 1, Tx: 1, MaxRx: 2, MaxTx: 2}, ok: true}, "0-1", 1, 1,
			Facts{Driver: "veth", PossibleCPUs: 2, HasChannels: true, RxCount: 1, TxCount: 1, MaxRx: 2, MaxTx: 2, RxQueues: 1, TxQueues: 1}, true},
		{"no channels", "virtio_net", fakeEthtool{}, "0-3", 1, 1,
			Facts{Driver: "virtio_net", PossibleCPUs: 4, RxQueues: 1, TxQueues: 1}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			writeSysfs(t, root, "eth0", c.driver, c.possible, c.rx, c.tx, 1500)
			f, err := Reader{Root: root, Ethtool: c.eth}.Read("eth0")
			if err != nil {
				t.Fatal(err)
			}
			c.want.Iface, c.want.Kernel, c.want.MTU = "eth0", "6.12.118+deb12-cloud-amd64", 1500
			if f != c.want {
				t.Errorf("facts %+v, want %+v", f, c.want)
			}
			if got := Decide(f).XDPTx; got != c.wantTx {
				t.Errorf("xdp_tx %v, want %v", got, c.wantTx)
			}
		})
	}
	if _, err := (Reader{Root: t.TempDir()}).Read("eth9"); err == nil {
		t.Error("a missing interface: no error")
	}
	// Not in this sysfs (another namespace's): the ethtool ioctl names it.
	root := t.TempDir()
	writeSysfs(t, root, "eth0", "", "0-1", 1, 1, 1500)
	f, err := Reader{Root: root, Ethtool: fakeEthtool{driver: "virtio_net", ch: Channels{Combined: 4, MaxCombined: 4}, ok: true}}.Read("eth1")
	if err != nil || f.Driver != "virtio_net" || f.Combined != 4 || f.PossibleCPUs != 2 || Decide(f).XDPTx {
		t.Errorf("an interface only ethtool sees: %+v, %v", f, err)
	}
}
