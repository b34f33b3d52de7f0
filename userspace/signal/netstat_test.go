package signal

import (
	"os"
	"strings"
	"testing"
)

func TestParseNetCountersKernel618(t *testing.T) {
	netstat, err := os.ReadFile("testdata/netstat-6.18.txt")
	if err != nil {
		t.Fatal(err)
	}
	snmp, err := os.ReadFile("testdata/snmp-6.18.txt")
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseNetCounters(netstat, snmp)
	want := NetCounters{ListenOverflows: 17, ListenDrops: 23, PassiveOpens: 4242, OutRsts: 99, UDPRcvbufErrors: 1<<64 - 1, UDPInDatagrams: 66}
	if err != nil || c != want {
		t.Errorf("ParseNetCounters = %+v, %v; want %+v", c, err, want)
	}
}

// An old kernel: fewer columns, no MPTcpExt, no UDP IgnoredMulti.
const oldNetstat = `TcpExt: SyncookiesSent SyncookiesRecv SyncookiesFailed EmbryonicRsts PruneCalled RcvPruned OfoPruned OutOfWindowIcmps LockDroppedIcmps ArpFilter TW TWRecycled TWKilled PAWSPassive PAWSActive PAWSEstab DelayedACKs DelayedACKLocked DelayedACKLost ListenOverflows ListenDrops TCPPrequeued
TcpExt: 0 0 0 1 0 0 0 0 0 0 12 0 0 0 0 0 30 0 1 5 6 0
IpExt: InNoRoutes InTruncatedPkts InMcastPkts OutMcastPkts InBcastPkts OutBcastPkts
IpExt: 0 0 0 0 0 0
`

const oldSnmp = `Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 100
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts
Tcp: 1 200 120000 -1 10 20 0 0 1 300 300 0 0 7
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors
Udp: 5 0 3 5 3 0
`

// A future kernel: new columns before and between the ones read, columns
// reordered, a new section, trailing blanks and CRLF line ends.
const newNetstat = "TcpExt: NewFirst ListenDrops Other ListenOverflows SyncookiesSent  \r\n" +
	"TcpExt: 1 900 x 800 0  \r\n" +
	"FancyExt: A B C\n" +
	"FancyExt: 1 2\n" + // malformed, but not a section that is read
	"MPTcpExt: MPCapableSYNRX\n" +
	"MPTcpExt: 0\n"

const newSnmp = "Tcp: OutRsts Zeta PassiveOpens MaxConn\n" +
	"Tcp: 11 12 13 -1\n" +
	"Udp: RcvbufErrors MemErrors Brand New InDatagrams\n" +
	"Udp: 14 0 1 2 15\n" +
	"Sctp: X\n" +
	"Sctp: 1\n"

func TestParseNetCountersVariants(t *testing.T) {
	for _, tc := range []struct {
		name, netstat, snmp string
		want                NetCounters
	}{
		{"old", oldNetstat, oldSnmp, NetCounters{ListenOverflows: 5, ListenDrops: 6, PassiveOpens: 20, OutRsts: 7, UDPRcvbufErrors: 3, UDPInDatagrams: 5}},
		{"new", newNetstat, newSnmp, NetCounters{ListenOverflows: 800, ListenDrops: 900, PassiveOpens: 13, OutRsts: 11, UDPRcvbufErrors: 14, UDPInDatagrams: 15}},
	} {
		c, err := ParseNetCounters([]byte(tc.netstat), []byte(tc.snmp))
		if err != nil || c != tc.want {
			t.Errorf("%s: ParseNetCounters = %+v, %v; want %+v", tc.name, c, err, tc.want)
		}
	}
}

func TestParseNetCountersErrors(t *testing.T) {
	for _, tc := range []struct {
		name, netstat, snmp, wantErr string
	}{
		{"missing counter", "TcpExt: ListenOverflows\nTcpExt: 1\n", oldSnmp, "counters missing: TcpExt ListenDrops"},
		{"missing section", "IpExt: A\nIpExt: 1\n", oldSnmp, "counters missing: TcpExt ListenOverflows, TcpExt ListenDrops"},
		{"truncated", "TcpExt: ListenOverflows ListenDrops\n", oldSnmp, "counters missing"},
		{"empty", "", oldSnmp, "counters missing"},
		{"length mismatch", "TcpExt: ListenOverflows ListenDrops\nTcpExt: 1\n", oldSnmp, "section TcpExt: more names than values (1 values)"},
		{"more values", "TcpExt: ListenOverflows ListenDrops\nTcpExt: 1 2 3\n", oldSnmp, "section TcpExt: more values than names (2 names)"},
		{"bad value", "TcpExt: ListenOverflows ListenDrops\nTcpExt: 1 -2\n", oldSnmp, "counter ListenDrops"},
		{"header twice", "TcpExt: ListenOverflows ListenDrops\nIpExt: A\nTcpExt: 1 2\n", oldSnmp, "counters missing"},
		{"snmp", oldNetstat, "Tcp: PassiveOpens OutRsts\nTcp: 1 2\n", "parse snmp: counters missing: Udp RcvbufErrors"},
	} {
		_, err := ParseNetCounters([]byte(tc.netstat), []byte(tc.snmp))
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.wantErr)
		}
	}
}

func TestNetCountersSub(t *testing.T) {
	a := NetCounters{ListenOverflows: 10, ListenDrops: 12, PassiveOpens: 100, OutRsts: 3, UDPRcvbufErrors: 1}
	b := NetCounters{ListenOverflows: 15, ListenDrops: 18, PassiveOpens: 160, OutRsts: 3, UDPRcvbufErrors: 4}
	d, ok := b.Sub(a)
	if want := (NetCounters{5, 6, 60, 0, 3, 0}); !ok || d != want {
		t.Errorf("Sub = %+v, %v; want %+v", d, ok, want)
	}
	if d, ok := a.Sub(b); ok || d != (NetCounters{}) {
		t.Errorf("Sub backwards = %+v, %v; want zero, false", d, ok)
	}
}
