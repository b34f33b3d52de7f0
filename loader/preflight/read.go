package preflight

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Channels are the ethtool channel counts of an interface.
type Channels struct {
	Combined, MaxCombined uint32
	Rx, Tx, MaxRx, MaxTx  uint32
}

// Reader reads Facts. Root is the file system's root ("/" on a host; a
// directory of recorded files in tests); Ethtool answers what only the
// ethtool ioctl tells (nil: not asked).
type Reader struct {
	Root    string
	Ethtool Ethtool
}

// Ethtool is the part of the ethtool ioctl the preflight uses.
type Ethtool interface {
	// Driver is the driver's name (ETHTOOL_GDRVINFO); "" when the device
	// names none.
	Driver(iface string) (string, error)
	// Channels are its channel counts (ETHTOOL_GCHANNELS); ok is false
	// when the driver does not report them.
	Channels(iface string) (c Channels, ok bool, err error)
}

// Read reads the facts of iface.
func (r Reader) Read(iface string) (Facts, error) {
	f := Facts{Iface: iface}
	// sysfs shows the network namespace it was mounted in: a process
	// that entered another (setns, without a sysfs of its own) finds
	// the interface only through the ethtool ioctl, which answers for
	// the namespace of its socket.
	dev := filepath.Join(r.Root, "sys/class/net", iface)
	if _, err := os.Stat(dev); err != nil && r.Ethtool == nil {
		return f, fmt.Errorf("read interface %s: %w", iface, err)
	}
	// The driver: the device's driver link, else what ethtool says (a
	// veth has no device but names its driver there).
	if link, err := os.Readlink(filepath.Join(dev, "device/driver")); err == nil {
		f.Driver = filepath.Base(link)
	} else if r.Ethtool != nil {
		d, err := r.Ethtool.Driver(iface)
		if err != nil {
			return f, fmt.Errorf("read the driver of %s: %w", iface, err)
		}
		f.Driver = d
	}
	if b, err := os.ReadFile(filepath.Join(r.Root, "proc/sys/kernel/osrelease")); err == nil {
		f.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile(filepath.Join(r.Root, "sys/devices/system/cpu/possible")); err == nil {
		n, err := CountCPUs(strings.TrimSpace(string(b)))
		if err != nil {
			return f, fmt.Errorf("read the possible CPUs: %w", err)
		}
		f.PossibleCPUs = n
	}
	if b, err := os.ReadFile(filepath.Join(dev, "mtu")); err == nil {
		f.MTU, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	ents, err := os.ReadDir(filepath.Join(dev, "queues"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return f, fmt.Errorf("read the queues of %s: %w", iface, err)
	}
	for _, e := range ents {
		switch {
		case strings.HasPrefix(e.Name(), "rx-"):
			f.RxQueues++
		case strings.HasPrefix(e.Name(), "tx-"):
			f.TxQueues++
		}
	}
	if r.Ethtool != nil {
		c, ok, err := r.Ethtool.Channels(iface)
		if err != nil {
			return f, fmt.Errorf("read the channels of %s: %w", iface, err)
		}
		if ok {
			f.HasChannels = true
			f.Combined, f.MaxCombined = c.Combined, c.MaxCombined
			f.RxCount, f.TxCount, f.MaxRx, f.MaxTx = c.Rx, c.Tx, c.MaxRx, c.MaxTx
		}
	}
	return f, nil
}

// CountCPUs is the kernel's nr_cpu_ids from a CPU list such as "0-3" or
// "0,2-5": the highest CPU + 1.
func CountCPUs(list string) (int, error) {
	highest := -1
	for _, part := range strings.Split(list, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if _, hi, ok := strings.Cut(part, "-"); ok {
			part = hi
		}
		n, err := strconv.Atoi(part)
		if err != nil {
			return 0, fmt.Errorf("parse CPU list %q: %w", list, err)
		}
		highest = max(highest, n)
	}
	if highest < 0 {
		return 0, fmt.Errorf("parse CPU list %q: empty", list)
	}
	return highest + 1, nil
}
