//go:build linux

package main

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/userspace/lab"
)

// setGRO switches generic receive offload of ifname (inside ns) on or off
// with the legacy SIOCETHTOOL ioctl (no ethtool binary needed). On a veth,
// GRO on also enables the NAPI that receiving redirected XDP frames needs
// when no XDP program is attached.
func setGRO(ns *lab.NS, ifname string, on bool) error {
	return ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		v := struct{ cmd, data uint32 }{unix.ETHTOOL_SGRO, 0}
		if on {
			v.data = 1
		}
		var ifr struct {
			name [unix.IFNAMSIZ]byte
			data unsafe.Pointer
			_    [24 - unsafe.Sizeof(uintptr(0))]byte
		}
		copy(ifr.name[:unix.IFNAMSIZ-1], ifname)
		ifr.data = unsafe.Pointer(&v)
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
		runtime.KeepAlive(&v)
		if errno != 0 {
			return fmt.Errorf("set GRO %v on %s: %w", on, ifname, errno)
		}
		return nil
	})
}
