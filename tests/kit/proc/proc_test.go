package proc

import (
	"os"
	"testing"
	"time"
)

func TestParseSchedstat(t *testing.T) {
	d, runs, err := parseSchedstat([]byte("123456789 42 17\n"))
	if err != nil || d != 123456789*time.Nanosecond || runs != 17 {
		t.Errorf("parse: %v %d %v, want 123.456789ms 17 nil", d, runs, err)
	}
	for _, bad := range []string{"", "1 2", "x 2 3", "1 2 y", "-1 2 3", "1 2 3 4"} {
		if _, _, err := parseSchedstat([]byte(bad)); err == nil {
			t.Errorf("parse %q: no error", bad)
		}
	}
}

// TestSelf: this process is found by its name and has run.
func TestSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/schedstat"); err != nil {
		t.Skipf("no schedstat here: %v", err)
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	pids, err := Named(string(comm[:len(comm)-1]))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range pids {
		found = found || p == os.Getpid()
	}
	if !found {
		t.Errorf("Named(%q) = %v, without this process %d", comm, pids, os.Getpid())
	}
	d, runs, err := RunTimes([]int{os.Getpid()})
	if err != nil || d <= 0 || runs == 0 {
		t.Errorf("RunTimes(self) = %v, %d, %v: want time and runs", d, runs, err)
	}
	if _, err := Named("no task is named this"); err == nil {
		t.Error("Named of no task: no error")
	}
}
