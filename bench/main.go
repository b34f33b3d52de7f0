//go:build linux

// Command bench measures xlimit against the alternatives and prints a
// markdown report, also written to bench/results/<date>-<host>.md. It needs
// root and Linux ≥ 5.18, and takes about eight minutes on two CPUs:
//
//	go run ./bench            # or: make bench
//
// What it measures, all in one run:
//
//  1. Per-packet cost of the XDP program with BPF_PROG_TEST_RUN: it runs
//     maps' BenchmarkXDP (go test -bench) and tabulates it.
//  2. A live flood on a two-queue veth pair between two namespaces of its
//     own: the generator is an XDP program run by BPF_PROG_TEST_RUN in
//     live-frames mode on a thread pinned to each CPU (bench/gen), which
//     redirects its frames out of the client veth. The same generator feeds
//     each receiver in turn: XDP_DROP (reference), no filter, xlimit (the
//     real `xlimit run`), nftables limit and meter at netdev ingress,
//     iptables-nft hashlimit. Flat out and at fixed offered rates, and with
//     random sources against the per-source limiters; and the flood on one
//     queue up to every queue of the veth (XDP_DROP and xlimit).
//  3. Rate accuracy: maps' fake-clock accuracy tests, and admitted versus
//     configured on live traffic for xlimit and nftables limit; and the
//     effect of the burst and of the CPU count on hashlimit.
//  4. Control: tests/' benchmarks (go test -bench), the adaptive scenario
//     of docs/design.md §7 and the paced queue; their tables go into the
//     report.
//
// The report names the commit measured and refuses a tree that differs
// from it (-allow-dirty measures it anyway and says so at the top), and
// states the machine's facts (HZ, IRQ time accounting, ring overflows,
// whether the generator kept up) as read or measured in the run.
//
// Every live measurement is repeated (-reps, default 3) and reported as
// median (min–max). Nothing here asserts a speed.
//
// The run creates two network namespaces, a veth pair in them, a private
// bpffs mount and a temporary directory, and removes all of it at the end,
// on error and on SIGINT/SIGTERM. Traffic flows only between the two veth
// ends; rules are added only in the run's own server namespace.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/xlimit/xlimit/bench/gen"

	"golang.org/x/sys/unix"
)

func init() {
	// A child process's Pdeathsig fires when the thread that started it
	// exits: keep the main goroutine (which starts the daemons) on the main
	// thread, which lives as long as the process.
	runtime.LockOSThread()
}

// config is the run's shape, from the flags.
type config struct {
	reps        int
	rate        float64   // the comparison's limit, packets/s
	levels      []float64 // fixed offered rates, besides flat out
	accRates    []float64 // live accuracy rates
	srcRate     float64   // per-source limit with random sources
	warm        time.Duration
	levelWarm   time.Duration
	window      time.Duration
	levelWindow time.Duration
	accDuration time.Duration
	mapsCount   int
	outDir      string
	queuesFile  string
	skipMaps    bool
	skipFake    bool
	skipTests   bool   // tests/' benchmarks (adaptive scenario, paced queue)
	testsBench  string // their -bench pattern
	allowDirty  bool
	ab          string
	abRandom    bool // -ab with random sources against a per-source limit
}

func main() {
	var c config
	flag.IntVar(&c.reps, "reps", 3, "repetitions of every live measurement")
	flag.Float64Var(&c.rate, "rate", 10000, "limit of the live comparison, packets/s")
	flag.Float64Var(&c.srcRate, "source-rate", 1, "per-source limit with random sources, packets/s")
	flag.DurationVar(&c.warm, "warm", time.Second, "flood before each flat-out measurement window")
	flag.DurationVar(&c.levelWarm, "level-warm", 500*time.Millisecond, "flood before each window at a fixed offered rate")
	flag.DurationVar(&c.window, "window", 2*time.Second, "measurement window, flat out")
	flag.DurationVar(&c.levelWindow, "level-window", 1200*time.Millisecond, "measurement window at a fixed offered rate")
	flag.DurationVar(&c.accDuration, "accuracy-flood", 3*time.Second, "flood of each live accuracy run")
	flag.IntVar(&c.mapsCount, "maps-count", 3, "go test -count for maps' BPF_PROG_TEST_RUN benchmarks")
	flag.StringVar(&c.outDir, "out", "bench/results", "directory for the report")
	flag.StringVar(&c.queuesFile, "queues", "bench/results/queues.txt", "output of loader's BenchmarkQueues (make bench runs it first) for the report's every-queue targets")
	flag.BoolVar(&c.skipMaps, "skip-maps-bench", false, "skip maps' BPF_PROG_TEST_RUN benchmarks")
	flag.BoolVar(&c.skipFake, "skip-fake-clock", false, "skip maps' fake-clock accuracy tests")
	flag.BoolVar(&c.skipTests, "skip-tests-bench", false, "skip tests/' benchmarks (adaptive scenario, paced queue)")
	flag.StringVar(&c.testsBench, "tests-bench", "AdaptiveScenario|PacedQueue|SynCookies", "-bench pattern of tests/' benchmarks")
	flag.BoolVar(&c.allowDirty, "allow-dirty", false, "measure a tree that differs from its commit (the report says so at the top)")
	flag.StringVar(&c.ab, "ab", "", "comma-separated xlimit binaries: measure only XDP_DROP and each of them flat out, rotated, and print the table (no report)")
	flag.BoolVar(&c.abRandom, "ab-random", false, "with -ab: the random-source flood against a per-source limit (-source-rate) instead of one source")
	quick := flag.Bool("quick", false, "one repetition, short windows (a smoke test; not for publishing)")
	flag.Parse()
	c.levels = []float64{250e3, 1e6, 4e6}
	c.accRates = []float64{1e3, 1e4, 1e5, 1e6}
	if *quick {
		c.reps, c.mapsCount = 1, 1
		c.window, c.levelWindow, c.warm, c.levelWarm, c.accDuration = time.Second, 700*time.Millisecond, 500*time.Millisecond, 300*time.Millisecond, 1500*time.Millisecond
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}

func preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: creates namespaces, attaches XDP, runs BPF_PROG_TEST_RUN")
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return err
	}
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	if major < 5 || major == 5 && minor < 18 {
		return fmt.Errorf("kernel %d.%d: live-frames BPF_PROG_TEST_RUN needs 5.18 or later", major, minor)
	}
	for _, t := range []string{"nsenter", "go"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%s not found", t)
		}
	}
	return nil
}

// moduleRoot is the directory of go.mod: go test and go build run there.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the xlimit module: run from the checkout")
	}
	return filepath.Dir(mod), nil
}

func run(ctx context.Context, c config) (err error) {
	if err := preflight(); err != nil {
		return err
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return err
	}
	// Without live frames the floods cannot run (docs/design.md §7): -ab
	// is only floods; the report has everything else, and says so.
	liveErr := gen.LiveFrames()
	if liveErr != nil {
		liveErr = fmt.Errorf("the floods' generator cannot run on this kernel: %w", liveErr)
	}
	if c.ab != "" {
		if liveErr != nil {
			return liveErr
		}
		e, err := newEnv(os.Getenv("XLIMIT_BIN"))
		if err != nil {
			return err
		}
		err = abFlat(ctx, e, c, splitBins(c.ab), os.Stdout)
		return errors.Join(err, e.close())
	}
	src, err := treeSource(c.outDir)
	if err != nil {
		return err
	}
	if len(src.dirty) > 0 && !c.allowDirty {
		return fmt.Errorf("the tree differs from commit %s (-allow-dirty to measure it anyway, marked in the report):\n%s",
			src.commit, strings.Join(src.dirty, "\n"))
	}
	res := newResults(c)
	res.src = src
	res.kcfg = readKernelConfig()
	if out, err := os.ReadFile(c.queuesFile); err != nil {
		res.queuesErr = fmt.Errorf("read BenchmarkQueues' output: %w", err)
	} else if res.queues = parseBench(out, "BenchmarkQueues/"); len(res.queues) == 0 {
		res.queuesErr = fmt.Errorf("read BenchmarkQueues' output: no result in %s", c.queuesFile)
	}

	// 1. Per-packet cost, and 3a. fake-clock accuracy: before the live
	// part, so that nothing of ours runs at the same time.
	if !c.skipMaps {
		progress("per-packet cost: go test -bench ./maps/ (count %d)", c.mapsCount)
		res.mapsRaw, res.mapsLines, res.mapsErr = runMapsBench(ctx, c.mapsCount)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if !c.skipFake {
		progress("rate accuracy, fake clock: go test -run TestAccuracy ./maps/")
		res.fake, res.fakeErr = runFakeClockAccuracy(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	var e *env
	defer func() {
		if e == nil {
			return
		}
		if cerr := e.close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
	}()
	if res.liveErr = liveErr; liveErr != nil {
		progress("live: not run: %v", liveErr)
		for c := range runtime.NumCPU() {
			res.cpus = append(res.cpus, c)
		}
		res.lab = "no live lab (" + liveErr.Error() + ")"
	} else {
		progress("live: setting up the lab")
		if e, err = newEnv(os.Getenv("XLIMIT_BIN")); err != nil {
			return err
		}
		res.cpus = e.cpus
		res.lab = fmt.Sprintf("veth %s/%s, %d queues each; generator on CPUs %v", e.lab.ClientIf, e.lab.ServerIf, len(e.cpus), e.cpus)
		if err := res.live(ctx, e); err != nil {
			return err
		}
	}
	// 4. tests/' benchmarks, with the live lab gone: they make their own.
	if !c.skipTests {
		if e != nil {
			if cerr := e.close(); cerr != nil {
				return fmt.Errorf("cleanup: %w", cerr)
			}
			e = nil
		}
		progress("control: go test -bench '%s' ./tests/", c.testsBench)
		res.testsRaw, res.tests, res.testsErr = runTestsBench(ctx, os.Getenv("XLIMIT_BIN"), c.testsBench)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	res.finish()

	report := res.markdown()
	fmt.Print(report)
	if err := os.MkdirAll(c.outDir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(c.outDir, fmt.Sprintf("%s-%s.md", res.start.Format("2006-01-02"), res.host))
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		return err
	}
	progress("report written to %s (%v)", path, res.end.Sub(res.start).Round(time.Second))
	return nil
}
