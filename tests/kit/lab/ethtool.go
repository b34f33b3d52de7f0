//go:build linux

package lab

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqPtr is struct ifreq with the union holding a pointer (ifr_data).
type ifreqPtr struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

// ethtoolSetting is one legacy ethtool on/off setting.
type ethtoolSetting struct {
	name     string
	get, set uint32
	on       bool
}

// vethOffloads is what New applies to a veth end; see the package
// documentation for why. The client end keeps GRO, which gives it the NAPI
// receive path that frames sent back by the server's XDP program (XDP_TX)
// need on a veth.
func vethOffloads(server bool) []ethtoolSetting {
	return []ethtoolSetting{
		{"tx-checksumming", unix.ETHTOOL_GTXCSUM, unix.ETHTOOL_STXCSUM, false},
		{"tcp-segmentation-offload", unix.ETHTOOL_GTSO, unix.ETHTOOL_STSO, false},
		{"generic-segmentation-offload", unix.ETHTOOL_GGSO, unix.ETHTOOL_SGSO, false},
		{"generic-receive-offload", unix.ETHTOOL_GGRO, unix.ETHTOOL_SGRO, !server},
		{"rx-checksumming", unix.ETHTOOL_GRXCSUM, unix.ETHTOOL_SRXCSUM, false},
	}
}

// ethtoolIoctl issues one SIOCETHTOOL with an ethtool_value payload on fd.
func ethtoolIoctl(fd int, ifname string, v *ethtoolValue) error {
	var ifr ifreqPtr
	copy(ifr.name[:unix.IFNAMSIZ-1], ifname)
	ifr.data = unsafe.Pointer(v)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(v)
	if errno != 0 {
		return errno
	}
	return nil
}

// setOffloads applies settings to ifname. It must run inside the interface's
// namespace (the ioctl socket decides the namespace). It verifies every
// setting took effect.
func setOffloads(ifname string, settings []ethtoolSetting) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	for _, s := range settings {
		want := uint32(0)
		if s.on {
			want = 1
		}
		v := ethtoolValue{cmd: s.set, data: want}
		if err := ethtoolIoctl(fd, ifname, &v); err != nil {
			return fmt.Errorf("set %s %s: %w", ifname, s.name, err)
		}
		g := ethtoolValue{cmd: s.get}
		if err := ethtoolIoctl(fd, ifname, &g); err != nil {
			return fmt.Errorf("get %s %s: %w", ifname, s.name, err)
		}
		if (g.data != 0) != s.on {
			return fmt.Errorf("set %s %s: still %d after setting %d", ifname, s.name, g.data, want)
		}
	}
	return nil
}

// SetGRO switches generic receive offload of ifname, an interface of n,
// on or off with the legacy SIOCETHTOOL ioctl (no ethtool binary needed),
// and checks it took effect. On a veth, GRO on also enables the NAPI that
// receiving redirected XDP frames needs when no XDP program is attached.
func (n *NS) SetGRO(ifname string, on bool) error {
	return n.Do(func() error {
		return setOffloads(ifname, []ethtoolSetting{{"generic-receive-offload", unix.ETHTOOL_GGRO, unix.ETHTOOL_SGRO, on}})
	})
}

// writeSysctl writes a value under /proc/sys/net. It must run inside the
// namespace whose setting is meant: /proc/sys/net follows the network
// namespace of the opening thread.
func writeSysctl(key, value string) error {
	p := filepath.Join("/proc/sys/net", key)
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("write sysctl %s: %w", p, err)
	}
	return nil
}

// ethtoolBuf issues one SIOCETHTOOL whose payload is buf (a command
// structure with its flexible array).
func ethtoolBuf(fd int, ifname string, buf []byte) error {
	var ifr ifreqPtr
	copy(ifr.name[:unix.IFNAMSIZ-1], ifname)
	ifr.data = unsafe.Pointer(&buf[0])
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(buf)
	if errno != 0 {
		return errno
	}
	return nil
}

// Stats reads the driver's statistics of ifname, an interface of n (what
// `ethtool -S` prints: a veth's rx_queue_N_xdp_packets, ...), with the
// SIOCETHTOOL ioctl: no ethtool binary needed.
func (n *NS) Stats(ifname string) (map[string]uint64, error) {
	const (
		ethSSStats    = 1  // ETH_SS_STATS
		ethGStringLen = 32 // ETH_GSTRING_LEN
	)
	out := map[string]uint64{}
	err := n.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open ethtool socket: %w", err)
		}
		defer unix.Close(fd)
		// struct ethtool_sset_info: cmd, reserved, sset_mask, data[1].
		info := make([]byte, 4+4+8+4)
		binary.NativeEndian.PutUint32(info, unix.ETHTOOL_GSSET_INFO)
		binary.NativeEndian.PutUint64(info[8:], 1<<ethSSStats)
		if err := ethtoolBuf(fd, ifname, info); err != nil {
			return fmt.Errorf("read the statistics count of %s: %w", ifname, err)
		}
		if binary.NativeEndian.Uint64(info[8:]) == 0 {
			return fmt.Errorf("read the statistics of %s: the driver has none", ifname)
		}
		count := int(binary.NativeEndian.Uint32(info[16:]))
		// struct ethtool_gstrings: cmd, string_set, len, data[len][32].
		names := make([]byte, 12+count*ethGStringLen)
		binary.NativeEndian.PutUint32(names, unix.ETHTOOL_GSTRINGS)
		binary.NativeEndian.PutUint32(names[4:], ethSSStats)
		binary.NativeEndian.PutUint32(names[8:], uint32(count))
		if err := ethtoolBuf(fd, ifname, names); err != nil {
			return fmt.Errorf("read the statistics names of %s: %w", ifname, err)
		}
		// struct ethtool_stats: cmd, n_stats, data[n_stats] (u64).
		vals := make([]byte, 8+count*8)
		binary.NativeEndian.PutUint32(vals, unix.ETHTOOL_GSTATS)
		binary.NativeEndian.PutUint32(vals[4:], uint32(count))
		if err := ethtoolBuf(fd, ifname, vals); err != nil {
			return fmt.Errorf("read the statistics of %s: %w", ifname, err)
		}
		if got := int(binary.NativeEndian.Uint32(vals[4:])); got < count {
			count = got
		}
		for i := range count {
			name := unix.ByteSliceToString(names[12+i*ethGStringLen : 12+(i+1)*ethGStringLen])
			out[name] = binary.NativeEndian.Uint64(vals[8+i*8:])
		}
		return nil
	})
	return out, err
}
