//go:build linux

package tests

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/rulesource"
)

// redisServer is a redis-server of the test's own: a temporary directory,
// a unix socket (the daemons run in network namespaces, but in the host's
// mount namespace, so they reach it), no TCP port, no persistence.
type redisServer struct {
	t    testing.TB
	dir  string
	sock string
	cmd  *exec.Cmd
	done chan struct{}
}

func startRedis(t testing.TB) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not installed: 'make deps' installs it (%v)", err)
	}
	// A short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "xlredis")
	if err != nil {
		t.Fatal(err)
	}
	r := &redisServer{t: t, dir: dir, sock: filepath.Join(dir, "redis.sock")}
	t.Cleanup(func() {
		r.stop()
		os.RemoveAll(dir)
	})
	r.start()
	return r
}

// start runs redis-server and waits until it answers.
func (r *redisServer) start() {
	r.t.Helper()
	r.cmd = exec.Command("redis-server", "--port", "0", "--unixsocket", r.sock, "--unixsocketperm", "700",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--logfile", filepath.Join(r.dir, "redis.log"))
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	r.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(r.cmd, r.done)
	c := r.client()
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			r.t.Fatalf("redis-server does not answer: %v\n%s", err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop terminates redis-server (a no-op when it is not running).
func (r *redisServer) stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	r.cmd = nil
}

// url is the rules source URL of this server with extra parameters.
func (r *redisServer) url(params string) string {
	u := "unix://" + r.sock + "?key=xlimit:rules"
	if params != "" {
		u += "&" + params
	}
	return u
}

func (r *redisServer) client() *redis.Client {
	return redis.NewClient(&redis.Options{Network: "unix", Addr: r.sock, MaxRetries: -1})
}

// do runs one command on a fresh connection.
func (r *redisServer) do(args ...any) (any, error) {
	c := r.client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Do(ctx, args...).Result()
}

// push runs `xlimit rules push` with rules as the file.
func (r *redisServer) push(t testing.TB, e *env, rules string) {
	t.Helper()
	file := e.writeRules(fmt.Sprintf("push-%d.yaml", time.Now().UnixNano()), rules)
	if out, err := hostCmd(xlimitBin, "rules", "push", "--redis", r.url(""), file); err != nil {
		t.Fatalf("xlimit rules push: %v: %s", err, out)
	}
}

// version is the version stored beside the rules.
func (r *redisServer) version(t testing.TB) int {
	t.Helper()
	v, err := r.do("GET", "xlimit:rules:version")
	if err != nil {
		t.Fatalf("GET xlimit:rules:version: %v", err)
	}
	n, err := strconv.Atoi(v.(string))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fleetHost is one daemon of the fleet: its env and its API client.
type fleetHost struct {
	e   *env
	d   *daemon
	api *api.Client
}

func (h *fleetHost) start(t testing.TB, source string, extra ...string) {
	t.Helper()
	h.d = h.e.startDaemon("", append([]string{"--rules-source", source}, extra...)...)
	if h.api == nil {
		h.api = api.NewClient(filepath.Join(h.e.dir, "api.sock"))
		t.Cleanup(h.api.Close)
	}
}

// sourceVersion is the version of the source's rules in force, from
// GET /v1/rules, with their SHA-256; -1 when the rules in force are not
// from the source.
func (h *fleetHost) sourceVersion(ctx context.Context) (int, string) {
	doc, err := h.api.Rules(ctx)
	if err != nil {
		return -1, ""
	}
	m := regexp.MustCompile(` version (\d+)$`).FindStringSubmatch(doc.Source)
	if m == nil {
		return -1, doc.SHA256
	}
	n, _ := strconv.Atoi(m[1])
	return n, doc.SHA256
}

// waitRules polls every host's API until each runs text as version v of
// the source; it returns how long each took from t0.
func waitRules(t testing.TB, hosts []*fleetHost, text string, v int, t0 time.Time, timeout time.Duration) []time.Duration {
	t.Helper()
	took := make([]time.Duration, len(hosts))
	want := rulesource.NewDocument([]byte(text), 0).SHA256
	var wg sync.WaitGroup
	for i, h := range hosts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithDeadline(context.Background(), t0.Add(timeout))
			defer cancel()
			for ctx.Err() == nil {
				if got, sum := h.sourceVersion(ctx); got == v && sum == want {
					took[i] = time.Since(t0)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
			took[i] = -1
		}()
	}
	wg.Wait()
	for i, d := range took {
		if d < 0 {
			t.Fatalf("host %d did not run version %d within %v:\n%s", i, v, timeout, hosts[i].d.Log())
		}
	}
	return took
}

// converged waits until every host runs rateRules(rate) as version v of
// the source, checks the rate in its maps, and returns how long each took
// from t0.
func converged(t testing.TB, hosts []*fleetHost, rate, v int, t0 time.Time, timeout time.Duration) []time.Duration {
	t.Helper()
	took := waitRules(t, hosts, rateRules(rate), v, t0, timeout)
	for j, h := range hosts {
		if got := ruleRate(t, h.e); !within(got, float64(rate), 1e-9) {
			t.Errorf("host %d: rate in force %v with version %d, want %d", j, got, v, rate)
		}
	}
	return took
}

// rateRules is limitRules at another rate.
func rateRules(rate int) string {
	return strings.Replace(limitRules(), fmt.Sprintf("rate: %d", limitPPS), fmt.Sprintf("rate: %d", rate), 1)
}

func ruleRate(t testing.TB, e *env) float64 {
	t.Helper()
	_, _, rate, ok := e.status().rule("udp-flood")
	if !ok {
		t.Fatalf("no rule udp-flood in force")
	}
	return rate
}

// floodAdmitted floods every host's limited port at once for d and returns
// each socket's admitted rate beyond the bucket's burst of one second.
func floodAdmitted(t *testing.T, hosts []*fleetHost, limit float64, d time.Duration) []float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d+20*time.Second)
	defer cancel()
	got := make([]float64, len(hosts))
	var waits []func() float64
	for _, h := range hosts {
		udp, _ := h.e.services(false)
		wait := h.e.flood(ctx, false, 10*limit, d)
		waits = append(waits, func() float64 {
			sent := wait()
			udp.Settle(200*time.Millisecond, 2*time.Second)
			if sent.PPS() < 5*limit {
				t.Errorf("the flood reached only %.0f pkt/s: not a flood", sent.PPS())
			}
			return admittedRate(udp.Count(), limit, sent.Elapsed)
		})
	}
	for i, w := range waits {
		got[i] = w()
	}
	return got
}

// TestRedisFleetConvergence: two daemons in two namespaces follow one Redis
// key. A push reaches both within a second (the convergence times are
// logged); a push while their subscriptions are cut (CLIENT KILL TYPE
// pubsub) and a change written without PUBLISH (a lost message) still reach
// both, through the read at reconnection and the periodic resync; a
// malformed document is rejected by both and the old rules keep limiting.
func TestRedisFleetConvergence(t *testing.T) {
	requireRoot(t)
	r := startRedis(t)
	hosts := []*fleetHost{{e: newEnv(t)}, {e: newEnv(t)}}
	r.push(t, hosts[0].e, limitRules())
	source := r.url("resync=1s")
	for _, h := range hosts {
		h.start(t, source)
	}
	waitRules(t, hosts, limitRules(), 1, time.Now(), 5*time.Second)

	// Pushes: through PUBLISH, each within a second.
	var all []time.Duration
	for i, rate := range []int{2000, 1500, 3000, 2500, 1000} {
		t0 := time.Now()
		r.push(t, hosts[0].e, rateRules(rate))
		took := converged(t, hosts, rate, 2+i, t0, 5*time.Second)
		all = append(all, took...)
		for j, h := range hosts {
			if took[j] > time.Second {
				t.Errorf("push of version %d reached host %d after %v, want within 1 s", 2+i, j, took[j])
			}
			if !strings.Contains(h.d.Log(), fmt.Sprintf("why=message version=%d ", 2+i)) {
				t.Errorf("host %d did not get version %d through its subscription:\n%s", j, 2+i, h.d.Log())
			}
		}
	}
	slices.Sort(all)
	t.Logf("e2e redis convergence: 5 pushes x 2 hosts, from the start of 'xlimit rules push' to the new rules in force on the host: min %v, median %v, max %v",
		all[0].Round(time.Millisecond), all[len(all)/2].Round(time.Millisecond), all[len(all)-1].Round(time.Millisecond))

	// Subscriptions cut, and a push at once: the message finds no
	// subscriber; the daemons read the key when they reconnect.
	if n, err := r.do("CLIENT", "KILL", "TYPE", "pubsub"); err != nil || n.(int64) != 2 {
		t.Fatalf("CLIENT KILL TYPE pubsub: %v, %v; want 2 subscriptions killed", n, err)
	}
	t0 := time.Now()
	r.push(t, hosts[0].e, rateRules(1200))
	took := converged(t, hosts, 1200, 7, t0, 10*time.Second)
	t.Logf("e2e redis subscription cut (CLIENT KILL TYPE pubsub) then push: hosts converged after %v and %v", took[0].Round(time.Millisecond), took[1].Round(time.Millisecond))

	// A lost PUBLISH: the document and version change without a message.
	// Only the periodic resync (1 s here) can find it.
	if _, err := r.do("SET", "xlimit:rules", rateRules(1700)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.do("INCR", "xlimit:rules:version"); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	took = converged(t, hosts, 1700, 8, t0, 5*time.Second)
	t.Logf("e2e redis lost message (SET without PUBLISH, resync 1s): hosts converged after %v and %v", took[0].Round(time.Millisecond), took[1].Round(time.Millisecond))
	for j, h := range hosts {
		if !strings.Contains(h.d.Log(), "why=resync version=8 ") {
			t.Errorf("host %d did not find version 8 by its resync:\n%s", j, h.d.Log())
		}
	}

	// A malformed document (written past 'xlimit rules push', which would
	// refuse it) is rejected everywhere; the rules in force keep limiting.
	bad := strings.Replace(rateRules(1000), "ports: [9000]", "ports: [0]", 1)
	if out, err := hostCmd(xlimitBin, "rules", "push", "--redis", r.url(""), hosts[0].e.writeRules("bad.yaml", bad)); err == nil || !strings.Contains(string(out), "bad.yaml:4: rules[0].ports[0]") {
		t.Errorf("xlimit rules push of a malformed file: %v:\n%s", err, out)
	}
	if v := r.version(t); v != 8 {
		t.Fatalf("a refused push changed the version to %d", v)
	}
	if _, err := r.do("EVAL", "redis.call('SET', KEYS[1], ARGV[1]); local v = redis.call('INCR', KEYS[2]); redis.call('PUBLISH', ARGV[2], v); return v",
		2, "xlimit:rules", "xlimit:rules:version", bad, "xlimit:rules"); err != nil {
		t.Fatal(err)
	}
	for j, h := range hosts {
		h.d.waitLog("rules from the rules source rejected", 5*time.Second)
		if !strings.Contains(h.d.Log(), "xlimit:rules@v9:4: rules[0].ports[0]") {
			t.Errorf("host %d did not log the problem with its position:\n%s", j, h.d.Log())
		}
		if v, _ := h.sourceVersion(context.Background()); v != 8 {
			t.Errorf("host %d runs version %d after a malformed version 9, want 8", j, v)
		}
	}
	admitted := floodAdmitted(t, hosts, 1700, 3*time.Second)
	t.Logf("e2e redis malformed document: both hosts kept version 8; a flood at 17000 pkt/s admitted %.0f and %.0f pkt/s (limit 1700)", admitted[0], admitted[1])
	for j, got := range admitted {
		if !within(got, 1700, 0.05) {
			t.Errorf("host %d admitted %.0f pkt/s under the kept rules, want 1700 within 5 %%", j, got)
		}
	}
}

// TestRedisDown: with Redis stopped the daemons keep enforcing and say so
// (logs, xlimit_rules_source_up 0); a daemon restarted meanwhile runs the
// local snapshot; when Redis is back with a new document, both converge on
// it.
func TestRedisDown(t *testing.T) {
	requireRoot(t)
	r := startRedis(t)
	hosts := []*fleetHost{{e: newEnv(t)}, {e: newEnv(t)}}
	r.push(t, hosts[0].e, rateRules(2000))
	source := r.url("resync=2s")
	for _, h := range hosts {
		h.start(t, source, "--metrics-addr", "127.0.0.1:9542")
	}
	waitRules(t, hosts, rateRules(2000), 1, time.Now(), 5*time.Second)
	if m := scrape(t, hosts[0].e); !strings.Contains(m, "xlimit_rules_source_up 1") || !strings.Contains(m, "xlimit_rules_version 1") {
		t.Errorf("metrics while connected:\n%s", grepLines(m, "xlimit_rules"))
	}

	r.stop()
	for _, h := range hosts {
		h.d.waitLog("rules source down", 15*time.Second)
	}
	if m := scrape(t, hosts[0].e); !strings.Contains(m, "xlimit_rules_source_up 0") || !strings.Contains(m, "xlimit_rules_version 1") {
		t.Errorf("metrics while Redis is down:\n%s", grepLines(m, "xlimit_rules"))
	}

	// The first host restarts while Redis is down: it runs the snapshot.
	hosts[0].d.kill()
	hosts[0].start(t, source, "--metrics-addr", "127.0.0.1:9542")
	if !strings.Contains(hosts[0].d.Log(), "RUNNING THE LOCAL SNAPSHOT") {
		t.Errorf("the restarted daemon does not say it runs the snapshot:\n%s", hosts[0].d.Log())
	}
	if v, _ := hosts[0].sourceVersion(context.Background()); v != -1 {
		t.Errorf("the restarted daemon claims version %d from the source", v)
	}
	if m := scrape(t, hosts[0].e); !strings.Contains(m, "xlimit_rules_source_up 0") || !strings.Contains(m, "xlimit_rules_version 1") {
		t.Errorf("metrics of the daemon restarted on the snapshot:\n%s", grepLines(m, "xlimit_rules"))
	}
	admitted := floodAdmitted(t, hosts, 2000, 3*time.Second)
	t.Logf("e2e redis down: a flood at 20000 pkt/s admitted %.0f pkt/s (restarted on the snapshot) and %.0f pkt/s (kept running); limit 2000", admitted[0], admitted[1])
	for j, got := range admitted {
		if !within(got, 2000, 0.05) {
			t.Errorf("host %d admitted %.0f pkt/s with Redis down, want 2000 within 5 %%", j, got)
		}
	}

	// Redis is back, empty (no persistence: the version restarts at 1 too),
	// and gets a new document. The daemons compare content as well as the
	// version, so both take it.
	r.start()
	t0 := time.Now()
	r.push(t, hosts[0].e, rateRules(1200))
	took := converged(t, hosts, 1200, 1, t0, 15*time.Second)
	t.Logf("e2e redis back: after a restart of Redis and a push, the hosts converged after %v and %v (reconnection backoff up to 5 s)", took[0].Round(time.Millisecond), took[1].Round(time.Millisecond))
	for _, h := range hosts {
		h.d.waitLog("rules source up", 5*time.Second)
	}
	if m := scrape(t, hosts[0].e); !strings.Contains(m, "xlimit_rules_source_up 1") || !regexp.MustCompile(`xlimit_rules_source_errors_total [1-9]`).MatchString(m) {
		t.Errorf("metrics after Redis came back:\n%s", grepLines(m, "xlimit_rules"))
	}
}

// TestRedisStartAndAPI: a daemon with no source document, no snapshot and
// no --config refuses to start; with an invalid source document it runs
// the --config bootstrap rules and says why; a push then takes over;
// PUT /v1/rules is refused while the rules come from Redis; SIGHUP reads
// the key at once (a change without PUBLISH, default 30 s resync).
func TestRedisStartAndAPI(t *testing.T) {
	requireRoot(t)
	r := startRedis(t)
	e := newEnv(t)
	out, err := e.lab.Server.Command(context.Background(), xlimitBin, "run", "--rules-source", r.url(""), "--iface", e.lab.ServerIf,
		"--bpffs", e.bpffs, "--state-dir", e.stateDir, "--metrics-addr", "", "--api-socket", "").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no rules to start with") {
		t.Errorf("a daemon with no rules anywhere: %v:\n%s", err, out)
	}

	if _, err := r.do("SET", "xlimit:rules", "rules: [oops"); err != nil {
		t.Fatal(err)
	}
	d := e.startDaemon(e.writeRules("bootstrap.yaml", rateRules(800)), "--rules-source", r.url(""))
	for _, want := range []string{"the rules source's document is invalid", "RUNNING THE BOOTSTRAP RULES FILE"} {
		if !strings.Contains(d.Log(), want) {
			t.Errorf("the daemon did not log %q:\n%s", want, d.Log())
		}
	}
	if got := ruleRate(t, e); !within(got, 800, 1e-9) {
		t.Errorf("bootstrap rules: rate %v, want 800", got)
	}

	h := &fleetHost{e: e, d: d, api: api.NewClient(filepath.Join(e.dir, "api.sock"))}
	defer h.api.Close()
	t0 := time.Now()
	r.push(t, e, limitRules())
	converged(t, []*fleetHost{h}, limitPPS, 1, t0, 5*time.Second)

	_, err = h.api.PutRules(context.Background(), []byte(rateRules(5000)), "")
	var se *api.StatusError
	if !errors.As(err, &se) || se.Code != 422 || !strings.Contains(se.Error(), "xlimit rules push") {
		t.Errorf("PUT /v1/rules with a rules source: %v, want 422 naming 'xlimit rules push'", err)
	}
	if got := ruleRate(t, e); !within(got, limitPPS, 1e-9) {
		t.Errorf("a refused PUT changed the rate to %v", got)
	}

	if _, err := r.do("SET", "xlimit:rules", rateRules(600)); err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if err := d.signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	took := converged(t, []*fleetHost{h}, 600, 1, t0, 5*time.Second)
	t.Logf("e2e redis SIGHUP: a change without PUBLISH applied %v after SIGHUP (resync 30 s)", took[0].Round(time.Millisecond))
	if !strings.Contains(d.Log(), "why=refresh") {
		t.Errorf("the change was not read because of SIGHUP:\n%s", d.Log())
	}

	// Restarted while Redis is down, the daemon runs its snapshot; Redis
	// comes back (restored) with that same document: nothing is reloaded,
	// and the rules are shown as the source's again.
	r.stop()
	d.kill()
	d = e.startDaemon("", "--rules-source", r.url(""))
	h.d = d
	if v, _ := h.sourceVersion(context.Background()); v != -1 || !strings.Contains(d.Log(), "RUNNING THE LOCAL SNAPSHOT") {
		t.Errorf("restarted with Redis down: source version %d, want the snapshot:\n%s", v, d.Log())
	}
	r.start()
	if _, err := r.do("MSET", "xlimit:rules", rateRules(600), "xlimit:rules:version", "1"); err != nil {
		t.Fatal(err)
	}
	converged(t, []*fleetHost{h}, 600, 1, time.Now(), 15*time.Second)
	if !strings.Contains(d.Log(), "the rules source's document is the one in force") || strings.Contains(d.Log(), "reloaded from the rules source") {
		t.Errorf("the same document was reloaded, or not recognised:\n%s", d.Log())
	}
}

// scrape reads the daemon's metrics from inside its network namespace. The
// socket is made on the namespace's thread (an http.Client would dial from
// another goroutine, in the host's namespace).
func scrape(t testing.TB, e *env) string {
	t.Helper()
	var conn net.Conn
	err := e.lab.Server.Do(func() (err error) {
		conn, err = net.DialTimeout("tcp", "127.0.0.1:9542", 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:9542/metrics", nil)
	req.Close = true
	if err := req.Write(conn); err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatalf("scrape metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape metrics: %v %v", resp.Status, err)
	}
	return string(body)
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// peakRSS is a process's peak resident memory (VmHWM), in bytes.
func peakRSS(t testing.TB, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("no VmHWM in /proc/%d/status", pid)
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// TestRedisCostlyDocumentAtStart: a document that costs more to parse than
// a daemon's memory (3 MiB of flow-style YAML: about 300 MiB of heap, over
// the DaemonSet's limit of 256 MiB), written straight into the key, is
// refused at start in bounded memory; the daemon runs its snapshot and
// says why (log, GET /v1/rules, the reload failure counter) instead of
// being OOM-killed on every restart (issue 41, M2).
func TestRedisCostlyDocumentAtStart(t *testing.T) {
	requireRoot(t)
	r := startRedis(t)
	h := &fleetHost{e: newEnv(t)}
	r.push(t, h.e, rateRules(1500))
	h.start(t, r.url(""), "--metrics-addr", "127.0.0.1:9542")
	converged(t, []*fleetHost{h}, 1500, 1, time.Now(), 5*time.Second)
	h.d.kill()

	doc := "rules: [" + strings.Repeat("a,", 3<<19) + "a]\n"
	if _, err := r.do("SET", "xlimit:rules", doc); err != nil {
		t.Fatal(err)
	}
	if _, err := r.do("INCR", "xlimit:rules:version"); err != nil {
		t.Fatal(err)
	}
	h.start(t, r.url(""), "--metrics-addr", "127.0.0.1:9542")
	peak := peakRSS(t, h.d.cmd.Process.Pid)
	t.Logf("e2e costly document: a daemon started on %d MiB of flow YAML in the key: peak RSS %d MiB", len(doc)>>20, peak>>20)
	for _, want := range []string{"the rules source's document is invalid", "YAML nodes", "RUNNING THE LOCAL SNAPSHOT"} {
		if !strings.Contains(h.d.Log(), want) {
			t.Errorf("the daemon did not log %q:\n%.3000s", want, h.d.Log())
		}
	}
	if got := ruleRate(t, h.e); !within(got, 1500, 1e-9) {
		t.Errorf("rate in force %v, want the snapshot's 1500", got)
	}
	if doc, err := h.api.Rules(context.Background()); err != nil || !strings.Contains(doc.Source, "version 2 is invalid") {
		t.Errorf("GET /v1/rules: source %q (%v), want it to say why the snapshot runs", doc.Source, err)
	}
	if m := scrape(t, h.e); !regexp.MustCompile(`xlimit_config_reloads_total\{result="failure"\} [1-9]`).MatchString(m) {
		t.Errorf("no reload failure counted:\n%s", grepLines(m, "reload"))
	}
	if peak > 128<<20 {
		t.Errorf("peak RSS %d MiB: the document was parsed, not refused by its cost", peak>>20)
	}
}

// TestRedisStoreRestartConverges: Redis restarted without persistence, and
// Redis restored from an older state (as a lagging replica promoted),
// count their versions again from what they hold: every running daemon
// takes the next push, within 5 s, instead of refusing it as older than
// the version it saw last (issue 41, M3: the fleet split).
func TestRedisStoreRestartConverges(t *testing.T) {
	requireRoot(t)
	r := startRedis(t)
	hosts := []*fleetHost{{e: newEnv(t)}, {e: newEnv(t)}, {e: newEnv(t)}}
	for i, rate := range []int{2000, 1500, 1800} {
		r.push(t, hosts[0].e, rateRules(rate))
		if i == 0 {
			for _, h := range hosts {
				h.start(t, r.url(""))
			}
		}
	}
	converged(t, hosts, 1800, 3, time.Now(), 5*time.Second)

	// Restarted without persistence: empty, the next push is version 1.
	r.stop()
	r.start()
	time.Sleep(6 * time.Second) // every daemon reconnected (backoff up to 5 s)
	t0 := time.Now()
	r.push(t, hosts[0].e, rateRules(1200))
	took := converged(t, hosts, 1200, 1, t0, 5*time.Second)
	t.Logf("e2e redis restarted empty (v3 → v1): every host on the new document after %v", took)

	// A saved state (version 1), then versions 2 and 3; Redis restarts on
	// the saved state, as a replica that lagged would be promoted: the
	// next push is version 2, below the 3 the daemons saw.
	if _, err := r.do("SAVE"); err != nil {
		t.Fatal(err)
	}
	r.push(t, hosts[0].e, rateRules(1300))
	r.push(t, hosts[0].e, rateRules(1400))
	converged(t, hosts, 1400, 3, time.Now(), 5*time.Second)
	r.stop()
	r.start()
	if v := r.version(t); v != 1 {
		t.Fatalf("Redis restarted on its saved state holds version %d, want 1", v)
	}
	time.Sleep(6 * time.Second)
	t0 = time.Now()
	r.push(t, hosts[0].e, rateRules(1100))
	took = converged(t, hosts, 1100, 2, t0, 5*time.Second)
	t.Logf("e2e redis restored from an older state (v3 → v2): every host on the new document after %v", took)
}
