//go:build linux

package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// source is the commit the run measured and whether the tree differed
// from it.
type source struct {
	commit string   // full hash of HEAD
	dirty  []string // `git status --porcelain` lines, results directory excluded
}

// treeSource reads HEAD and the tree's state. Reports under outDir do not
// make a tree dirty: the run writes one there.
func treeSource(outDir string) (source, error) {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return source{}, fmt.Errorf("git rev-parse HEAD: %w", err)
	}
	s := source{commit: strings.TrimSpace(string(out))}
	out, err = exec.Command("git", "status", "--porcelain", "--untracked-files=normal").Output()
	if err != nil {
		return source{}, fmt.Errorf("git status: %w", err)
	}
	prefix := strings.TrimSuffix(outDir, "/") + "/"
	for line := range strings.Lines(string(out)) {
		line = strings.TrimRight(line, "\n")
		if len(line) < 4 || strings.HasPrefix(line[3:], prefix) {
			continue
		}
		s.dirty = append(s.dirty, line)
	}
	return s, nil
}

// kernelConfig is what the report states about the running kernel, read
// at run time.
type kernelConfig struct {
	from    string // the file it was read from; empty when none was found
	hz      int    // CONFIG_HZ; 0 when unknown
	irqTime string // CONFIG_IRQ_TIME_ACCOUNTING: "y", or "" when not set
	err     error
}

// readKernelConfig reads /boot/config-$(uname -r), or /proc/config.gz.
func readKernelConfig() kernelConfig {
	var u unix.Utsname
	_ = unix.Uname(&u)
	release := unix.ByteSliceToString(u.Release[:])
	var kc kernelConfig
	var text []byte
	var errs []error
	if b, err := os.ReadFile("/boot/config-" + release); err == nil {
		text, kc.from = b, "/boot/config-"+release
	} else {
		errs = append(errs, err)
		f, err := os.Open("/proc/config.gz")
		if err == nil {
			defer f.Close()
			zr, zerr := gzip.NewReader(f)
			if zerr == nil {
				text, err = io.ReadAll(zr)
			} else {
				err = zerr
			}
			if err == nil {
				kc.from = "/proc/config.gz"
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if kc.from == "" {
		kc.err = errors.Join(errs...)
		return kc
	}
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		switch k {
		case "CONFIG_HZ":
			kc.hz, _ = strconv.Atoi(v)
		case "CONFIG_IRQ_TIME_ACCOUNTING":
			kc.irqTime = v
		}
	}
	return kc
}

// hzText is the tick rate as the report states it.
func (kc kernelConfig) hzText() string {
	if kc.hz == 0 {
		return fmt.Sprintf("HZ unknown (no kernel config readable: %v)", kc.err)
	}
	return fmt.Sprintf("HZ=%d, from %s", kc.hz, kc.from)
}

// goBench is one benchmark of tests/ run by `go test -bench`: what it
// printed (its tables) and its result line.
type goBench struct {
	name   string
	output string // what it printed (its tables)
	logs   string // its log lines (b.Log), indented by go test
	result string
}

// runTestsBench runs tests/' benchmarks (the adaptive scenario and the
// paced queue) with the daemon binary xlimitBin and splits their output by
// benchmark.
func runTestsBench(ctx context.Context, xlimitBin, pattern string) (raw string, benches []goBench, err error) {
	args := []string{"test", "-v", "-run", "^$", "-bench", pattern, "-benchtime", "1x", "-timeout", "20m", "./tests/"}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), "XLIMIT_BIN="+xlimitBin)
	out, err := cmd.CombinedOutput()
	raw = string(out)
	if err != nil {
		return raw, nil, fmt.Errorf("go %s: %v", strings.Join(args, " "), err)
	}
	// With -v: "BenchmarkX" alone, what it prints and logs, then
	// "BenchmarkX-N  1  123 ns/op  4.5 unit".
	var pending, logs strings.Builder
	for line := range strings.Lines(raw) {
		fs := strings.Fields(line)
		switch {
		case len(fs) >= 3 && strings.HasPrefix(fs[0], "Benchmark"):
			benches = append(benches, goBench{name: benchSuffix.ReplaceAllString(fs[0], ""),
				output: pending.String(), logs: logs.String(), result: strings.TrimSpace(line)})
			pending.Reset()
			logs.Reset()
		case len(fs) == 1 && strings.HasPrefix(fs[0], "Benchmark"):
		case len(fs) > 0 && (fs[0] == "goos:" || fs[0] == "goarch:" || fs[0] == "pkg:" || fs[0] == "cpu:" || fs[0] == "PASS" || fs[0] == "ok"):
		case strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "==="):
			logs.WriteString(line)
		default:
			pending.WriteString(line)
		}
	}
	if len(benches) == 0 {
		return raw, nil, fmt.Errorf("go %s: no benchmark result in its output", strings.Join(args, " "))
	}
	return raw, benches, nil
}
