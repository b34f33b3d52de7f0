//go:build linux

package signal

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// NetStat reads the [NetCounters] of one network namespace from
// /proc/thread-self/net/netstat and /proc/thread-self/net/snmp, opened once
// and re-read from offset 0 at every Read. A /proc net file is bound to the
// namespace of the task its path names when it is opened, and keeps showing
// that namespace's counters afterwards, whichever thread reads it, even
// once the opening thread has left the namespace or exited. A NetStat is
// safe for concurrent use.
type NetStat struct {
	mu      sync.Mutex
	netstat *os.File
	snmp    *os.File
	buf     []byte
	closed  bool
}

// netDir is where OpenNetStat finds the files; the calling thread's view of
// /proc/net.
const netDir = "/proc/thread-self/net"

// OpenNetStat opens the counter files of the calling thread's network
// namespace. The daemon calls it once at startup; to read another namespace,
// call it from a goroutine locked to a thread switched into that namespace
// (lab.NS.Do) and use the NetStat from anywhere afterwards. /proc/net and
// /proc/self/net would not do: they show the namespace of the process's
// main thread.
func OpenNetStat() (*NetStat, error) {
	ns, err := os.Open(netDir + "/netstat")
	if err != nil {
		return nil, fmt.Errorf("open netstat: %w", err)
	}
	snmp, err := os.Open(netDir + "/snmp")
	if err != nil {
		_ = ns.Close()
		return nil, fmt.Errorf("open snmp: %w", err)
	}
	n := &NetStat{netstat: ns, snmp: snmp, buf: make([]byte, 16<<10)}
	if _, err := n.Read(); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	return n, nil
}

// Read returns the current counters.
func (n *NetStat) Read() (NetCounters, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return NetCounters{}, errors.New("read net counters: reader closed")
	}
	netstat, err := n.readAll(n.netstat, 0)
	if err != nil {
		return NetCounters{}, fmt.Errorf("read netstat: %w", err)
	}
	snmp, err := n.readAll(n.snmp, len(netstat))
	if err != nil {
		return NetCounters{}, fmt.Errorf("read snmp: %w", err)
	}
	c, err := ParseNetCounters(netstat, snmp)
	if err != nil {
		return NetCounters{}, fmt.Errorf("read net counters: %w", err)
	}
	return c, nil
}

// readAll reads f from offset 0 into n.buf[start:], growing n.buf as needed
// (keeping n.buf[:start]), and returns the bytes read.
func (n *NetStat) readAll(f *os.File, start int) ([]byte, error) {
	end := start
	for {
		if end == len(n.buf) {
			n.buf = append(n.buf, make([]byte, len(n.buf))...)
		}
		k, err := f.ReadAt(n.buf[end:], int64(end-start))
		end += k
		if errors.Is(err, io.EOF) {
			return n.buf[start:end], nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// Close closes the files. It is idempotent.
func (n *NetStat) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	return errors.Join(n.netstat.Close(), n.snmp.Close())
}
