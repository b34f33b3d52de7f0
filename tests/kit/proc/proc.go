// Package proc reads what the benchmarks and the live tests need of
// /proc about the kernel's threads: which are named so (NAPI threads,
// ksoftirqd), and how long each ran (schedstat).
package proc

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Named returns the pids of the tasks whose name (comm: at most 15
// characters, so a longer prefix is cut to that) starts with prefix.
// None is an error.
func Named(prefix string) ([]int, error) {
	if len(prefix) > 15 {
		prefix = prefix[:15]
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue // gone meanwhile
		}
		if strings.HasPrefix(strings.TrimSpace(string(comm)), prefix) {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("find tasks named %s*: none", prefix)
	}
	return pids, nil
}

// RunTime is the CPU time of pid and the number of times it ran (the
// first and third fields of /proc/PID/schedstat).
func RunTime(pid int) (time.Duration, uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("read schedstat of %d: %w", pid, err)
	}
	return parseSchedstat(b)
}

func parseSchedstat(b []byte) (time.Duration, uint64, error) {
	fs := strings.Fields(string(b))
	if len(fs) != 3 {
		return 0, 0, fmt.Errorf("parse schedstat %q: %d fields, want 3", b, len(fs))
	}
	ns, err := strconv.ParseUint(fs[0], 10, 63)
	if err != nil {
		return 0, 0, fmt.Errorf("parse schedstat %q: %w", b, err)
	}
	runs, err := strconv.ParseUint(fs[2], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("parse schedstat %q: %w", b, err)
	}
	return time.Duration(ns), runs, nil
}

// RunTimes sums RunTime over pids.
func RunTimes(pids []int) (time.Duration, uint64, error) {
	var sum time.Duration
	var runs uint64
	for _, pid := range pids {
		d, n, err := RunTime(pid)
		if err != nil {
			return 0, 0, err
		}
		sum += d
		runs += n
	}
	return sum, runs, nil
}
