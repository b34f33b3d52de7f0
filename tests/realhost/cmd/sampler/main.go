// Command sampler counts the UDP datagrams that reach a socket, per window
// of the kernel's receive timestamp (SO_TIMESTAMPNS), so that a reader
// descheduled for a while (an emulated guest) does not move packets from
// one window into the next. It prints one line per window, "MS COUNT" (MS:
// the window's start in milliseconds of CLOCK_REALTIME), after -duration,
// then "rcvbuf_errors N" (datagrams the socket had no room for).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	port := flag.Int("port", 9000, "UDP port")
	interval := flag.Duration("interval", 100*time.Millisecond, "window")
	dur := flag.Duration("duration", 10*time.Second, "how long to count")
	flag.Parse()
	if err := run(*port, *interval, *dur); err != nil {
		slog.Error("sampler", "err", err)
		os.Exit(1)
	}
}

func run(port int, interval, dur time.Duration) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return fmt.Errorf("open socket: %w", err)
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		return fmt.Errorf("set SO_TIMESTAMPNS: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
		return fmt.Errorf("bind port %d: %w", port, err)
	}
	tv := unix.NsecToTimeval(int64(200 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("set SO_RCVTIMEO: %w", err)
	}
	errs0 := rcvbufErrors()
	counts := map[int64]int{}
	w := interval.Nanoseconds()
	buf := make([]byte, 2048)
	oob := make([]byte, 256)
	end := time.Now().Add(dur)
	for time.Now().Before(end) {
		_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
		if err != nil {
			continue // timeout: look at the clock again
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) == 0 {
			continue
		}
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= 16 {
				ts := *(*unix.Timespec)(unsafePointer(m.Data))
				counts[ts.Nano()/w]++
			}
		}
	}
	first, last := int64(1<<62), int64(0)
	for k := range counts {
		first, last = min(first, k), max(last, k)
	}
	out := bufio.NewWriter(os.Stdout)
	for k := first; k <= last; k++ {
		fmt.Fprintf(out, "%d %d\n", k*w/int64(time.Millisecond), counts[k])
	}
	fmt.Fprintf(out, "rcvbuf_errors %d\n", rcvbufErrors()-errs0)
	return out.Flush()
}

// rcvbufErrors is Udp: RcvbufErrors of /proc/net/snmp.
func rcvbufErrors() int {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return -1
	}
	var head []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == "RcvbufErrors" && i < len(f) {
				n, _ := strconv.Atoi(f[i])
				return n
			}
		}
	}
	return -1
}
