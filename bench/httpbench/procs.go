//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/xlimit/xlimit/tests/kit/lab"
)

// proc is a process group the bench started (nsenter execs its target, so
// the group is the target's and its children's: nginx's workers).
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuf
	done chan struct{}
	err  error
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b.Len() > 4<<20 {
		return len(p), nil // keep the first 4 MiB
	}
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs name in ns as the leader of a new process group.
func (r *runner) start(ns *lab.NS, label, name string, args ...string) (*proc, error) {
	p := &proc{name: label, out: &syncBuf{}, done: make(chan struct{})}
	p.cmd = ns.Command(context.Background(), name, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", label, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	r.mu.Lock()
	r.procs = append(r.procs, p)
	r.mu.Unlock()
	return p, nil
}

// stop sends sig to the whole group, waits up to grace, then kills the
// group.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, sig)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	// The group may outlive its leader (nginx's workers): kill what is left.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitOutput waits until the process has printed s.
func (p *proc) waitOutput(s string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if strings.Contains(p.out.String(), s) {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited (%v) before printing %q:\n%s", p.name, p.err, s, tail(p.out.String(), 3000))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not print %q within %v:\n%s", p.name, s, timeout, tail(p.out.String(), 3000))
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// nginxConf is nginx's configuration for one run: the app proxied on
// three paths, /work unlimited, /lreq behind limit_req (the capacity in
// requests/s, burst 20 nodelay, 503) and /lconn behind limit_conn (8).
func nginxConf(dir string, capacity float64, appAddr string) string {
	return fmt.Sprintf(`# make bench-http: written per run.
worker_processes 2;
worker_rlimit_nofile 20000;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
daemon off;
events { worker_connections 16000; }
http {
	access_log off;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	limit_req_zone $server_name zone=req:1m rate=%[2]dr/s;
	limit_conn_zone $server_name zone=conn:1m;
	limit_req_status 503;
	limit_conn_status 503;
	upstream app {
		server %[3]s;
		keepalive 64;
	}
	server {
		listen 80 default_server;
		server_name bench;
		proxy_http_version 1.1;
		proxy_set_header Connection "";
		proxy_read_timeout 30s;
		location = /work { proxy_pass http://app/work; }
		location = /lreq { limit_req zone=req burst=20 nodelay; proxy_pass http://app/work; }
		location = /lconn { limit_conn conn 8; proxy_pass http://app/work; }
	}
}
`, dir, int(capacity+0.5), appAddr)
}

// appStats is the app's /stats.
type appStats struct {
	Served     int64 `json:"served"`
	Refused    int64 `json:"refused"`
	InFlight   int64 `json:"inflight"`
	Waiting    int64 `json:"waiting"`
	MaxWaiting int64 `json:"max_waiting"`
}

// appClient reaches the app inside the server namespace.
func (r *runner) appClient() *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := r.lab.Server.Do(func() error {
			var err error
			c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}
}

func (r *runner) stats(reset bool) (appStats, error) {
	u := "http://" + appAddr + "/stats"
	if reset {
		u += "?reset=1"
	}
	resp, err := r.hc.Get(u)
	if err != nil {
		return appStats{}, fmt.Errorf("read app stats: %w", err)
	}
	defer resp.Body.Close()
	var s appStats
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return appStats{}, fmt.Errorf("decode app stats: %w", err)
	}
	return s, nil
}

// drain waits until the app holds no request (what a cell left queued
// must not load the next one).
func (r *runner) drain(limit time.Duration) (time.Duration, error) {
	t0 := time.Now()
	for time.Since(t0) < limit {
		s, err := r.stats(false)
		if err == nil && s.Waiting == 0 && s.InFlight == 0 {
			return time.Since(t0), nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(t0), fmt.Errorf("app still busy after %v", limit)
}

// xlimitDaemon is a running `xlimit run` in the server namespace.
type xlimitDaemon struct {
	p     *proc
	rules string
}

func (r *runner) startXlimit(name, rules string) (*xlimitDaemon, error) {
	path := filepath.Join(r.dir, name+".yaml")
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		return nil, fmt.Errorf("write rules: %w", err)
	}
	p, err := r.start(r.lab.Server, "xlimit", r.xlimitBin, "run", "--config", path, "--iface", r.lab.ServerIf,
		"--bpffs", r.bpffs, "--state-dir", filepath.Join(r.dir, "state"), "--metrics-addr", "",
		"--api-socket", filepath.Join(r.dir, "api.sock"), "--log-level", "debug")
	if err != nil {
		return nil, err
	}
	d := &xlimitDaemon{p: p, rules: path}
	if err := p.waitOutput("msg=enforcing", 60*time.Second); err != nil {
		r.stopXlimit(d)
		return nil, err
	}
	return d, nil
}

// stopXlimit stops the daemon and detaches what it leaves pinned (a
// stopped daemon keeps the host protected: its programs stay).
func (r *runner) stopXlimit(d *xlimitDaemon) {
	if d == nil {
		return
	}
	d.p.stop(syscall.SIGTERM, 10*time.Second)
	r.detach()
}

func (r *runner) detach() {
	if _, err := os.Stat(filepath.Join(r.bpffs, "xlimit", r.lab.ServerIf)); err != nil {
		return
	}
	out, err := r.xlimit("detach", "--iface", r.lab.ServerIf)
	if err != nil {
		r.logf("xlimit detach: %v: %s", err, out)
	}
}

func (r *runner) xlimit(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args = append(args, "--bpffs", r.bpffs)
	return r.lab.Server.Command(ctx, r.xlimitBin, args...).CombinedOutput()
}

// xlimitStatus is `xlimit status --json`, kept raw in the results.
func (r *runner) xlimitStatus() json.RawMessage {
	out, err := r.xlimit("status", "--json", "--iface", r.lab.ServerIf)
	if err != nil || !json.Valid(out) {
		return nil
	}
	return out
}

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// cpuTimes reads the machine's busy and total jiffies from /proc/stat.
func cpuTimes() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

// strangers lists the processes that would falsify a figure and that this
// run did not start: nginx, trafgen, vegeta or load clients, the app.
func (r *runner) strangers() []string {
	mine := map[int]bool{os.Getpid(): true}
	r.mu.Lock()
	for _, p := range r.procs {
		if !p.exited() {
			mine[p.cmd.Process.Pid] = true
		}
	}
	r.mu.Unlock()
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		c := strings.TrimSpace(string(comm))
		switch c {
		case "nginx", "trafgen", "vegeta", "hb-load", "hb-app", "load", "app", "wrk", "haproxy":
		default:
			continue
		}
		if mine[pid] || mine[pgid(pid)] {
			continue
		}
		out = append(out, fmt.Sprintf("%s[%d]", c, pid))
	}
	return out
}

func pgid(pid int) int {
	g, err := syscall.Getpgid(pid)
	if err != nil {
		return -1
	}
	return g
}

// runLoad runs the load client in the client namespace and decodes its
// summary.
func (r *runner) runLoad(ctx context.Context, args ...string) (*loadSummary, []byte, error) {
	p, err := r.start(r.lab.Client, "load", r.loadBin, args...)
	if err != nil {
		return nil, nil, err
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		p.stop(syscall.SIGKILL, 0)
		return nil, nil, ctx.Err()
	}
	// A client that left children or sockets behind would load the next
	// cell: the group goes with it.
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	out := []byte(p.out.String())
	if p.err != nil {
		return nil, out, fmt.Errorf("load: %w: %s", p.err, tail(string(out), 2000))
	}
	line := out
	if i := bytes.LastIndex(bytes.TrimRight(out, "\n"), []byte("\n")); i >= 0 {
		line = out[i+1:]
	}
	var s loadSummary
	if err := json.Unmarshal(line, &s); err != nil {
		return nil, out, fmt.Errorf("decode load summary: %w: %s", err, tail(string(out), 2000))
	}
	return &s, line, nil
}
