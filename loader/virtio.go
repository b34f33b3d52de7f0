//go:build linux

package loader

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrVirtioSharedXDPTx marks a virtio_net interface whose XDP_TX has no
// queue pairs of its own: every pair is in use by the stack, so the driver
// sends XDP_TX frames in its shared, locked mode. A Debian 12 guest on Linux
// 6.12.118 panicked in that mode (a NULL pointer in virtqueue_get_buf, from
// virtnet_xdp_xmit, inside the attach of xlimit's program) when xlimit
// attached with answers while SYNs were arriving (docs/realhost.md,
// bench/results/realhost/2026-12-02-run5/console.log).
var ErrVirtioSharedXDPTx = errors.New("virtio_net with no queue pair free for XDP_TX: the driver sends answers (syn_cookies SYN-ACKs, refuse: reset) in its shared, locked mode, in which Linux 6.12.118 panicked attaching xlimit under a SYN flood (docs/realhost.md); leave a pair per CPU free (ethtool -L IFACE combined N), or attach before the traffic")

// ethtoolChannels is struct ethtool_channels.
type ethtoolChannels struct {
	cmd                                         uint32
	maxRx, maxTx, maxOther, maxCombined         uint32
	rxCount, txCount, otherCount, combinedCount uint32
}

// virtioSharedXDPTx is virtio_net's rule (virtnet_xdp_set): XDP_TX gets a
// queue pair per CPU when curr + CPUs fits in the device's maximum, and
// shares the stack's pairs under a lock otherwise.
func virtioSharedXDPTx(driver string, combined, maxCombined uint32, cpus int) bool {
	return driver == "virtio_net" && uint64(combined)+uint64(cpus) > uint64(maxCombined)
}

// CheckXDPTxQueues reports whether frames the XDP program on iface sends
// back (XDP_TX) go out in virtio_net's shared mode: an error wrapping
// ErrVirtioSharedXDPTx, nil for other drivers or with pairs to spare.
func CheckXDPTxQueues(iface string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open an ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, iface)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return nil // no driver to name (loopback): not virtio_net
	}
	if err != nil {
		return fmt.Errorf("read the driver of %s: %w", iface, err)
	}
	driver := unix.ByteSliceToString(info.Driver[:])
	if driver != "virtio_net" {
		return nil
	}
	ch := ethtoolChannels{cmd: unix.ETHTOOL_GCHANNELS}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [24 - unsafe.Sizeof(uintptr(0))]byte
	}
	copy(ifr.name[:unix.IFNAMSIZ-1], iface)
	ifr.data = unsafe.Pointer(&ch)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(&ch)
	if errno != 0 {
		return fmt.Errorf("read the channels of %s: %w", iface, errno)
	}
	if virtioSharedXDPTx(driver, ch.combinedCount, ch.maxCombined, runtime.NumCPU()) {
		return fmt.Errorf("%s (combined %d of %d, %d CPUs): %w", iface, ch.combinedCount, ch.maxCombined, runtime.NumCPU(), ErrVirtioSharedXDPTx)
	}
	return nil
}
