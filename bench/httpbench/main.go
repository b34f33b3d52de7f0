//go:build linux

// Command httpbench is make bench-http (issue 42): real nginx proxying to a
// real Go app with a bounded pool, loaded by vegeta (open loop) from the
// other end of a veth pair, with nginx's own limit_req and limit_conn beside
// xlimit's variants on the same traffic in the same run, keep-alive on and
// off, at 2× and 10× the app's measured capacity; optionally with a spoofed
// SYN flood running. It writes a markdown report and the raw summaries to
// -out.
//
// The lab: two network namespaces joined by a veth pair (tests/kit/lab).
// The server namespace runs the app (tests/realhost/cmd/app: 4 workers ×
// 10 ms, requests beyond the pool wait inside it), Debian's nginx with a
// configuration written per run (/work unlimited, /lreq limit_req, /lconn
// limit_conn) and, for xlimit's variants, `xlimit run` on the server veth
// (native XDP). The client namespace runs tests/realhost/cmd/load (vegeta
// as a library, its own client: dial timeout, keep-alive pool cap). Each
// cell offers 0.5× the capacity for 5 s, then 2× or 10× for 10 s, then 0.5×
// for 5 s; the report's figures are the requests that left in the
// overload's 10 s.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/tests/kit/xdppass"
)

const (
	appAddr  = "127.0.0.1:8081"
	appWork  = 10 * time.Millisecond
	appPool  = 4
	timeout  = 2 * time.Second // the clients' request and dial timeout
	kaConns  = 512             // the keep-alive client's pool: at most this many connections
	kaIdle   = 64              // idle connections it keeps
	lowShare = 0.5             // the load before and after the overload, × capacity
)

var (
	lowDur  = 5 * time.Second
	highDur = 10 * time.Second
)

// loadSummary is what the load client prints (tests/realhost/cmd/load).
type loadSummary struct {
	Requests int      `json:"requests"`
	Timeout  int      `json:"timeout"`
	Reset    int      `json:"reset"`
	Phases   []*phase `json:"phases"`
}

type phase struct {
	Rate      float64        `json:"rate"`
	DurationS float64        `json:"duration_s"`
	Sent      int            `json:"sent"`
	SentRate  float64        `json:"sent_rate"`
	Success   int            `json:"success"`
	Goodput   float64        `json:"goodput"`
	P50ms     float64        `json:"p50_ms"`
	P99ms     float64        `json:"p99_ms"`
	MaxMs     float64        `json:"max_ms"`
	Reset     int            `json:"reset"`
	E503      int            `json:"status_503"`
	Refused   int            `json:"refused"`
	RefusedMs float64        `json:"refused_p99_ms"`
	Timeout   int            `json:"timeout"`
	Status    map[string]int `json:"status"`
	Other     map[string]int `json:"other"`
}

// variant is one protection of the service.
type variant struct {
	Name string
	Path string                 // nginx's location
	What string                 // one line for the report
	yaml func(c float64) string // xlimit's rules; nil: no xlimit
	file string                 // or a rules file as it ships
}

func xlRule(body string) func(c float64) string {
	return func(c float64) string {
		return "rules:\n  - name: web\n    protocol: tcp\n    ports: [80]\n" + strings.ReplaceAll(body, "CAP", fmt.Sprintf("%.0f", c))
	}
}

func variants(example string) []variant {
	vs := []variant{
		{Name: "unprotected", Path: "/work", What: "nginx → app, nothing in front"},
		{Name: "nginx-limit_req", Path: "/lreq", What: "nginx `limit_req` rate=capacity r/s, burst 20 nodelay, 503"},
		{Name: "nginx-limit_conn", Path: "/lconn", What: "nginx `limit_conn` 8, 503"},
		{Name: "xl-static", Path: "/work", What: "xlimit `syn_only` rate = capacity, burst 20 (refuse: drop)",
			yaml: xlRule("    syn_only: true\n    rate: CAP\n    burst: 20\n")},
		{Name: "xl-adaptive", Path: "/work", What: "xlimit `adaptive` on `response_time`, target 30 ms, rate = capacity, min capacity/10, max 20×",
			yaml: func(c float64) string {
				return xlRule(fmt.Sprintf("    syn_only: true\n    rate: CAP\n    burst: 20\n    behavior: adaptive\n    adaptive: {target_latency: 30ms, min_rate: %.0f, max_rate: %.0f, signal: response_time}\n", c/10, 20*c))(c)
			}},
		{Name: "xl-adaptive-reset", Path: "/work", What: "the same with `refuse: reset`",
			yaml: func(c float64) string {
				return xlRule(fmt.Sprintf("    syn_only: true\n    rate: CAP\n    burst: 20\n    refuse: reset\n    behavior: adaptive\n    adaptive: {target_latency: 30ms, min_rate: %.0f, max_rate: %.0f, signal: response_time}\n", c/10, 20*c))(c)
			}},
		{Name: "xl-concurrency", Path: "/work", What: "xlimit `syn_only` rate 20× capacity, `concurrency: {max: 8}`",
			yaml: func(c float64) string {
				return xlRule(fmt.Sprintf("    syn_only: true\n    rate: %.0f\n    concurrency: {max: 8}\n", 20*c))(c)
			}},
	}
	if example != "" {
		if _, err := os.Stat(example); err == nil {
			vs = append(vs, variant{Name: "xl-example", Path: "/work", What: "xlimit with " + example + " as it ships", file: example})
		}
	}
	return vs
}

type runner struct {
	lab       *lab.Lab
	dir       string
	bpffs     string
	xlimitBin string
	loadBin   string
	appBin    string
	hc        *http.Client
	mu        sync.Mutex
	procs     []*proc
	log       *os.File
	base      string // the results' path without extension
	capacity  float64
	recreated int // times the veth pair was made again
	clientXDP io.Closer
	// noClientXDP: the client end runs no XDP program (-client-xdp=false).
	noClientXDP bool
}

func (r *runner) logf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintf(os.Stderr, "%s bench-http: %s\n", time.Now().Format("15:04:05"), msg)
	if r.log != nil {
		fmt.Fprintf(r.log, "%s %s\n", time.Now().Format(time.RFC3339), msg)
	}
}

// cell is one measurement.
type cell struct {
	Variant   string          `json:"variant"`
	KeepAlive bool            `json:"keepalive"`
	Mult      float64         `json:"mult"`
	Flood     bool            `json:"flood"`
	LoadAvg   string          `json:"loadavg"`
	CPUBusy   float64         `json:"cpu_busy"` // of the machine's CPUs over the cell
	App       appStats        `json:"app"`
	MaxQueue  int64           `json:"app_max_queue"`
	Drained   float64         `json:"drained_s"`
	Overload  *phase          `json:"overload"`
	Summary   json.RawMessage `json:"load"`
	FloodPPS  float64         `json:"flood_pps,omitempty"`  // SYNs the flood got out per second
	FloodRecv float64         `json:"flood_recv,omitempty"` // SYNs that reached the server veth
	XDPTx     uint64          `json:"xdp_tx,omitempty"`     // packets XDP sent back (XDP_TX)
	PerSYN    float64         `json:"answers_per_syn,omitempty"`
	Rules     string          `json:"rules,omitempty"` // xlimit's rules file of the cell
	// The server veth's frames dropped on their way to the client over
	// the cell; the lab made again before it; the lab found wedged after.
	ServerTxDropped uint64          `json:"server_tx_dropped"`
	LabRecreated    bool            `json:"lab_recreated,omitempty"`
	Wedged          bool            `json:"wedged,omitempty"`
	Status          json.RawMessage `json:"xlimit_status,omitempty"`
	// The TCP counters (/proc/net/netstat, /proc/net/snmp) that moved
	// over the cell, of the server's and the client's namespaces: where
	// a connection was lost (ListenOverflows: nginx's accept queue full;
	// TCPSynRetrans: SYNs the client sent again).
	ServerTCP map[string]int64 `json:"server_tcp,omitempty"`
	ClientTCP map[string]int64 `json:"client_tcp,omitempty"`
	Err       string           `json:"error,omitempty"`
}

func main() {
	out := flag.String("out", "bench/results/http", "directory for the report and the raw results")
	xlimitBin := flag.String("xlimit", "bin/xlimit", "the xlimit binary")
	loadBin := flag.String("load", "bin/hb-load", "the load client (tests/realhost/cmd/load)")
	appBin := flag.String("app", "bin/hb-app", "the app (tests/realhost/cmd/app)")
	example := flag.String("example", "docs/examples/http-service.yaml", "the recommended rules file (its variant runs when it exists)")
	only := flag.String("variants", "", "comma-separated variant names (default: all)")
	mults := flag.String("mults", "2,10", "overload steps, × capacity")
	kas := flag.String("keepalive", "off,on", "keep-alive settings to run")
	floodVariants := flag.String("flood-variants", "unprotected,nginx-limit_conn,xl-adaptive-reset,xl-example", "variants also run under the spoofed SYN flood (empty: none)")
	floodPPS := flag.Float64("flood-pps", 150000, "the spoofed SYN flood's rate")
	capacity := flag.Float64("capacity", 0, "the app's capacity in requests/s (0: measure it)")
	label := flag.String("label", "", "a word in the report's file name")
	xlCommit := flag.String("xlimit-commit", "", "the commit -xlimit was built from, when not this checkout's")
	quick := flag.Bool("quick", false, "shorter steps (2 s, 5 s, 2 s): a smoke test, not a figure")
	clientXDP := flag.Bool("client-xdp", true, "run an XDP program on the client end of the veth pair (passes every frame but those to the flood's sources), as a real NIC delivers XDP_TX answers")
	flag.Parse()
	if *quick {
		lowDur, highDur = 2*time.Second, 5*time.Second
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench-http: needs root (network namespaces, XDP)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	opts := options{out: *out, example: *example, only: split(*only), mults: *mults, kas: split(*kas),
		flood: split(*floodVariants), floodPPS: *floodPPS, capacity: *capacity, label: *label, xlCommit: *xlCommit}
	r := &runner{xlimitBin: abs(*xlimitBin), loadBin: abs(*loadBin), appBin: abs(*appBin), noClientXDP: !*clientXDP}
	err := r.run(ctx, opts)
	if cerr := r.close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		slog.Error("bench-http", "err", err)
		os.Exit(1)
	}
}

type options struct {
	out, example, mults, label, xlCommit string
	only, kas, flood                     []string
	floodPPS, capacity                   float64
}

func split(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func abs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

func (r *runner) close() error {
	r.mu.Lock()
	procs := append([]*proc(nil), r.procs...)
	r.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		if !procs[i].exited() {
			procs[i].stop(syscall.SIGTERM, 5*time.Second)
		}
	}
	var errs []error
	if r.clientXDP != nil {
		errs = append(errs, r.clientXDP.Close())
		r.clientXDP = nil
	}
	if r.lab != nil {
		r.detach()
	}
	if r.bpffs != "" {
		if err := unix.Unmount(r.bpffs, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount bpffs: %w", err))
		}
	}
	if r.lab != nil {
		errs = append(errs, r.lab.Close())
	}
	if r.dir != "" {
		errs = append(errs, os.RemoveAll(r.dir))
	}
	return errors.Join(errs...)
}

func (r *runner) run(ctx context.Context, o options) error {
	for _, b := range []string{r.xlimitBin, r.loadBin, r.appBin} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("find binary: %w (make bench-http builds them)", err)
		}
	}
	if _, err := exec.LookPath("nginx"); err != nil {
		return fmt.Errorf("find nginx: %w (Debian's package nginx)", err)
	}
	facts := runFacts()
	facts.XlimitCommit = facts.Describe
	if o.xlCommit != "" {
		facts.XlimitCommit = o.xlCommit
	}
	if s := r.strangers(); len(s) > 0 {
		facts.Strangers = s
		r.logf("WARNING: processes this run did not start may falsify its figures: %s", strings.Join(s, " "))
	}
	var err error
	if r.dir, err = os.MkdirTemp("", "bench-http-"); err != nil {
		return fmt.Errorf("make work dir: %w", err)
	}
	r.bpffs = filepath.Join(r.dir, "bpffs")
	for _, d := range []string{r.bpffs, filepath.Join(r.dir, "state")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("make dir: %w", err)
		}
	}
	if err := unix.Mount("bpf", r.bpffs, "bpf", 0, "mode=0700"); err != nil {
		r.bpffs = ""
		return fmt.Errorf("mount bpffs: %w", err)
	}
	if r.lab, err = lab.New(lab.Options{Prefix: "xlhb"}); err != nil {
		return fmt.Errorf("make lab: %w", err)
	}
	if err := r.attachClientXDP(); err != nil {
		return err
	}
	// The client opens up to ~3 700 connections a second without
	// keep-alive: every local port, and TIME_WAIT's reused.
	if out, err := r.lab.Client.Command(ctx, "sysctl", "-q", "-w", "net.ipv4.ip_local_port_range=1024 65535", "net.ipv4.tcp_tw_reuse=1").CombinedOutput(); err != nil {
		return fmt.Errorf("client sysctls: %w: %s", err, out)
	}
	r.hc = r.appClient()
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return fmt.Errorf("make out dir: %w", err)
	}
	stamp := time.Now().UTC().Format("2006-01-02T1504")
	base := filepath.Join(o.out, stamp+"-"+facts.Commit)
	if o.label != "" {
		base += "-" + o.label
	}
	r.base = base
	if err := os.MkdirAll(base+"-xlimit", 0o755); err != nil {
		return fmt.Errorf("make dir: %w", err)
	}
	if r.log, err = os.Create(base + ".log"); err != nil {
		return fmt.Errorf("create log: %w", err)
	}
	defer r.log.Close()

	app, err := r.start(r.lab.Server, "app", r.appBin, "-listen", appAddr, "-workers", fmt.Sprint(appPool),
		"-work", appWork.String(), "-queue-timeout", "60s")
	if err != nil {
		return err
	}
	if err := app.waitOutput("app listening", 10*time.Second); err != nil {
		return err
	}
	ngxDir := filepath.Join(r.dir, "nginx")
	if err := os.MkdirAll(ngxDir, 0o755); err != nil {
		return fmt.Errorf("make nginx dir: %w", err)
	}
	// nginx needs the capacity for limit_req: measure through an
	// unlimited nginx first, then start the run's.
	ngx, err := r.startNginx(ngxDir, 400)
	if err != nil {
		return err
	}
	r.capacity = o.capacity
	if r.capacity == 0 {
		if r.capacity, err = r.measureCapacity(ctx); err != nil {
			return err
		}
	}
	facts.Capacity = r.capacity
	facts.ClientXDP = !r.noClientXDP
	r.logf("capacity %.0f requests/s", r.capacity)
	ngx.stop(syscall.SIGQUIT, 5*time.Second)
	if _, err = r.startNginx(ngxDir, r.capacity); err != nil {
		return err
	}
	var cells []*cell
	write := func() error { return writeReport(base, facts, cells, o) }
	vs := variants(o.example)
	for _, flood := range []bool{false, true} {
		for _, v := range vs {
			if len(o.only) > 0 && !contains(o.only, v.Name) {
				continue
			}
			if flood && !contains(o.flood, v.Name) {
				continue
			}
			cs, err := r.runVariant(ctx, v, flood, o)
			cells = append(cells, cs...)
			if werr := write(); werr != nil {
				return werr
			}
			if err != nil {
				return err
			}
		}
	}
	facts.LoadAfter = loadAvg()
	facts.Recreated = r.recreated
	facts.StrangersAfter = r.strangers()
	facts.Ended = time.Now().UTC().Format(time.RFC3339)
	if err := write(); err != nil {
		return err
	}
	r.logf("report: %s.md", base)
	return nil
}

func contains(l []string, s string) bool {
	for _, v := range l {
		if v == s {
			return true
		}
	}
	return false
}

func (r *runner) startNginx(dir string, capacity float64) (*proc, error) {
	for _, d := range []string{"body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o777); err != nil {
			return nil, fmt.Errorf("make nginx dir: %w", err)
		}
	}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(nginxConf(dir, capacity, appAddr)), 0o644); err != nil {
		return nil, fmt.Errorf("write nginx conf: %w", err)
	}
	if out, err := exec.Command("nginx", "-t", "-q", "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", conf).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("nginx -t: %w: %s", err, out)
	}
	p, err := r.start(r.lab.Server, "nginx", "nginx", "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", conf)
	if err != nil {
		return nil, err
	}
	// Ready when the app answers through it.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var ok bool
		_ = r.lab.Server.Do(func() error {
			c, err := net.DialTimeout("tcp", "127.0.0.1:80", time.Second)
			if err == nil {
				ok = true
				c.Close()
			}
			return nil
		})
		if ok {
			return p, nil
		}
		if p.exited() {
			return nil, fmt.Errorf("nginx exited: %v: %s", p.err, p.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, errors.New("nginx did not listen on :80 within 10 s")
}

// measureCapacity offers 1.5 × the pool's nominal rate with keep-alive for
// 8 s and counts what the app served between 2 s and 7 s (its queue is
// never empty then).
func (r *runner) measureCapacity(ctx context.Context) (float64, error) {
	nominal := float64(appPool) / appWork.Seconds()
	var s0, s1 appStats
	var t0, t1 time.Time
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(2 * time.Second)
		s0, _ = r.stats(false)
		t0 = time.Now()
		time.Sleep(5 * time.Second)
		s1, _ = r.stats(false)
		t1 = time.Now()
	}()
	_, _, err := r.runLoad(ctx, "-url", "http://"+r.lab.ServerIP4.String()+"/work", "-phases", fmt.Sprintf("%.0f:8s", 1.5*nominal),
		"-keepalive", "-connections", fmt.Sprint(kaIdle), "-max-connections", fmt.Sprint(kaConns), "-timeout", "10s", "-dial-timeout", "2s")
	wg.Wait()
	if err != nil {
		return 0, fmt.Errorf("measure capacity: %w", err)
	}
	if _, err := r.drain(60 * time.Second); err != nil {
		return 0, fmt.Errorf("measure capacity: %w", err)
	}
	if s1.Served <= s0.Served || !t1.After(t0) {
		return 0, errors.New("measure capacity: the app served nothing")
	}
	return math.Round(float64(s1.Served-s0.Served) / t1.Sub(t0).Seconds()), nil
}

func (r *runner) runVariant(ctx context.Context, v variant, flood bool, o options) ([]*cell, error) {
	var d *xlimitDaemon
	var rules string
	switch {
	case v.yaml != nil:
		rules = v.yaml(r.capacity)
	case v.file != "":
		b, err := os.ReadFile(v.file)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", v.file, err)
		}
		rules = string(b)
	}
	var cells []*cell
	for _, ka := range o.kas {
		for _, m := range split(o.mults) {
			var mult float64
			if _, err := fmt.Sscan(m, &mult); err != nil || mult <= 0 {
				return cells, fmt.Errorf("mults: %q is not a positive number", m)
			}
			if ctx.Err() != nil {
				return cells, ctx.Err()
			}
			// The lab must carry traffic before the cell starts: on this
			// kernel a veth's receive side has been seen to stop for good
			// (every frame to the client dropped as the server's tx
			// drops) after a cell of XDP_TX answers; such a pair is made
			// again.
			recreated, err := r.mendLab()
			if err != nil {
				return cells, err
			}
			// A fresh daemon each cell: the law starts from the rules
			// file's rate, not from the previous cell's end.
			if rules != "" {
				var err error
				if d, err = r.startXlimit(v.Name, rules); err != nil {
					return cells, fmt.Errorf("variant %s: %w", v.Name, err)
				}
			}
			tx0 := r.serverTxDropped()
			c := r.cell(ctx, v, ka == "on", mult, flood, o.floodPPS)
			c.Rules = rules
			c.LabRecreated = recreated
			c.ServerTxDropped = r.serverTxDropped() - tx0
			if d != nil {
				r.stopXlimit(d)
				// The daemon's log, a line per tick: the rate, the cap and
				// the law's action the cell saw.
				name := fmt.Sprintf("%s-ka-%s-%gx", v.Name, ka, mult)
				if flood {
					name += "-flood"
				}
				if err := os.WriteFile(filepath.Join(r.base+"-xlimit", name+".log"), []byte(d.p.out.String()), 0o644); err != nil {
					return cells, fmt.Errorf("write daemon log: %w", err)
				}
				d = nil
			}
			cells = append(cells, c)
			if _, err := r.drain(60 * time.Second); err != nil {
				c.Err += "; " + err.Error()
			}
			if !r.healthy() {
				c.Wedged = true
				c.Err += "; the lab stopped carrying traffic to the client during the cell (the server veth's tx drops: the client end's receive ring no longer drained)"
			}
			if s := r.strangers(); len(s) > 0 {
				c.Err += "; strangers: " + strings.Join(s, " ")
			}
			ov := c.Overload
			if ov != nil {
				r.logf("%-18s ka=%-3s %4.0fx flood=%-5v sent %6.0f/s good %6.1f/s p50 %6.1f p99 %7.1f refused p99 %6.1f to %5d rst %5d 503 %5d q %4d load %s cpu %.2f server %v client %v %s",
					v.Name, ka, mult, flood, ov.SentRate, ov.Goodput, ov.P50ms, ov.P99ms, ov.RefusedMs, ov.Timeout, ov.Reset, ov.E503, c.MaxQueue, c.LoadAvg, c.CPUBusy, c.ServerTCP, c.ClientTCP, c.Err)
			} else {
				r.logf("%-18s ka=%-3s %4.0fx flood=%-5v: %s", v.Name, ka, mult, flood, c.Err)
			}
		}
	}
	return cells, nil
}

func (r *runner) cell(ctx context.Context, v variant, ka bool, mult float64, flood bool, floodPPS float64) *cell {
	c := &cell{Variant: v.Name, KeepAlive: ka, Mult: mult, Flood: flood, LoadAvg: loadAvg()}
	low, high := lowShare*r.capacity, mult*r.capacity
	args := []string{"-url", "http://" + r.lab.ServerIP4.String() + v.Path,
		"-phases", fmt.Sprintf("%.0f:%s,%.0f:%s,%.0f:%s", low, lowDur, high, highDur, low, lowDur),
		"-timeout", timeout.String(), "-dial-timeout", timeout.String(), "-workers", "64", "-max-workers", "12000"}
	if ka {
		args = append(args, "-keepalive", "-connections", fmt.Sprint(kaIdle), "-max-connections", fmt.Sprint(kaConns))
	}
	if _, err := r.stats(true); err != nil {
		c.Err = err.Error()
		return c
	}
	var fl *floodRun
	if flood {
		var err error
		if fl, err = r.startFlood(ctx, floodPPS); err != nil {
			c.Err = err.Error()
			return c
		}
		time.Sleep(time.Second)
		fl.mark()
	}
	srv0, cli0 := r.tcpCounters(r.lab.Server), r.tcpCounters(r.lab.Client)
	b0, t0 := cpuTimes()
	sum, raw, err := r.runLoad(ctx, args...)
	b1, t1 := cpuTimes()
	c.ServerTCP, c.ClientTCP = moved(srv0, r.tcpCounters(r.lab.Server)), moved(cli0, r.tcpCounters(r.lab.Client))
	if t1 > t0 {
		c.CPUBusy = float64(b1-b0) / float64(t1-t0)
	}
	if fl != nil {
		fl.finish(c)
	}
	if st, err := r.stats(false); err == nil {
		c.App, c.MaxQueue = st, st.MaxWaiting
	}
	if v.yaml != nil || v.file != "" {
		c.Status = r.xlimitStatus()
	}
	c.Summary = raw
	if err != nil {
		c.Err = err.Error()
		return c
	}
	if len(sum.Phases) == 3 {
		c.Overload = sum.Phases[1]
	}
	return c
}

// floodRun is the spoofed SYN flood of a cell: random sources outside
// the lab's subnet, random source ports, to port 80.
type floodRun struct {
	r      *runner
	cancel context.CancelFunc
	done   chan struct{}
	res    lab.FloodResult
	err    error
	// counters at the mark
	t0       time.Time
	tx0, rx0 uint64
}

func (r *runner) startFlood(ctx context.Context, pps float64) (*floodRun, error) {
	spec := r.lab.ClientFlood(false)
	spec.Src, spec.RandomSources = netip.Addr{}, floodNet(r.lab)
	spec.Proto, spec.DstPort, spec.Rate = lab.ProtoTCPSYN, 80, pps
	spec.Duration = 10 * time.Minute
	spec.MaxBurst = int(pps / 100) // at most 10 ms of backlog at once
	fctx, cancel := context.WithCancel(ctx)
	f := &floodRun{r: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		f.res, f.err = lab.Flood(fctx, spec)
		close(f.done)
	}()
	return f, nil
}

// mark reads the counters the cell's figures are differences of.
func (f *floodRun) mark() {
	f.t0 = time.Now()
	f.tx0, f.rx0 = f.counters()
}

// counters: the server veth's XDP_TX (what xlimit sent back) and the
// packets it received.
func (f *floodRun) counters() (tx, rx uint64) {
	l := f.r.lab
	if st, err := l.Server.Stats(l.ServerIf); err == nil {
		for k, v := range st {
			if strings.HasSuffix(k, "_xdp_tx") {
				tx += v
			}
		}
	}
	if s, err := l.Server.LinkStats(l.ServerIf); err == nil {
		rx = s.RxPackets
	}
	return tx, rx
}

func (f *floodRun) finish(c *cell) {
	tx, rx := f.counters()
	secs := time.Since(f.t0).Seconds()
	f.cancel()
	<-f.done
	c.XDPTx = tx - f.tx0
	recv := float64(rx - f.rx0)
	c.FloodRecv = recv / secs
	c.FloodPPS = f.res.PPS()
	if recv > 0 {
		// Every packet the server veth received is counted, the real
		// clients' too: a bound from above on the answers per flood SYN
		// only when the clients' share is small (it is printed).
		c.PerSYN = float64(c.XDPTx) / recv
	}
	if f.err != nil {
		c.Err += "; flood: " + f.err.Error()
	}
}

// facts are the run's circumstances, at the report's top.
type facts struct {
	Commit, Describe, Kernel, Started, Ended string
	XlimitCommit                             string // what -xlimit was built from
	LoadBefore, LoadAfter                    string
	CPUs                                     int
	Capacity                                 float64
	ClientXDP                                bool // the client end ran an XDP program
	Nginx                                    string
	Strangers, StrangersAfter                []string
	Recreated                                int // veth pairs made again (see runVariant)
}

func runFacts() facts {
	f := facts{CPUs: runtime.NumCPU(), LoadBefore: loadAvg(), Started: time.Now().UTC().Format(time.RFC3339)}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		f.Commit = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command("git", "describe", "--always", "--dirty", "--exclude", "*").Output(); err == nil {
		f.Describe = strings.TrimSpace(string(out))
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		f.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if out, err := exec.Command("nginx", "-v").CombinedOutput(); err == nil {
		f.Nginx = strings.TrimSpace(strings.TrimPrefix(string(out), "nginx version: "))
	}
	return f
}

// healthy reports whether a connection from the client reaches nginx (three
// tries of a second).
func (r *runner) healthy() bool {
	addr := net.JoinHostPort(r.lab.ServerIP4.String(), "80")
	for range 3 {
		ok := false
		_ = r.lab.Client.Do(func() error {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				ok = true
				c.Close()
			}
			return nil
		})
		if ok {
			return true
		}
	}
	return false
}

// mendLab makes the veth pair again when the lab carries no traffic (see
// runVariant); true when it did.
func (r *runner) mendLab() (bool, error) {
	if r.healthy() {
		return false, nil
	}
	tx := r.serverTxDropped()
	r.detach()
	if err := r.lab.Recreate(1); err != nil {
		return true, fmt.Errorf("make the lab's veth pair again: %w", err)
	}
	r.recreated++
	if err := r.attachClientXDP(); err != nil {
		return true, err
	}
	if !r.healthy() {
		return true, errors.New("the lab carries no traffic, even with a new veth pair")
	}
	r.logf("the lab carried no traffic to the client (server veth tx drops %d): veth pair made again", tx)
	return true, nil
}

func (r *runner) serverTxDropped() uint64 {
	s, err := r.lab.Server.LinkStats(r.lab.ServerIf)
	if err != nil {
		return 0
	}
	return s.TxDropped
}

// floodNet is where the flood's spoofed sources are: the /16 of
// 198.18.0.0/15 that does not hold the lab.
func floodNet(l *lab.Lab) netip.Prefix {
	if l.Subnet4.Addr().As4()[1] == 19 {
		return netip.MustParsePrefix("198.18.0.0/16")
	}
	return netip.MustParsePrefix("198.19.0.0/16")
}

// attachClientXDP attaches, on the client end of the veth pair, an XDP
// program that passes every frame but those to the flood's spoofed
// sources (xdppass.AttachSink), as a real NIC delivers: a veth delivers
// the frames its peer's XDP program sends back (XDP_TX: resets, SYN
// cookies) at once only when this end runs an XDP program; without one
// they wait in its ring, and the daemon warns that its answers "will not
// arrive" (issue 42). The answers to spoofed sources leave the host and are
// the network's to carry: the lab drops them at the client's NIC instead
// of charging the machine's CPU with a stack no real host would run for
// them.
func (r *runner) attachClientXDP() error {
	if r.clientXDP != nil {
		_ = r.clientXDP.Close() // the old pair's; gone with it
		r.clientXDP = nil
	}
	if r.noClientXDP {
		return nil
	}
	return r.lab.Client.Do(func() error {
		c, err := xdppass.AttachSink(r.lab.ClientIf, floodNet(r.lab))
		if err != nil {
			return fmt.Errorf("attach the client end's XDP program: %w", err)
		}
		r.clientXDP = c
		return nil
	})
}

// tcpCounters reads the TCP counters of ns (/proc/net/netstat and
// /proc/net/snmp, "TcpExt"/"Tcp" lines, as `cat` in ns sees them); nil on
// error.
func (r *runner) tcpCounters(ns *lab.NS) map[string]int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := ns.Command(ctx, "cat", "/proc/net/netstat", "/proc/net/snmp").Output()
	if err != nil {
		return nil
	}
	m := map[string]int64{}
	lines := strings.Split(string(out), "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) < 2 || len(names) != len(values) || names[0] != values[0] ||
			(names[0] != "TcpExt:" && names[0] != "Tcp:") {
			continue
		}
		for j := 1; j < len(names); j++ {
			var v int64
			if _, err := fmt.Sscan(values[j], &v); err == nil {
				m[names[j]] = v
			}
		}
		i++
	}
	return m
}

// moved is the counters of b that differ from a's, as differences; only
// those that count losses and retries (the rest are noise in the report).
func moved(a, b map[string]int64) map[string]int64 {
	if a == nil || b == nil {
		return nil
	}
	keep := []string{"ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies", "SyncookiesSent",
		"TCPSynRetrans", "TCPTimeouts", "AttemptFails", "EstabResets", "ActiveOpens", "PassiveOpens", "OutRsts", "TCPAbortOnData", "TCPAbortOnClose"}
	m := map[string]int64{}
	for _, k := range keep {
		if d := b[k] - a[k]; d != 0 {
			m[k] = d
		}
	}
	return m
}
