//go:build linux

package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xlimit/xlimit/tests/kit/lab"
	"github.com/xlimit/xlimit/tests/kit/xdppass"
)

// The SYN cookie scenario (issue 15; docs/dataplane.md "SYN cookies"): a
// TCP service of 64 workers × 1 ms behind a backlog of 1024 (one request
// and its answer per connection, the client speaking first), a SYN flood at
// the generator's full speed from random spoofed sources in a /16, and a
// legitimate client opening 50 connections/s, each with a 3 s deadline.
// Three variants in the same run, on the same lab: the kernel alone (no
// xlimit: Linux's own SYN cookies), a syn_only rule at 2000/s burst 200,
// and the same rule with syn_cookies: auto.
const (
	cookiePort     = 8443
	cookieWorkers  = 64
	cookieBacklog  = 1024
	cookieService  = time.Millisecond
	cookieClient   = 50.0 // legitimate connections per second
	cookieDeadline = 3 * time.Second
	cookieRate     = 2000
	cookieBurst    = 200
)

// cookieFloodNet is where the flood's spoofed sources are drawn from. The
// server routes it back through the client's address, whose namespace
// does not forward: answers to the flood (the kernel's SYN-ACKs, or
// xlimit's) cross the veth and die there, as on a real network they
// would go to hosts that never sent the SYN.
var cookieFloodNet = netip.MustParsePrefix("10.212.0.0/16")

type cookieVariant struct {
	name    string
	cookies string // "" : no xlimit at all (the kernel alone)
	rule    bool
}

var cookieVariants = []cookieVariant{
	{name: "kernel alone"},
	{name: fmt.Sprintf("syn_only %d/s burst %d", cookieRate, cookieBurst), rule: true},
	{name: "same + syn_cookies: auto", cookies: "auto", rule: true},
}

func cookieRules(cookies string) string {
	extra := ""
	if cookies != "" {
		extra = "\n    syn_cookies: " + cookies
	}
	return fmt.Sprintf(`rules:
  - name: svc
    protocol: tcp
    ports: [%d]
    syn_only: true
    rate: %d
    burst: %d%s
`, cookiePort, cookieRate, cookieBurst, extra)
}

// cookieRun is what one variant measured.
type cookieRun struct {
	v            cookieVariant
	flood        lab.FloodResult // summed over the generator's restarts
	restarts     int
	reqs         []request
	served       int64   // connections the service completed
	foreign      int64   // connections the service accepted from a peer other than the client
	firstForeign string  // the first such peer, for the failure message
	maxPerSecond int     // most connections accepted by the service in any 1 s window
	cpu          procCPU // the host's CPU time over the flood
	kernel       map[string]int64
	vethDrops    [2]int64       // tx_dropped of the client's and the server's veth end over the run
	errs         map[string]int // failed connections by stage and error
	vethStats    string         // ethtool -S drop and error counters that moved (when ethtool is installed)
	status       cookieStatus   // the rule, from xlimit status (not for the kernel alone)
	uptime       string
}

func (r *cookieRun) ok() int {
	n := 0
	for _, q := range r.reqs {
		if q.ok {
			n++
		}
	}
	return n
}

func (r *cookieRun) okShare() float64 {
	if len(r.reqs) == 0 {
		return 0
	}
	return float64(r.ok()) / float64(len(r.reqs))
}

// p is the q-quantile of the successful connections' latency.
func (r *cookieRun) p(q float64) time.Duration {
	var l []time.Duration
	for _, x := range r.reqs {
		if x.ok {
			l = append(l, x.latency)
		}
	}
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	return l[int(math.Ceil(q*float64(len(l))))-1]
}

// cpuPerSYN is the host's system + softirq CPU time per flood packet sent.
func (r *cookieRun) cpuPerSYN() time.Duration {
	if r.flood.Sent == 0 {
		return 0
	}
	return time.Duration(float64(r.cpu.sysSoftirq()) / float64(r.flood.Sent))
}

// procCPU is /proc/stat's first line in USER_HZ ticks.
type procCPU struct {
	user, system, softirq, irq, total float64
}

func readProcCPU(tb testing.TB) procCPU {
	tb.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatalf("read /proc/stat: %v", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var v [10]float64
	for i := 1; i < len(f) && i <= len(v); i++ {
		if v[i-1], err = strconv.ParseFloat(f[i], 64); err != nil {
			tb.Fatalf("/proc/stat: %q: %v", line, err)
		}
	}
	c := procCPU{user: v[0] + v[1], system: v[2], irq: v[5], softirq: v[6]}
	for _, x := range v[:8] {
		c.total += x
	}
	return c
}

func (c procCPU) sub(o procCPU) procCPU {
	return procCPU{user: c.user - o.user, system: c.system - o.system, softirq: c.softirq - o.softirq,
		irq: c.irq - o.irq, total: c.total - o.total}
}

// userHZ is the unit of /proc/stat (USER_HZ, 100 on every Linux ABI).
const userHZ = 100

// sysSoftirq is the system, irq and softirq time, as a duration.
func (c procCPU) sysSoftirq() time.Duration {
	return time.Duration((c.system + c.softirq + c.irq) / userHZ * float64(time.Second))
}

// kernelTCP reads the TCP counters of ns that tell what the kernel did
// with SYNs: /proc/net/netstat's TcpExt (SyncookiesSent, SyncookiesRecv,
// SyncookiesFailed, ListenOverflows, ListenDrops, TCPReqQFullDoCookies,
// TCPReqQFullDrop) and /proc/net/snmp's Tcp PassiveOpens.
func kernelTCP(tb testing.TB, ns *lab.NS) map[string]int64 {
	tb.Helper()
	out := map[string]int64{}
	err := ns.Do(func() error {
		for _, f := range []struct{ file, section string }{
			{"/proc/thread-self/net/netstat", "TcpExt:"}, {"/proc/thread-self/net/snmp", "Tcp:"},
		} {
			b, err := os.ReadFile(f.file)
			if err != nil {
				return err
			}
			var head []string
			sc := bufio.NewScanner(strings.NewReader(string(b)))
			for sc.Scan() {
				fs := strings.Fields(sc.Text())
				if len(fs) == 0 || fs[0] != f.section {
					continue
				}
				if head == nil {
					head = fs
					continue
				}
				for i := 1; i < len(fs) && i < len(head); i++ {
					if v, err := strconv.ParseInt(fs[i], 10, 64); err == nil {
						out[head[i]] = v
					}
				}
				head = nil
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("read the server's TCP counters: %v", err)
	}
	return out
}

// vethDrops reads tx_dropped of both veth ends (a full ring of the peer:
// what the veth itself lost, the generator's refused sends included).
func vethDrops(tb testing.TB, e *env) [2]int64 {
	tb.Helper()
	var out [2]int64
	for i, side := range []struct {
		ns *lab.NS
		If string
	}{{e.lab.Client, e.lab.ClientIf}, {e.lab.Server, e.lab.ServerIf}} {
		out1, err := side.ns.Command(context.Background(), "ip", "-j", "-s", "link", "show", "dev", side.If).Output()
		var links []struct {
			Stats struct {
				TX struct {
					Dropped int64 `json:"dropped"`
				} `json:"tx"`
			} `json:"stats64"`
		}
		if err == nil {
			err = json.Unmarshal(out1, &links)
		}
		if err == nil && len(links) == 1 {
			out[i] = links[0].Stats.TX.Dropped
		}
		if err != nil {
			tb.Fatalf("read tx_dropped of %s: %v", side.If, err)
		}
	}
	return out
}

// vethQueueStats reads both veth ends' per-queue counters (ethtool -S),
// keyed "client name" and "server name"; empty without ethtool.
func vethQueueStats(e *env) map[string]int64 {
	out := map[string]int64{}
	for _, side := range []struct {
		name string
		ns   *lab.NS
		If   string
	}{{"client", e.lab.Client, e.lab.ClientIf}, {"server", e.lab.Server, e.lab.ServerIf}} {
		b, err := side.ns.Command(context.Background(), "ethtool", "-S", side.If).Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); ok && err == nil {
				out[side.name+" "+k] = n
			}
		}
	}
	return out
}

// vethQueueDelta lists the drop and error counters that moved.
func vethQueueDelta(a, b map[string]int64) string {
	var parts []string
	for k, v := range b {
		if d := v - a[k]; d != 0 && (strings.Contains(k, "drop") || strings.Contains(k, "err")) {
			parts = append(parts, fmt.Sprintf("%s %d", k, d))
		}
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "none (or no ethtool)"
	}
	return strings.Join(parts, ", ")
}

// cookieStatus is the rule's part of `xlimit status --json`.
type cookieStatus struct {
	Pass, Drop uint64
	Reasons    map[string]uint64
	Cookies    map[string]any
}

func (e *env) cookieStatus() cookieStatus {
	e.t.Helper()
	out, err := e.xlimit("status", "--json", "--iface", e.lab.ServerIf)
	if err != nil {
		e.t.Fatalf("xlimit status: %v: %s", err, out)
	}
	var rep struct {
		Interfaces []struct {
			Rules []struct {
				Name     string `json:"name"`
				Counters struct {
					Packets map[string]uint64 `json:"packets"`
					Reasons map[string]uint64 `json:"reasons"`
				} `json:"counters"`
				Cookies map[string]any `json:"syn_cookies"`
			} `json:"rules"`
		} `json:"interfaces"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Interfaces) != 1 {
		e.t.Fatalf("decode status: %v: %s", err, out)
	}
	for _, r := range rep.Interfaces[0].Rules {
		if r.Name == "svc" {
			return cookieStatus{Pass: r.Counters.Packets["pass"], Drop: r.Counters.Packets["drop"],
				Reasons: r.Counters.Reasons, Cookies: r.Cookies}
		}
	}
	e.t.Fatalf("status: no rule svc: %s", out)
	return cookieStatus{}
}

func (s cookieStatus) cookie(key string) uint64 {
	v, _ := s.Cookies[key].(float64)
	return uint64(v)
}

// requestService is a TCP service of workers × service time behind a
// listen backlog that answers one request per connection: it reads the
// client's request line, works for the service time, answers "ok\n" and
// closes. The client speaks first, as in HTTP or TLS: the handshake's last
// ACK is then recovered by the request (the client retransmits it until it
// is acknowledged). With any SYN cookie, the kernel's or xlimit's, no
// SYN-ACK is retransmitted, so a server-first protocol whose final ACK is
// lost waits for the client's timeout (docs/dataplane.md, "SYN cookies").
//
// It also counts the connections it accepts from any peer other than
// client: only the client can complete a handshake, so each of those is a
// spoofed source that got through (a guessed cookie, or a SYN-ACK that
// reached it).
type requestService struct {
	ln      net.Listener
	client  netip.Addr
	served  atomic.Int64
	mu      sync.Mutex
	foreign int64
	first   string // the first foreign peer
	wg      sync.WaitGroup
}

// foreignPeers is how many connections came from a peer other than the
// client so far, and the first of them.
func (s *requestService) foreignPeers() (int64, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.foreign, s.first
}

func startRequestService(tb testing.TB, ns *lab.NS, addr netip.AddrPort, client netip.Addr, backlog, workers int, service time.Duration) *requestService {
	tb.Helper()
	s := &requestService{client: client}
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}); err != nil {
			unix.Close(fd)
			return err
		}
		if err := unix.Listen(fd, backlog); err != nil {
			unix.Close(fd)
			return err
		}
		f := os.NewFile(uintptr(fd), "request-service")
		defer f.Close()
		s.ln, err = net.FileListener(f)
		return err
	})
	if err != nil {
		tb.Fatalf("start the service: %v", err)
	}
	for range workers {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			buf := make([]byte, 64)
			for {
				c, err := s.ln.Accept()
				if err != nil {
					return
				}
				if peer := netip.MustParseAddrPort(c.RemoteAddr().String()); peer.Addr() != s.client {
					s.mu.Lock()
					if s.foreign == 0 {
						s.first = peer.String()
					}
					s.foreign++
					s.mu.Unlock()
				}
				_ = c.SetDeadline(time.Now().Add(cookieDeadline))
				if _, err := c.Read(buf); err == nil {
					time.Sleep(service)
					if _, err := c.Write([]byte("ok\n")); err == nil {
						s.served.Add(1)
					}
				}
				c.Close()
			}
		}()
	}
	tb.Cleanup(func() {
		s.ln.Close()
		s.wg.Wait()
	})
	return s
}

// offerRequestLines opens connections from ns to addr at rate per second for
// d (open loop), each sending a request line and reading the answer, all
// within timeout of its start.
func offerRequestLines(ns *lab.NS, addr netip.AddrPort, rate float64, d, timeout time.Duration) ([]request, map[string]int) {
	var mu sync.Mutex
	var reqs []request
	errs := map[string]int{}
	var wg sync.WaitGroup
	dialer := &net.Dialer{Timeout: timeout}
	start := time.Now()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if at.Sub(start) >= d {
			break
		}
		time.Sleep(time.Until(at))
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			var c net.Conn
			err := ns.Do(func() error {
				var err error
				c, err = dialer.Dial("tcp", addr.String())
				return err
			})
			ok, stage := false, "dial"
			if err == nil {
				_ = c.SetDeadline(t0.Add(timeout))
				stage = "write"
				if _, err = c.Write([]byte("GET /\n")); err == nil {
					stage = "read"
					b := make([]byte, 3)
					_, err = io.ReadFull(c, b)
					ok = err == nil && string(b) == "ok\n"
				}
				c.Close()
			}
			mu.Lock()
			reqs = append(reqs, request{start: t0, latency: time.Since(t0), ok: ok})
			if !ok {
				msg := "wrong answer"
				if err != nil {
					msg = err.Error()
					if i := strings.LastIndex(msg, ": "); i >= 0 {
						msg = msg[i+2:]
					}
				}
				errs[stage+": "+msg]++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return reqs, errs
}

// synFlood runs the spoofed SYN flood at full speed until ctx ends,
// starting the generator again whenever it stops early (a full veth ring
// ends a send with an error), and returns what it sent in total.
func synFlood(ctx context.Context, tb testing.TB, spec lab.FloodSpec) func() (lab.FloodResult, int) {
	ch := make(chan struct {
		r lab.FloodResult
		n int
	}, 1)
	go func() {
		var sum lab.FloodResult
		restarts := 0
		start := time.Now()
		for ctx.Err() == nil {
			r, err := lab.Flood(ctx, spec)
			sum.Sent += r.Sent
			sum.Errors += r.Errors
			if err != nil {
				restarts++
				if restarts > 1000 {
					tb.Errorf("SYN flood: %v (gave up after %d restarts)", err, restarts)
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		sum.Elapsed = time.Since(start)
		ch <- struct {
			r lab.FloodResult
			n int
		}{sum, restarts}
	}()
	return func() (lab.FloodResult, int) { r := <-ch; return r.r, r.n }
}

// runCookieScenario runs every variant on one lab, one after the other,
// each with a lead of flood before the client starts and dur of client
// load under the flood.
func runCookieScenario(tb testing.TB, dur time.Duration) []cookieRun {
	e := newEnv(tb)
	addr := netip.AddrPortFrom(e.lab.ServerIP4, cookiePort)
	svc := startRequestService(tb, e.lab.Server, addr, e.lab.ClientIP4, cookieBacklog, cookieWorkers, cookieService)
	// The route back to the spoofed sources: through the client, whose
	// XDP program drops it (below).
	if out, err := e.lab.Server.Command(context.Background(), "ip", "route", "add", cookieFloodNet.String(),
		"via", e.lab.ClientIP4.String(), "dev", e.lab.ServerIf).CombinedOutput(); err != nil {
		tb.Fatalf("route the flood's sources: %v: %s", err, out)
	}
	// The client's veth runs an XDP program: a veth delivers its peer's
	// XDP_TX frames (the cookies' SYN-ACKs) only when it does
	// (xdppass.Attach); with GRO alone they wait in its ring for the
	// next frame the server's stack sends, which under cookies never
	// comes. It drops the answers to the flood's spoofed sources, the
	// kernel's and xlimit's alike, and passes the rest: on a real host
	// they leave by the NIC, and taken up the client's stack (a route
	// lookup that finds them not its own) they cost the shared CPUs
	// ~1 µs each, which the CPU per flood SYN would charge to the server
	// (bench/results/issue28/synflood-sink-*). Attached for every
	// variant, so that all pay it.
	if err := e.lab.Client.Do(func() error {
		c, err := xdppass.AttachSink(e.lab.ClientIf, cookieFloodNet)
		if err == nil {
			tb.Cleanup(func() { c.Close() })
		}
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	spec := e.lab.ClientFlood(false)
	spec.Proto, spec.DstPort, spec.RandomSources = lab.ProtoTCPSYN, cookiePort, cookieFloodNet
	const lead = time.Second

	var runs []cookieRun
	for _, v := range cookieVariants {
		run := cookieRun{v: v}
		var d *daemon
		if v.rule {
			d = e.startDaemon(e.writeRules("rules.yaml", cookieRules(v.cookies)))
		}
		k0, c0, s0 := kernelTCP(tb, e.lab.Server), readProcCPU(tb), svc.served.Load()
		f0, _ := svc.foreignPeers()
		d0 := vethDrops(tb, e)
		q0 := vethQueueStats(e)

		// The service's completions, sampled every 100 ms.
		sctx, stopSampling := context.WithCancel(context.Background())
		var samples []int64
		var swg sync.WaitGroup
		swg.Add(1)
		go func() {
			defer swg.Done()
			tk := time.NewTicker(100 * time.Millisecond)
			defer tk.Stop()
			for {
				samples = append(samples, svc.served.Load())
				select {
				case <-sctx.Done():
					return
				case <-tk.C:
				}
			}
		}()

		fctx, stopFlood := context.WithCancel(context.Background())
		wait := synFlood(fctx, tb, spec)
		time.Sleep(lead)
		run.reqs, run.errs = offerRequestLines(e.lab.Client, addr, cookieClient, dur, cookieDeadline)
		stopFlood()
		run.flood, run.restarts = wait()
		c1 := readProcCPU(tb)
		stopSampling()
		swg.Wait()
		run.cpu = c1.sub(c0)
		run.served = svc.served.Load() - s0
		f1, first := svc.foreignPeers()
		if run.foreign = f1 - f0; run.foreign > 0 {
			run.firstForeign = first
		}
		k1 := kernelTCP(tb, e.lab.Server)
		d1 := vethDrops(tb, e)
		run.vethDrops = [2]int64{d1[0] - d0[0], d1[1] - d0[1]}
		run.vethStats = vethQueueDelta(q0, vethQueueStats(e))
		run.kernel = map[string]int64{}
		for k, v := range k1 {
			run.kernel[k] = v - k0[k]
		}
		for i := 10; i < len(samples); i++ {
			run.maxPerSecond = max(run.maxPerSecond, int(samples[i]-samples[i-10]))
		}
		run.uptime = loadAvg()
		if d != nil {
			run.status = e.cookieStatus()
			d.kill()
			if out, err := e.xlimit("detach", "--iface", e.lab.ServerIf); err != nil {
				tb.Fatalf("detach after %s: %v: %s", v.name, err, out)
			}
		}
		runs = append(runs, run)
		// Let the last handshakes and the service drain.
		time.Sleep(500 * time.Millisecond)
	}
	return runs
}

// printCookieTable prints the scenario's table, the kernel alone first
// (the reference of the CPU ratio).
func printCookieTable(w func(format string, args ...any), dur time.Duration, runs []cookieRun) {
	w("SYN cookies — service %d workers × %v, backlog %d; spoofed SYN flood from %s at full generator speed; "+
		"legitimate client %.0f conn/s for %v, deadline %v\n\n", cookieWorkers, cookieService, cookieBacklog,
		cookieFloodNet, cookieClient, dur, cookieDeadline)
	w("| variant | flood offered (SYN/s) | legit ok | p50 | p99 | max accepted in 1 s | kernel's SYN cookies sent | xlimit's cookies sent / validated | sys+softirq CPU per flood SYN | vs kernel alone | load (1, 5, 15 min) |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|\n")
	ref := runs[0].cpuPerSYN()
	for _, r := range runs {
		ratio := "1.00"
		if ref > 0 && r.v.rule {
			ratio = fmt.Sprintf("%.2f", float64(r.cpuPerSYN())/float64(ref))
		}
		load := r.uptime
		if i := strings.Index(load, "load average:"); i >= 0 {
			load = strings.TrimSpace(load[i+len("load average:"):])
		}
		xc := "—"
		if r.v.cookies != "" {
			xc = fmt.Sprintf("%d / %d", r.status.cookie("sent"), r.status.cookie("validated"))
		}
		w("| %s | %.0f | %d/%d (%.1f %%) | %s | %s | %d | %d | %s | %v | %s | %s |\n", r.v.name, r.flood.PPS(),
			r.ok(), len(r.reqs), 100*r.okShare(), ms(r.p(0.5)), ms(r.p(0.99)), r.maxPerSecond,
			r.kernel["SyncookiesSent"], xc, r.cpuPerSYN().Round(time.Nanosecond), ratio, load)
	}
	w("\n")
	for _, r := range runs {
		w("%s: flood sent %d SYNs in %v (%.0f/s, %d refused by the ring, %d restarts); CPU over the run: "+
			"user %.2f s, system %.2f s, softirq %.2f s, irq %.2f s of %.2f s; kernel: PassiveOpens %d, "+
			"SyncookiesSent %d, SyncookiesRecv %d, SyncookiesFailed %d, ListenOverflows %d, ListenDrops %d, "+
			"TCPReqQFullDoCookies %d; service completed %d, accepted from a peer other than the client %d; veth tx_dropped client→server %d, server→client %d\n",
			r.v.name, r.flood.Sent, r.flood.Elapsed.Round(time.Millisecond), r.flood.PPS(), r.flood.Errors, r.restarts,
			r.cpu.user/userHZ, r.cpu.system/userHZ, r.cpu.softirq/userHZ, r.cpu.irq/userHZ, r.cpu.total/userHZ,
			r.kernel["PassiveOpens"], r.kernel["SyncookiesSent"], r.kernel["SyncookiesRecv"], r.kernel["SyncookiesFailed"],
			r.kernel["ListenOverflows"], r.kernel["ListenDrops"], r.kernel["TCPReqQFullDoCookies"], r.served, r.foreign,
			r.vethDrops[0], r.vethDrops[1])
		w("  veth queue drops and errors: %s; failed connections: %v\n", r.vethStats, r.errs)
		if r.v.rule {
			w("  xlimit rule svc: pass %d, drop %d, reasons %v, syn_cookies %v\n", r.status.Pass, r.status.Drop,
				r.status.Reasons, r.status.Cookies)
		}
	}
	w("load at the end: %s\n", runs[len(runs)-1].uptime)
}

// checkCookieRuns asserts what SYN cookies must do on any machine: the
// cookie path runs end to end, only the client's connections pass it, the
// service never takes more new connections than the rule allows, and the
// legitimate client gets through the flood (≥ 90 %, and at least as well
// as the rule alone up to that floor; the rule alone often shuts most of
// it out, 6 % on a quiet machine, while cookies' losses are the client's
// final ACK and request dropped in the veth ring that the flood fills). The targets (≥ 99 %, p99 ≤ 50 ms, parity with the
// kernel alone) are reported met or MISSED by cookieTargets, here and in
// make bench.
func checkCookieRuns(tb testing.TB, runs []cookieRun) {
	tb.Helper()
	kernel, rule, cookies := &runs[0], &runs[1], &runs[2]
	floor := int(math.Ceil(0.9 * float64(len(cookies.reqs))))
	if cookies.ok() < floor {
		tb.Errorf("with cookies %.1f %% of legitimate connections succeeded (%d/%d), want ≥ 90 %%",
			100*cookies.okShare(), cookies.ok(), len(cookies.reqs))
	}
	// At least as many as the rule alone, up to that floor. The rule
	// alone is no stable baseline here: its share depends on which CPU
	// runs the veth's NAPI when a client SYN comes. On the flood's CPU the
	// SYN falls in a run of drops and is refused (6 % on a quiet machine);
	// on the other CPU, which has seen little of the flood, the check
	// finds the tokens the flood's runs left in the bucket (95.5 % in one
	// CI run, 13.9–87 % in others). Above the floor, what either variant
	// loses is the client's packets dropped in the veth ring the flood
	// fills.
	if want := min(rule.ok(), floor); cookies.ok() < want {
		tb.Errorf("with cookies %d legitimate connections succeeded, fewer than the rule alone's %d (below the 90 %% floor)",
			cookies.ok(), rule.ok())
	}
	for _, r := range []*cookieRun{rule, cookies} {
		if r.maxPerSecond > cookieRate+cookieBurst {
			tb.Errorf("%s: the service accepted %d connections in one second, more than the rule's %d/s (+ burst %d)",
				r.v.name, r.maxPerSecond, cookieRate, cookieBurst)
		}
	}
	// The cookie path really ran, end to end: XDP answered, TC validated
	// (bpf_sk_assign_tcp_reqsk at real TC ingress) and the connections
	// were the client's.
	sent, validated := cookies.status.cookie("sent"), cookies.status.cookie("validated")
	if sent == 0 || validated == 0 {
		tb.Errorf("with cookies: %d cookies sent, %d validated: the cookie path did not run (status %v)",
			sent, validated, cookies.status.Cookies)
	}
	// Every flood SYN is answerable, whatever the tailroom of its frame:
	// the flood's SYNs, without options, come to the veth as a raw
	// socket's skbs, which rarely have the 20 bytes the answer with every
	// option would grow by (83 % were unanswerable before the answer
	// fitted the frame, bpf/syncookie.h's xl_cookie_fit).
	if un := cookies.status.cookie("unanswerable"); un*100 > sent+un {
		tb.Errorf("with cookies: %d SYNs unanswerable beside %d answered (more than 1 %%): %v",
			un, sent, cookies.status.Cookies)
	}
	// No spoofed source got a connection, in any variant. This is counted
	// at the service, by peer address: the validated count cannot tell,
	// since one connection may validate more than once (its ACK and its
	// request meet the listener in one receive batch, or the first ACK's
	// child is refused and the retransmission validates again).
	for i := range runs {
		if r := &runs[i]; r.foreign > 0 {
			tb.Errorf("%s: the service accepted %d connections from peers other than the client (the first %s): a spoofed source passed",
				r.v.name, r.foreign, r.firstForeign)
		}
	}
	if cookies.flood.Sent == 0 || kernel.flood.Sent == 0 {
		tb.Errorf("the flood sent nothing (kernel alone %d, cookies %d)", kernel.flood.Sent, cookies.flood.Sent)
	}
}

// cookieTargets reports the targets against a run: with cookies
// ≥ 99 % of legitimate connections succeed, at a p99 ≤ 50 ms (no SYN
// retransmission), and at least as many as with the kernel alone.
func cookieTargets(w func(string, ...any), runs []cookieRun) {
	kernel, cookies := &runs[0], &runs[2]
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	w("target: with cookies ≥ 99 %% of legitimate connections succeed: %.1f %% (%d/%d): %s\n",
		100*cookies.okShare(), cookies.ok(), len(cookies.reqs), verdict(cookies.okShare() >= 0.99))
	p99 := cookies.p(0.99)
	w("target: with cookies p99 ≤ 50 ms: %v: %s\n", p99.Round(100*time.Microsecond), verdict(p99 <= 50*time.Millisecond))
	w("target: with cookies at least as many as the kernel alone: %d vs %d: %s\n",
		cookies.ok(), kernel.ok(), verdict(cookies.ok() >= kernel.ok()))
}

// TestSynCookiesThroughSpoofedFlood is the end-to-end test: a
// real client through a spoofed SYN flood, the kernel alone vs a syn_only
// rule vs the same with syn_cookies: auto, in one run.
func TestSynCookiesThroughSpoofedFlood(t *testing.T) {
	requireRoot(t)
	if testing.Short() {
		t.Skip("-short: a 40 s flood scenario")
	}
	const dur = 8 * time.Second
	runs := runCookieScenario(t, dur)
	logf := func(f string, a ...any) { t.Logf(strings.TrimSuffix(f, "\n"), a...) }
	printCookieTable(logf, dur, runs)
	cookieTargets(logf, runs)
	checkCookieRuns(t, runs)
}

// BenchmarkSynCookies is the scenario of make bench: the same three
// variants for longer, the table with the CPU per flood SYN against the
// kernel alone and the offered flood rate next to every figure.
func BenchmarkSynCookies(b *testing.B) {
	requireRoot(b)
	const dur = 15 * time.Second
	for range b.N {
		runs := runCookieScenario(b, dur)
		printCookieTable(func(f string, a ...any) { fmt.Printf(f, a...) }, dur, runs)
		cookieTargets(func(f string, a ...any) { fmt.Printf(f, a...) }, runs)
		checkCookieRuns(b, runs)
	}
}
