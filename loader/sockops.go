package loader

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// sockOpsPin is the pin of the link that attaches the connection counter
// (the sock_ops program) to a cgroup, beside the XDP link.
const sockOpsPin = "sockops_link"

// cgroupFallback is where a cgroup2 hierarchy is mounted when the host has
// none mounted (a minimal VM or initramfs).
const cgroupFallback = "/run/xlimit/cgroup2"

// CgroupRoot returns the mount point of the cgroup v2 hierarchy, mounting
// it at /run/xlimit/cgroup2 when none is mounted. The sock_ops program
// attached there sees every TCP socket of the processes below it: on a host
// (or in a container's cgroup namespace), all of them.
func CgroupRoot() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("find cgroup2: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(s.Text(), " - ")
		fields := strings.Fields(pre)
		if !ok || len(fields) < 5 || !strings.HasPrefix(post, "cgroup2 ") || fields[3] != "/" {
			continue
		}
		return unescapeMount(fields[4]), nil
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("find cgroup2: %w", err)
	}
	if err := os.MkdirAll(cgroupFallback, 0o700); err != nil {
		return "", fmt.Errorf("create cgroup2 mount point: %w", err)
	}
	if err := unix.Mount("cgroup2", cgroupFallback, "cgroup2", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
		return "", fmt.Errorf("mount cgroup2 at %s: %w", cgroupFallback, err)
	}
	return cgroupFallback, nil
}

// unescapeMount undoes the octal escapes of /proc/self/mountinfo paths.
func unescapeMount(p string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(p)
}

// attachSockOps attaches the connection counter to the cgroup through a
// pinned bpf_link, or replaces the program of the pinned link in place, so
// that the counts of connections in flight carry on across restarts.
func (a *Attachment) attachSockOps(prog *ebpf.Program, cgroup string) error {
	pin := filepath.Join(a.Dir, sockOpsPin)
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		if err := l.Update(prog); err == nil {
			a.sockOps = l
			return nil
		}
		// The cgroup is gone (or the link was detached): start anew.
		_ = l.Unpin()
		l.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("load pinned link %s: %w", pin, err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupSockOps, Program: prog})
	if err != nil {
		return fmt.Errorf("attach the connection counter to cgroup %s: %w", cgroup, err)
	}
	if err := l.Pin(pin); err != nil {
		l.Close()
		return fmt.Errorf("pin the connection counter's link: %w", err)
	}
	a.sockOps = l
	return nil
}

// detachPinnedLink detaches a pinned link (even while a daemon holds it)
// and removes its pin; a missing pin is not an error.
func detachPinnedLink(pin string) error {
	l, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load pinned link %s: %w", pin, err)
	}
	var errs []error
	if err := l.Detach(); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("detach link %s: %w", filepath.Base(pin), err))
	}
	errs = append(errs, l.Unpin(), l.Close())
	return errors.Join(errs...)
}
