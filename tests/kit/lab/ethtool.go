//go:build linux

package lab

import (
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
