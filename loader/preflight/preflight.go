// Package preflight decides, per interface, what XDP may do there before
// xlimit attaches: whether native mode can work with the driver's current
// settings, and whether the program may send frames back out (XDP_TX: SYN
// cookies' SYN-ACKs, the resets of refused SYNs). The decision is a pure
// function of Facts (Decide), read from sysfs, procfs and the ethtool ioctl
// (Read); every rule is in docs/kernels.md ("Drivers: the preflight") with
// the source it comes from.
//
// A driver path known to crash the host is avoided, not warned about: where
// Decide says XDP_TX is unsafe, the loader loads the program with XDP_TX
// compiled out (maps.Options.NoXDPTx), so SYNs the cookie path would answer
// go to the kernel (its own SYN cookies) and refused SYNs are dropped
// without a reset.
package preflight

import (
	"fmt"
	"strings"
)

// Facts are what the preflight knows of an interface.
type Facts struct {
	Iface  string
	Driver string // the kernel driver's name ("virtio_net", "veth", ...); "" when none
	Kernel string // the kernel's release (uname -r)
	// PossibleCPUs is the kernel's nr_cpu_ids (/sys/devices/system/cpu/possible),
	// the count virtio_net sizes its XDP queues by: not the CPUs online, nor
	// the CPUs this process may run on.
	PossibleCPUs int
	// Channels are the ethtool channel counts (ETHTOOL_GCHANNELS); HasChannels
	// is false when the driver does not report them.
	HasChannels           bool
	Combined, MaxCombined uint32
	RxCount, TxCount      uint32
	MaxRx, MaxTx          uint32
	RxQueues, TxQueues    int // real queues (/sys/class/net/IF/queues/rx-*, tx-*)
	MTU                   int
}

// Level is how much a finding matters.
type Level int

const (
	// Info explains what the driver will do; nothing to change.
	Info Level = iota
	// Warn: xlimit works, but not as configured (a fallback, a slower path).
	Warn
	// Avoid: a path known to misbehave, which xlimit does not take.
	Avoid
)

func (l Level) String() string {
	switch l {
	case Info:
		return "info"
	case Warn:
		return "warning"
	default:
		return "avoided"
	}
}

// Finding is one rule's outcome for an interface.
type Finding struct {
	Rule  string // the rule's name, as in docs/kernels.md
	Level Level
	What  string // what happens, and why
	Fix   string // what to change ("" when nothing)
}

func (f Finding) String() string {
	s := fmt.Sprintf("%s: %s: %s", f.Level, f.Rule, f.What)
	if f.Fix != "" {
		s += "; to change: " + f.Fix
	}
	return s
}

// Decision is what xlimit does on an interface.
type Decision struct {
	// XDPTx: the program may return XDP_TX here. False: it is loaded with
	// XDP_TX compiled out.
	XDPTx bool
	// Native: native mode is expected to attach (false: the driver will
	// refuse it with its current settings, and `--xdp-mode auto` falls
	// back to generic).
	Native   bool
	Findings []Finding
}

// Summary is a one-line account of d, for logs and `xlimit status`.
func (d Decision) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "xdp_tx=%s native=%s", yesNo(d.XDPTx), yesNo(d.Native))
	return b.String()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// Decide applies the driver rules to f.
func Decide(f Facts) Decision {
	d := Decision{XDPTx: true, Native: true}
	switch f.Driver {
	case "virtio_net":
		virtioNet(f, &d)
	case "ena":
		ena(f, &d)
	case "gve":
		gve(f, &d)
	case "mlx5_core", "mlx4_en", "i40e", "ice", "ixgbe", "bnxt_en":
		mtuNative(f, &d)
	case "veth":
		d.Findings = append(d.Findings, Finding{Rule: "veth-peer", Level: Info,
			What: "XDP_TX frames reach the peer at once only when the peer runs an XDP program (xlimit check warns when it does not)"})
	case "":
		d.Native = false
		d.Findings = append(d.Findings, Finding{Rule: "no-driver", Level: Info,
			What: "no driver named (loopback or a virtual device): native XDP is not expected, generic mode is used"})
	}
	return d
}

// virtioStackPairs is the number of queue pairs virtio_net's stack uses
// (curr_queue_pairs without the XDP pairs). With an XDP program attached
// in the per-CPU mode, ethtool's combined count includes the XDP pairs
// while only the receive side grows: virtnet_xdp_set raises the real rx
// queues (netif_set_real_num_rx_queues) and leaves the real tx queues at
// the stack's count. So the stack's pairs are the real tx queues when
// sysfs has them.
func virtioStackPairs(f Facts) uint32 {
	if f.TxQueues > 0 && uint32(f.TxQueues) < f.Combined {
		return uint32(f.TxQueues)
	}
	return f.Combined
}

// virtioNet is virtio_net's rule (drivers/net/virtio_net.c, Linux 5.12 to
// at least 6.12.118). virtnet_xdp_set gives XDP_TX a queue pair per
// possible CPU (nr_cpu_ids) when stack + CPUs fits in max_queue_pairs;
// otherwise it sets xdp_queue_pairs to 0 and XDP_TX shares the stack's
// pairs ("XDP request N queues but max is M ... slower locked tx mode").
// virtnet_xdp_get_sq then picks the pair: when curr_queue_pairs >
// nr_cpu_ids it takes the lock-free branch, qp = curr_queue_pairs -
// xdp_queue_pairs + cpu, which in the shared mode (xdp_queue_pairs 0) is
// curr_queue_pairs + cpu: past the last pair, an sq whose vq is not a
// virtqueue. Linux 6.12.118 panicked there (virtqueue_get_buf reading
// address 0x40 of a NULL vq, from virtnet_xdp_xmit), three runs of three
// (docs/kernels.md). With stack ≤ CPUs the shared mode takes the locked
// branch (qp = cpu % curr_queue_pairs), which stays in bounds.
func virtioNet(f Facts, d *Decision) {
	if !f.HasChannels || f.PossibleCPUs <= 0 {
		d.XDPTx = false
		d.Findings = append(d.Findings, Finding{Rule: "virtio_net-xdp-tx", Level: Avoid,
			What: "virtio_net's queue pairs or the possible CPUs cannot be read, so whether XDP_TX would run past the device's queues is unknown: XDP_TX is not used (SYN cookies are the kernel's, refusals are dropped without a reset)",
			Fix:  "make ethtool -l IFACE and /sys/devices/system/cpu/possible readable"})
		return
	}
	stack := virtioStackPairs(f)
	cpus := uint32(f.PossibleCPUs)
	shared := uint64(stack)+uint64(cpus) > uint64(f.MaxCombined)
	switch {
	case shared && stack > cpus:
		d.XDPTx = false
		free := uint32(0)
		if f.MaxCombined > cpus {
			free = f.MaxCombined - cpus
		}
		fix := fmt.Sprintf("ethtool -L %s combined %d (a pair per possible CPU left for XDP_TX), or give the device at least %d queue pairs", f.Iface, free, stack+cpus)
		if free == 0 {
			fix = fmt.Sprintf("ethtool -L %s combined %d (the locked shared mode), or give the device at least %d queue pairs", f.Iface, cpus, 1+cpus)
		}
		d.Findings = append(d.Findings, Finding{Rule: "virtio_net-xdp-tx", Level: Avoid,
			What: fmt.Sprintf("%d queue pairs in use of %d with %d possible CPUs: virtio_net's shared XDP_TX mode takes its lock-free branch and sends past the device's last queue pair (a NULL-pointer panic in virtnet_xdp_xmit on Linux 6.12.118): XDP_TX is not used (SYN cookies are the kernel's, refusals are dropped without a reset)", stack, f.MaxCombined, cpus),
			Fix:  fix})
	case shared:
		fix := fmt.Sprintf("give the device at least %d queue pairs (the hypervisor's queues) for XDP_TX pairs of its own", stack+cpus)
		if f.MaxCombined > cpus {
			fix = fmt.Sprintf("ethtool -L %s combined %d for XDP_TX pairs of its own", f.Iface, f.MaxCombined-cpus)
		}
		d.Findings = append(d.Findings, Finding{Rule: "virtio_net-xdp-tx", Level: Warn,
			What: fmt.Sprintf("%d queue pairs in use of %d with %d possible CPUs: XDP_TX shares the stack's pairs under a lock (the driver's slower shared mode, which stays within the device's pairs)", stack, f.MaxCombined, cpus),
			Fix:  fix})
	default:
		d.Findings = append(d.Findings, Finding{Rule: "virtio_net-xdp-tx", Level: Info,
			What: fmt.Sprintf("%d queue pairs in use of %d with %d possible CPUs: XDP_TX gets a pair per CPU", stack, f.MaxCombined, cpus)})
	}
	d.Findings = append(d.Findings, Finding{Rule: "virtio_net-offloads", Level: Info,
		What: "native XDP needs the guest offloads (TSO, ECN, UFO, checksum: GRO_HW) off: virtio_net turns them off itself when the device lets it, and refuses the program otherwise (then generic mode is used)"})
}

// ena is the ENA driver's rule (drivers/net/ethernet/amazon/ena): XDP
// needs the I/O queues at most half the maximum (its XDP queues come from
// the other half) and an MTU of at most ENA_XDP_MAX_MTU (3498 with 4 KiB
// pages).
func ena(f Facts, d *Decision) {
	if f.HasChannels && f.MaxCombined > 0 && f.Combined > f.MaxCombined/2 {
		d.Native = false
		d.Findings = append(d.Findings, Finding{Rule: "ena-queues", Level: Warn,
			What: fmt.Sprintf("%d queues in use of %d: ENA attaches XDP only with at most half its queues in use", f.Combined, f.MaxCombined),
			Fix:  fmt.Sprintf("ethtool -L %s combined %d", f.Iface, f.MaxCombined/2)})
	}
	if f.MTU > 3498 {
		d.Native = false
		d.Findings = append(d.Findings, Finding{Rule: "ena-mtu", Level: Warn,
			What: fmt.Sprintf("MTU %d: ENA attaches XDP only up to an MTU of 3498", f.MTU),
			Fix:  fmt.Sprintf("ip link set dev %s mtu 3498", f.Iface)})
	}
}

// gve is Google's gVNIC rule (drivers/net/ethernet/google/gve): XDP needs
// as many rx as tx queues, and tx queues at most half their maximum (the
// XDP tx queues come from the other half).
func gve(f Facts, d *Decision) {
	if !f.HasChannels {
		return
	}
	if f.RxCount != f.TxCount {
		d.Native = false
		d.Findings = append(d.Findings, Finding{Rule: "gve-queues", Level: Warn,
			What: fmt.Sprintf("%d rx and %d tx queues: gve attaches XDP only with as many rx as tx queues", f.RxCount, f.TxCount),
			Fix:  fmt.Sprintf("ethtool -L %s rx N tx N", f.Iface)})
	} else if f.MaxTx > 0 && f.TxCount > f.MaxTx/2 {
		d.Native = false
		d.Findings = append(d.Findings, Finding{Rule: "gve-queues", Level: Warn,
			What: fmt.Sprintf("%d tx queues of %d: gve attaches XDP only with at most half its tx queues in use", f.TxCount, f.MaxTx),
			Fix:  fmt.Sprintf("ethtool -L %s rx %d tx %d", f.Iface, f.MaxTx/2, f.MaxTx/2)})
	}
}

// mtuNative is the rule of the drivers that run native XDP on one page
// per frame (mlx5 and the Intel and Broadcom drivers): a larger MTU than
// fits a page with its headroom makes them refuse the program.
func mtuNative(f Facts, d *Decision) {
	if f.MTU > 3498 {
		d.Native = false
		d.Findings = append(d.Findings, Finding{Rule: "mtu-native", Level: Warn,
			What: fmt.Sprintf("MTU %d: %s runs native XDP on one page per frame, which this MTU does not fit (it refuses the program or needs multi-buffer XDP, which xlimit's program does not declare)", f.MTU, f.Driver),
			Fix:  fmt.Sprintf("ip link set dev %s mtu 3498 (or lower)", f.Iface)})
	}
}
