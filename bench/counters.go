//go:build linux

package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/tests/kit/proc"
)

// userHZ is the unit of /proc/stat (USER_HZ, 100 on every Linux ABI).
const userHZ = 100

// cpuTimes is one CPU's line of /proc/stat, in USER_HZ ticks.
type cpuTimes struct {
	user, nice, system, idle, iowait, irq, softirq, steal uint64
}

func (c cpuTimes) busy() uint64 {
	return c.user + c.nice + c.system + c.irq + c.softirq + c.steal
}

// readCPUTimes reads the per-CPU lines of /proc/stat.
func readCPUTimes() (map[int]cpuTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[int]cpuTimes{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 9 || !strings.HasPrefix(fs[0], "cpu") || fs[0] == "cpu" {
			continue
		}
		n, err := strconv.Atoi(fs[0][3:])
		if err != nil {
			continue
		}
		var v [8]uint64
		for i := range v {
			if v[i], err = strconv.ParseUint(fs[1+i], 10, 64); err != nil {
				return nil, fmt.Errorf("parse /proc/stat %s: %w", fs[0], err)
			}
		}
		out[n] = cpuTimes{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]}
	}
	return out, sc.Err()
}

// cpuDelta sums, over cpus, the ticks spent between a and b.
func cpuDelta(a, b map[int]cpuTimes, cpus []int) (softirq, busy, total float64) {
	for _, c := range cpus {
		x, y := a[c], b[c]
		softirq += float64(y.softirq - x.softirq)
		busy += float64(y.busy() - x.busy())
		total += float64(y.busy()+y.idle+y.iowait) - float64(x.busy()+x.idle+x.iowait)
	}
	return softirq / userHZ, busy / userHZ, total / userHZ
}

// snmp is the part of /proc/net/snmp the report needs, read inside a
// namespace.
type snmp struct {
	UDPIn, UDPNoPorts, UDPInErrors, UDPRcvbufErrors uint64
	IPInReceives, IPInDelivers, IPInDiscards        uint64
}

// admitted is what reached the UDP layer: delivered to the socket, refused
// by a full socket buffer, or to no socket at all.
func (s snmp) admitted() uint64 { return s.UDPIn + s.UDPInErrors + s.UDPNoPorts }

func (s snmp) sub(o snmp) snmp {
	return snmp{
		s.UDPIn - o.UDPIn, s.UDPNoPorts - o.UDPNoPorts, s.UDPInErrors - o.UDPInErrors, s.UDPRcvbufErrors - o.UDPRcvbufErrors,
		s.IPInReceives - o.IPInReceives, s.IPInDelivers - o.IPInDelivers, s.IPInDiscards - o.IPInDiscards,
	}
}

// readSNMP reads /proc/thread-self/net/snmp from a thread inside ns
// (/proc/net follows the thread group leader's namespace, thread-self the
// thread's).
func readSNMP(ns *lab.NS) (snmp, error) {
	var s snmp
	var data []byte
	err := ns.Do(func() error {
		var err error
		data, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		return s, fmt.Errorf("read snmp in %s: %w", ns.Name, err)
	}
	tables := map[string][2][]string{}
	for _, line := range strings.Split(string(data), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		t := tables[name]
		if t[0] == nil {
			t[0] = strings.Fields(rest)
		} else {
			t[1] = strings.Fields(rest)
		}
		tables[name] = t
	}
	get := func(table, field string) uint64 {
		t := tables[table]
		for i, f := range t[0] {
			if f == field && i < len(t[1]) {
				v, _ := strconv.ParseUint(t[1][i], 10, 64)
				return v
			}
		}
		return 0
	}
	s.UDPIn = get("Udp", "InDatagrams")
	s.UDPNoPorts = get("Udp", "NoPorts")
	s.UDPInErrors = get("Udp", "InErrors")
	s.UDPRcvbufErrors = get("Udp", "RcvbufErrors")
	s.IPInReceives = get("Ip", "InReceives")
	s.IPInDelivers = get("Ip", "InDelivers")
	s.IPInDiscards = get("Ip", "InDiscards")
	return s, nil
}

// linkStats are an interface's counters (netlink stats64).
type linkStats struct {
	RxPackets, RxDropped, TxPackets, TxDropped uint64
}

func (s linkStats) sub(o linkStats) linkStats {
	return linkStats{s.RxPackets - o.RxPackets, s.RxDropped - o.RxDropped, s.TxPackets - o.TxPackets, s.TxDropped - o.TxDropped}
}

// linkReader reads one interface's counters through a netlink handle
// opened inside its namespace.
type linkReader struct {
	h    *netlink.Handle
	name string
}

func newLinkReader(ns *lab.NS, name string) (*linkReader, error) {
	fd, err := netns.GetFromPath(ns.Path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", ns.Path, err)
	}
	defer fd.Close()
	h, err := netlink.NewHandleAt(fd)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", ns.Name, err)
	}
	return &linkReader{h: h, name: name}, nil
}

func (r *linkReader) read() (linkStats, error) {
	l, err := r.h.LinkByName(r.name)
	if err != nil {
		return linkStats{}, fmt.Errorf("read %s: %w", r.name, err)
	}
	st := l.Attrs().Statistics
	if st == nil {
		return linkStats{}, fmt.Errorf("read %s: no statistics", r.name)
	}
	return linkStats{st.RxPackets, st.RxDropped, st.TxPackets, st.TxDropped}, nil
}

func (r *linkReader) close() { r.h.Close() }

// ksoftirqdTime is the CPU time of the ksoftirqd threads, summed
// (/proc/PID/schedstat: ns on the CPU).
func (e *env) ksoftirqdTime() (time.Duration, error) {
	d, _, err := proc.RunTimes(e.ksoftirqd)
	if err != nil {
		return 0, fmt.Errorf("read ksoftirqd's time: %w", err)
	}
	return d, nil
}

// findKsoftirqd returns the pids of the ksoftirqd/N threads.
func findKsoftirqd() ([]int, error) {
	return proc.Named("ksoftirqd/")
}
