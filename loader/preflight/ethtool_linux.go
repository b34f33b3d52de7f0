//go:build linux

package preflight

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Host reads the facts of the host's interfaces.
var Host = Reader{Root: "/", Ethtool: ioctlEthtool{}}

// ioctlEthtool is Ethtool through SIOCETHTOOL.
type ioctlEthtool struct{}

func socket() (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open an ethtool socket: %w", err)
	}
	return fd, nil
}

func (ioctlEthtool) Driver(iface string) (string, error) {
	fd, err := socket()
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, iface)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return "", nil // loopback names no driver
	}
	if err != nil {
		return "", err
	}
	return unix.ByteSliceToString(info.Driver[:]), nil
}

// ethtoolChannels is struct ethtool_channels.
type ethtoolChannels struct {
	cmd                                         uint32
	maxRx, maxTx, maxOther, maxCombined         uint32
	rxCount, txCount, otherCount, combinedCount uint32
}

func (ioctlEthtool) Channels(iface string) (Channels, bool, error) {
	fd, err := socket()
	if err != nil {
		return Channels{}, false, err
	}
	defer unix.Close(fd)
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
	if errno == unix.EOPNOTSUPP {
		return Channels{}, false, nil
	}
	if errno != 0 {
		return Channels{}, false, errno
	}
	return Channels{
		Combined: ch.combinedCount, MaxCombined: ch.maxCombined,
		Rx: ch.rxCount, Tx: ch.txCount, MaxRx: ch.maxRx, MaxTx: ch.maxTx,
	}, true, nil
}
