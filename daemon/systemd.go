//go:build linux

package daemon

import (
	"net"
	"os"
	"strconv"
	"time"
)

// watchdog pings systemd's watchdog (WATCHDOG=1) at half the interval
// systemd asked for in WATCHDOG_USEC, when it asked.
type watchdog struct {
	notify func(string)
	every  time.Duration
	last   time.Time
}

func newWatchdog(notify func(string)) watchdog {
	usec, err := strconv.ParseInt(os.Getenv("WATCHDOG_USEC"), 10, 64)
	if err != nil || usec <= 0 {
		return watchdog{}
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return watchdog{}
	}
	return watchdog{notify: notify, every: time.Duration(usec) * time.Microsecond / 2}
}

func (w *watchdog) ping(now time.Time) {
	if w.every == 0 || now.Sub(w.last) < w.every {
		return
	}
	w.last = now
	w.notify("WATCHDOG=1")
}

// sdNotify sends a state line to systemd when it started us with
// Type=notify; elsewhere it does nothing.
func sdNotify(state string) {
	sock := os.Getenv("NOTIFY_SOCKET")
	if sock == "" {
		return
	}
	if sock[0] == '@' {
		sock = "\x00" + sock[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		return
	}
	defer conn.Close()
	_, _ = conn.Write([]byte(state))
}
