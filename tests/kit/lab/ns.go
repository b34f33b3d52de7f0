//go:build linux

package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named network namespaces are bind-mounted, the same place
// iproute2 uses, so `ip netns` and `nsenter --net=/run/netns/NAME` see them.
const netnsDir = "/run/netns"

// NS is a named network namespace created by this package. Its bind mount
// lives at Path (/run/netns/Name).
//
// The namespace itself lives on while anything still references it: sockets
// opened inside it and processes started in it keep it (and its interfaces)
// alive after Close removed the name. Close those first.
type NS struct {
	Name string
	Path string

	mu     sync.Mutex
	closed bool
}

// newNamedNS creates a fresh network namespace and bind-mounts it at
// /run/netns/name. The file is created with O_EXCL first, so an existing
// namespace of the same name is never touched.
func newNamedNS(name string) (*NS, error) {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", netnsDir, err)
	}
	p := filepath.Join(netnsDir, name)
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create netns file %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(p)
		return nil, fmt.Errorf("close netns file %s: %w", p, err)
	}
	err = onFreshThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare netns: %w", err)
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, p, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount netns at %s: %w", p, err)
		}
		return nil
	})
	if err != nil {
		_ = os.Remove(p)
		return nil, err
	}
	return &NS{Name: name, Path: p}, nil
}

// onFreshThread runs fn on a new goroutine locked to its OS thread and
// restores the thread's original network namespace afterwards. If the
// namespace cannot be restored, the goroutine exits without unlocking, which
// makes the Go runtime terminate that (tainted) thread.
func onFreshThread(fn func() error) error {
	type result struct {
		err      error
		panicked bool
		panicVal any
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var res result
		restored := false
		defer func() {
			if restored {
				runtime.UnlockOSThread()
			}
			ch <- res
		}()
		orig, err := netns.Get()
		if err != nil {
			res.err = fmt.Errorf("get current netns: %w", err)
			restored = true
			return
		}
		defer orig.Close()
		func() {
			defer func() {
				if r := recover(); r != nil {
					res.panicked, res.panicVal = true, r
				}
			}()
			res.err = fn()
		}()
		if err := netns.Set(orig); err != nil {
			res.err = errors.Join(res.err, fmt.Errorf("restore netns: %w", err))
			return
		}
		restored = true
	}()
	r := <-ch
	if r.panicked {
		panic(r.panicVal)
	}
	return r.err
}

// Do runs fn on an OS thread switched into the namespace and switches the
// thread back afterwards (a thread that cannot be switched back is discarded).
// fn runs on a separate goroutine; Do waits for it and re-raises its panics.
// Sockets created inside fn stay in the namespace and may be used from any
// goroutine afterwards. Goroutines started by fn do NOT run in the namespace.
func (n *NS) Do(fn func() error) error {
	return onFreshThread(func() error {
		target, err := netns.GetFromPath(n.Path)
		if err != nil {
			return fmt.Errorf("open netns %s: %w", n.Path, err)
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			return fmt.Errorf("enter netns %s: %w", n.Name, err)
		}
		return fn()
	})
}

// Command returns a command that runs name inside the namespace via
// `nsenter --net=PATH` (only the network namespace changes; unlike
// `ip netns exec` the child keeps the caller's mount namespace).
func (n *NS) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + n.Path, "--", name}, args...)...)
}

// Close removes the namespace's name (unmounts and deletes /run/netns/NAME).
// The kernel destroys the namespace, and with it its interfaces, once nothing
// references it any more. Close is idempotent.
func (n *NS) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	var errs []error
	if err := unix.Unmount(n.Path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		errs = append(errs, fmt.Errorf("unmount netns %s: %w", n.Path, err))
	}
	if err := os.Remove(n.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove netns file %s: %w", n.Path, err))
	}
	if len(errs) == 0 {
		n.closed = true
	}
	return errors.Join(errs...)
}

// LinkStats reads the counters of the namespace's interface ifname. A
// veth counts in its tx_dropped the frames it could not queue to its
// peer because the peer's ring was full: what a flood faster than the
// receiving side drains loses before any XDP program sees it.
func (n *NS) LinkStats(ifname string) (netlink.LinkStatistics, error) {
	var st netlink.LinkStatistics
	err := n.Do(func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("find link %s: %w", ifname, err)
		}
		if l.Attrs().Statistics == nil {
			return fmt.Errorf("read the counters of %s: none reported", ifname)
		}
		st = *l.Attrs().Statistics
		return nil
	})
	return st, err
}
