package signal

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// NetCounters are cumulative kernel counters of one network namespace, from
// /proc/net/netstat (TcpExt) and /proc/net/snmp (Tcp, Udp).
type NetCounters struct {
	// ListenOverflows counts handshakes dropped because a listener's accept
	// queue was full (TcpExt ListenOverflows): SYNs and final ACKs refused.
	ListenOverflows uint64
	// ListenDrops counts every drop at a listener (TcpExt ListenDrops),
	// overflows included.
	ListenDrops uint64
	// PassiveOpens counts connections established from a listener (Tcp
	// PassiveOpens): the namespace's accept-queue arrivals, the λ of
	// Little's law when a single service listens.
	PassiveOpens uint64
	// OutRsts counts TCP segments sent with RST (Tcp OutRsts).
	OutRsts uint64
	// UDPRcvbufErrors counts UDP datagrams dropped because a socket's
	// receive buffer was full (Udp RcvbufErrors).
	UDPRcvbufErrors uint64
	// UDPInDatagrams counts UDP datagrams delivered to applications (Udp
	// InDatagrams; since Linux 4.10 counted when recvmsg() dequeues them,
	// so its increase is what the namespace's UDP services read).
	UDPInDatagrams uint64
}

// Sub returns the increase of every counter since prev. ok is false when a
// counter went backwards (the namespace or the reader was replaced, or the
// counters were reset); the difference is then meaningless and zero.
func (c NetCounters) Sub(prev NetCounters) (d NetCounters, ok bool) {
	sub := func(a, b uint64) uint64 {
		if a < b {
			ok = false
			return 0
		}
		return a - b
	}
	ok = true
	d = NetCounters{
		ListenOverflows: sub(c.ListenOverflows, prev.ListenOverflows),
		ListenDrops:     sub(c.ListenDrops, prev.ListenDrops),
		PassiveOpens:    sub(c.PassiveOpens, prev.PassiveOpens),
		OutRsts:         sub(c.OutRsts, prev.OutRsts),
		UDPRcvbufErrors: sub(c.UDPRcvbufErrors, prev.UDPRcvbufErrors),
		UDPInDatagrams:  sub(c.UDPInDatagrams, prev.UDPInDatagrams),
	}
	if !ok {
		return NetCounters{}, false
	}
	return d, true
}

// counter is one counter of a /proc/net/{netstat,snmp} table to fill.
type counter struct {
	section, name string
	dst           *uint64
	found         bool
}

// ParseNetCounters parses the contents of /proc/net/netstat and
// /proc/net/snmp. Both files are pairs of lines, a header and the values:
//
//	TcpExt: SyncookiesSent ... ListenOverflows ListenDrops ...
//	TcpExt: 0 ... 12 12 ...
//
// Counters are found by name, so columns a kernel adds, removes or reorders
// and sections it adds are harmless; a counter this package needs that is
// missing, or a header and value line of different lengths in a section it
// reads, is an error. Values are parsed as uint64 (the kernel's counters
// are unsigned long), not through float64.
//
// github.com/prometheus/procfs parses these files too (Proc.Netstat,
// Proc.Snmp), but only by path under /proc/<pid>, which follows a task's
// namespace at every read and cannot re-read a file opened in another
// namespace (see OpenNetStat), and as float64.
func ParseNetCounters(netstat, snmp []byte) (NetCounters, error) {
	var c NetCounters
	if err := parseCounterTable(netstat, []counter{
		{section: "TcpExt", name: "ListenOverflows", dst: &c.ListenOverflows},
		{section: "TcpExt", name: "ListenDrops", dst: &c.ListenDrops},
	}); err != nil {
		return NetCounters{}, fmt.Errorf("parse netstat: %w", err)
	}
	if err := parseCounterTable(snmp, []counter{
		{section: "Tcp", name: "PassiveOpens", dst: &c.PassiveOpens},
		{section: "Tcp", name: "OutRsts", dst: &c.OutRsts},
		{section: "Udp", name: "RcvbufErrors", dst: &c.UDPRcvbufErrors},
		{section: "Udp", name: "InDatagrams", dst: &c.UDPInDatagrams},
	}); err != nil {
		return NetCounters{}, fmt.Errorf("parse snmp: %w", err)
	}
	return c, nil
}

// parseCounterTable fills want from a header/value table: a line whose
// section (the text before the first ':') equals that of the line before it
// holds the values for that line's names.
func parseCounterTable(data []byte, want []counter) error {
	var header, headerSection []byte
	for line := range bytes.Lines(data) {
		sec, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			header = nil // a blank or foreign line ends any pending header
			continue
		}
		if header == nil || !bytes.Equal(sec, headerSection) {
			header, headerSection = rest, sec
			continue
		}
		names, values := header, rest
		header = nil
		if !slices.ContainsFunc(want, func(c counter) bool { return c.section == string(sec) }) {
			continue
		}
		count := 0
		for {
			var name, value []byte
			name, names = nextField(names)
			value, values = nextField(values)
			if name == nil || value == nil {
				if name != nil {
					return fmt.Errorf("section %s: more names than values (%d values)", sec, count)
				}
				if value != nil {
					return fmt.Errorf("section %s: more values than names (%d names)", sec, count)
				}
				break
			}
			count++
			for i := range want {
				c := &want[i]
				if c.name != string(name) || c.section != string(sec) {
					continue
				}
				v, err := strconv.ParseUint(string(value), 10, 64)
				if err != nil {
					return fmt.Errorf("section %s: counter %s: %w", sec, name, err)
				}
				*c.dst, c.found = v, true
			}
		}
	}
	var missing []string
	for _, c := range want {
		if !c.found {
			missing = append(missing, c.section+" "+c.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("counters missing: %s", strings.Join(missing, ", "))
	}
	return nil
}

// nextField splits the first blank-separated field off b; it returns nil
// when b holds no more fields.
func nextField(b []byte) (field, rest []byte) {
	start := 0
	for start < len(b) && isBlank(b[start]) {
		start++
	}
	if start == len(b) {
		return nil, nil
	}
	end := start
	for end < len(b) && !isBlank(b[end]) {
		end++
	}
	return b[start:end], b[end:]
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
