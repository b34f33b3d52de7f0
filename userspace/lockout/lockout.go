// Package lockout finds what in a rules document could cut the host's
// operator off: rules that limit new TCP connections to the port where
// sshd listens, and a deny of every source. `xlimit check` prints its
// findings as warnings (docs/operations.md).
package lockout

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/xlimit/xlimit/userspace/dataplane"
)

// Listener is a listening TCP socket and the process that holds it.
type Listener struct {
	Addr    netip.AddrPort
	Process string // the command name (comm); "" when unknown
	PID     int
}

// TCPListeners reads the listening TCP sockets of the network namespace
// of procRoot ("/proc") from net/tcp and net/tcp6, and their processes
// from the sockets' inodes under each process's fd directory (the
// processes it may not read are left unnamed).
func TCPListeners(procRoot string) ([]Listener, error) {
	byInode := map[string]*Listener{}
	var out []*Listener
	for _, name := range []string{"net/tcp", "net/tcp6"} {
		data, err := os.ReadFile(filepath.Join(procRoot, name))
		if err != nil {
			if os.IsNotExist(err) && name == "net/tcp6" {
				continue
			}
			return nil, fmt.Errorf("read %s: %w", name, err)
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Scan() // header
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 10 || f[3] != "0A" { // TCP_LISTEN
				continue
			}
			ap, ok := parseProcAddr(f[1])
			if !ok {
				continue
			}
			l := &Listener{Addr: ap}
			byInode[f[9]] = l
			out = append(out, l)
		}
	}
	pids, _ := filepath.Glob(filepath.Join(procRoot, "[0-9]*"))
	for _, dir := range pids {
		fds, err := os.ReadDir(filepath.Join(dir, "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(target, "socket:[") {
				continue
			}
			l := byInode[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")]
			if l == nil || l.Process != "" {
				continue
			}
			comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
			l.Process = strings.TrimSpace(string(comm))
			l.PID, _ = strconv.Atoi(filepath.Base(dir))
		}
	}
	ls := make([]Listener, 0, len(out))
	for _, l := range out {
		ls = append(ls, *l)
	}
	return ls, nil
}

// parseProcAddr parses net/tcp's "0100007F:0016" (little-endian words).
func parseProcAddr(s string) (netip.AddrPort, bool) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, false
	}
	for i := 0; i+4 <= len(raw); i += 4 {
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), true
}

// Warnings are the findings of plan against the host's listeners: every
// rule that limits new TCP connections to a port where sshd listens, and
// a deny of every source of a family without an allow.
func Warnings(plan *dataplane.Plan, spec *dataplane.Spec, ls []Listener) []string {
	var out []string
	seen := map[uint16]bool{}
	for _, l := range ls {
		port := l.Addr.Port()
		if !strings.HasPrefix(l.Process, "sshd") || seen[port] {
			continue
		}
		seen[port] = true
		mask := plan.Ports[dataplane.PortKey(dataplane.ProtoTCP, port)] | plan.Globals.Portless[dataplane.ProtoTCP]
		var names []string
		for _, slot := range plan.ActiveSlots() {
			r := &plan.Rules[slot]
			if mask&(1<<slot) != 0 && r.Flags&dataplane.RuleShadow == 0 {
				names = append(names, r.Name)
			}
		}
		if len(names) > 0 {
			slices.Sort(names)
			out = append(out, fmt.Sprintf("rule(s) %s limit new TCP connections to port %d, where sshd (pid %d) listens: a flood there locks you out; add %d to management.tcp_ports, or your addresses to management.sources (docs/operations.md)",
				strings.Join(names, ", "), port, l.PID, port))
		}
	}
	for _, pfx := range spec.Deny {
		if pfx.Bits() == 0 && len(spec.Allow) == 0 {
			out = append(out, fmt.Sprintf("deny %s drops every source of its family and nothing is allowed: ssh and every other service are unreachable; allow your addresses, or add them to management.sources", pfx))
		}
	}
	return out
}
