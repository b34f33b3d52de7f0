//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// benchLine is one result line of `go test -bench`.
type benchLine struct {
	name    string             // sub-benchmark, without "BenchmarkXDP/" and the -N suffix
	metrics map[string]float64 // unit -> value
	units   []string           // in output order
}

var benchSuffix = regexp.MustCompile(`-\d+$`)

// runMapsBench runs the per-packet benchmarks of maps/ (BPF_PROG_TEST_RUN)
// count times and returns the raw output and the parsed lines.
func runMapsBench(ctx context.Context, count int) (string, []benchLine, error) {
	args := []string{"test", "-run", "^$", "-bench", ".", "-benchtime", "2000000x",
		"-count", strconv.Itoa(count), "./maps/"}
	out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput()
	if err != nil {
		return string(out), nil, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), parseBench(out, "BenchmarkXDP/"), nil
}

// parseBench parses the result lines of `go test -bench` output, each
// name without the -N suffix and without trim.
func parseBench(out []byte, trim string) []benchLine {
	var lines []benchLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 || !strings.HasPrefix(fs[0], "Benchmark") {
			continue
		}
		name := benchSuffix.ReplaceAllString(fs[0], "")
		name = strings.TrimPrefix(name, trim)
		bl := benchLine{name: name, metrics: map[string]float64{}}
		for i := 2; i+1 < len(fs); i += 2 {
			v, err := strconv.ParseFloat(fs[i], 64)
			if err != nil {
				continue
			}
			bl.metrics[fs[i+1]] = v
			bl.units = append(bl.units, fs[i+1])
		}
		lines = append(lines, bl)
	}
	return lines
}

// fakeClockCase is one case of maps' accuracy tests.
type fakeClockCase struct {
	test, name string
	log        string // the test's own line
	pass       bool
}

// runFakeClockAccuracy runs maps.TestAccuracy and TestAccuracyHighRates
// (the real program under BPF_PROG_TEST_RUN with a fake clock) and returns
// each case's log line.
func runFakeClockAccuracy(ctx context.Context) ([]fakeClockCase, error) {
	args := []string{"test", "-count=1", "-json", "-run", "^(TestAccuracy|TestAccuracyHighRates)$", "./maps/"}
	out, err := exec.CommandContext(ctx, "go", args...).Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	byTest := map[string]*fakeClockCase{}
	var order []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev struct {
			Action, Test, Output string
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || !strings.Contains(ev.Test, "/") {
			continue
		}
		c := byTest[ev.Test]
		if c == nil {
			top, sub, _ := strings.Cut(ev.Test, "/")
			c = &fakeClockCase{test: top, name: strings.ReplaceAll(sub, "_", " ")}
			byTest[ev.Test] = c
			order = append(order, ev.Test)
		}
		switch ev.Action {
		case "pass":
			c.pass = true
		case "output":
			if _, rest, ok := strings.Cut(ev.Output, "accuracy_test.go:"); ok {
				if _, msg, ok := strings.Cut(rest, ": "); ok {
					c.log = strings.TrimSpace(msg)
				}
			}
		}
	}
	var cases []fakeClockCase
	for _, t := range order {
		cases = append(cases, *byTest[t])
	}
	return cases, nil
}
