package fleet

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startRedis runs a redis-server of the test's own on a unix socket.
func startRedis(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed ('make deps' installs it): the Lua allocation is not compared")
	}
	dir, err := os.MkdirTemp("", "xlfleet")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command("redis-server", "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		os.RemoveAll(dir)
	})
	c := redis.NewClient(&redis.Options{Network: "unix", Addr: sock})
	defer c.Close()
	for i := 0; ; i++ {
		if c.Ping(context.Background()).Err() == nil {
			return sock
		}
		if i > 200 {
			t.Fatal("redis-server does not answer")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestParseURL(t *testing.T) {
	o, err := ParseURL("unix:///run/redis.sock?interval=300ms&prefix=x:f")
	if err != nil || o.Interval != 300*time.Millisecond || o.Prefix != "x:f" || o.Redis.Network != "unix" {
		t.Fatalf("%+v %v", o, err)
	}
	if o, err := ParseURL("redis://10.0.0.5:6379/2"); err != nil || o.Interval != DefaultInterval || o.Redis.DB != 2 || o.URL != "redis://10.0.0.5:6379/2" {
		t.Fatalf("%+v %v", o, err)
	}
	for _, bad := range []string{"http://x", "redis://x?key=a", "redis://x?interval=10ms", "redis://x?interval=1.5ms", "redis://x?prefix=", "redis://x?nope=1"} {
		if _, err := ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q): no error", bad)
		}
	}
}

// The script computes the same allocation as Allocate, to the bit, and
// freezes the previous epoch.
func TestRedisStoreMatchesAllocate(t *testing.T) {
	sock := startRedis(t)
	o, err := ParseURL("unix://" + sock + "?interval=1s&prefix=t")
	if err != nil {
		t.Fatal(err)
	}
	s := OpenRedis(o)
	defer s.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 3 {
		n := 1 + rng.IntN(30)
		key := "k" + strconv.Itoa(round)
		ds := make([]float64, n)
		var e int64
		var left time.Duration
		for i := range ds {
			ds[i] = rng.ExpFloat64() * 200
			if i%4 == 0 {
				ds[i] = 0
			}
			ans, err := s.Exchange(ctx, "h"+strconv.Itoa(i), []Report{{Key: key, Budget: 3000, Demand: ds[i]}})
			if err != nil {
				t.Fatal(err)
			}
			ra := ans.Rules[0]
			if ra.In || (i > 0 && ra.Seq != e) || ra.Reporting != i+1 || ra.IntervalMS != 1000 {
				t.Fatalf("round %d host %d: %+v (epoch %d before)", round, i, ans, e)
			}
			e, left = ra.Seq, time.Duration(ra.EndMS-ans.NowMS)*time.Millisecond
		}
		time.Sleep(left + 10*time.Millisecond)
		want := Allocate(3000, ds)
		sum := 0.0
		for i := range ds {
			ans, err := s.Exchange(ctx, "h"+strconv.Itoa(i), []Report{{Key: key, Budget: 3000, Demand: 1e9}})
			if err != nil {
				t.Fatal(err)
			}
			ra := ans.Rules[0]
			if ra.Seq != e+1 || !ra.In || ra.Demand != ds[i] {
				t.Fatalf("host %d in the next epoch: %+v", i, ans)
			}
			// Every answer of the epoch is the same allocation, whatever
			// was reported since: the previous epoch is frozen.
			if ra.Alloc != want && !(math.IsInf(want.Level, 1) && math.IsInf(ra.Alloc.Level, 1) && ra.Alloc.Extra == want.Extra) {
				t.Fatalf("round %d: Lua %+v, Go %+v", round, ra.Alloc, want)
			}
			sum += ra.Alloc.Share(ra.Demand)
		}
		if math.Abs(sum-3000) > 1e-9 {
			t.Fatalf("round %d: shares sum to %v", round, sum)
		}
		t.Logf("round %d: %d hosts, Lua = Go: %+v", round, n, want)
	}
}

// server is a redis-server of a test's own on a loopback TCP port (a
// replica needs one), optionally under the clockstep shim
// (testdata/clockstep.c) so that the test can step its wall clock.
type server struct {
	t      *testing.T
	dir    string
	port   int
	args   []string
	offset *os.File // the shim's offset file; nil without the shim
	cmd    *exec.Cmd
}

// shim builds testdata/clockstep.c once per test binary.
var shimPath string

func buildShim(t *testing.T) string {
	t.Helper()
	if shimPath != "" {
		return shimPath
	}
	cc := "cc"
	if _, err := exec.LookPath(cc); err != nil {
		cc = "clang-19"
	}
	dir, err := os.MkdirTemp("", "xlshim")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "clockstep.so")
	if b, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", out, "testdata/clockstep.c").CombinedOutput(); err != nil {
		t.Fatalf("build the clock shim with %s: %v\n%s", cc, err, b)
	}
	shimPath = out
	return out
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// newServer starts a redis-server with extra arguments; clock: under the
// shim (initial offset 0).
func newServer(t *testing.T, clock bool, args ...string) *server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server is not installed ('make deps' installs it): %v", err)
	}
	s := &server{t: t, dir: t.TempDir(), port: freePort(t), args: args}
	if clock {
		f, err := os.OpenFile(filepath.Join(s.dir, "offset"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		s.offset = f
		s.step(0)
		t.Cleanup(func() { f.Close() })
	}
	t.Cleanup(s.stop)
	s.start()
	return s
}

func (s *server) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

func (s *server) start() {
	s.t.Helper()
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log")}, s.args...)
	s.cmd = exec.Command("redis-server", args...)
	if s.offset != nil {
		s.cmd.Env = append(os.Environ(), "LD_PRELOAD="+buildShim(s.t), "XL_CLOCK_OFFSET="+s.offset.Name())
	}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	c := s.client()
	defer c.Close()
	for i := 0; ; i++ {
		if c.Ping(context.Background()).Err() == nil {
			return
		}
		if i > 500 {
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server does not answer:\n%s", log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop ends the server (SIGTERM: with appendonly it writes what it has).
func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

func (s *server) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
}

func (s *server) do(args ...any) {
	s.t.Helper()
	c := s.client()
	defer c.Close()
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		s.t.Fatalf("%v: %v", args, err)
	}
}

// step sets the server's clock to the real one plus d.
func (s *server) step(d time.Duration) {
	s.t.Helper()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(int64(d)))
	if _, err := s.offset.WriteAt(b[:], 0); err != nil {
		s.t.Fatal(err)
	}
}

// realFleet runs Hosts on the real clock against Redis, each exchanging
// on a goroutine of its own as the daemon does (daemon/fleet.go), through
// a dialer the test can point at another server (a failover). A sampler
// reads every host's cap at one instant every millisecond.
type realFleet struct {
	t      *testing.T
	budget float64
	hosts  []*Host
	names  []string
	target atomic.Value // string: the address the dialer connects to
	stores []*RedisStore
	demand []atomic.Uint64 // each host's offered rate (float64 bits)
	stop   context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	checkOn bool
	peak    float64
	over    []string
	ahead   time.Duration
}

func startRealFleet(t *testing.T, addr string, intervals []time.Duration, offered []float64) *realFleet {
	t.Helper()
	f := &realFleet{t: t, budget: 3000, demand: make([]atomic.Uint64, len(intervals))}
	f.target.Store(addr)
	for i, o := range offered {
		f.demand[i].Store(math.Float64bits(o))
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	t.Cleanup(f.close)
	for i, T := range intervals {
		name := fmt.Sprintf("h%d", i)
		h, err := NewHost(name, Config{Interval: T, Guard: 75 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		h.SetRules([]Rule{webRule})
		o, err := ParseURL(fmt.Sprintf("redis://%s/0?interval=%v&prefix=t", addr, T))
		if err != nil {
			t.Fatal(err)
		}
		o.Redis.Dialer = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, f.target.Load().(string))
		}
		s := OpenRedis(o)
		f.hosts, f.names, f.stores = append(f.hosts, h), append(f.names, name), append(f.stores, s)
		f.wg.Add(1)
		go f.exchange(ctx, name, h, s, T, &f.demand[i])
	}
	f.wg.Add(1)
	go f.sample(ctx)
	return f
}

func (f *realFleet) close() {
	f.stop()
	f.wg.Wait()
	for _, s := range f.stores {
		s.Close()
	}
}

// exchange is daemon/fleet.go's runFleet, with the loop's Observe.
func (f *realFleet) exchange(ctx context.Context, name string, h *Host, s *RedisStore, T time.Duration, offered *atomic.Uint64) {
	defer f.wg.Done()
	lastObs := time.Now()
	for ctx.Err() == nil {
		now := time.Now()
		if now.Sub(lastObs) >= 50*time.Millisecond {
			h.Observe("web", math.Float64frombits(offered.Load()), now.Sub(lastObs))
			lastObs = now
		}
		if h.Due(now) {
			reps := h.Reports()
			cctx, cancel := context.WithTimeout(ctx, T)
			ans, err := s.Exchange(cctx, name, reps)
			cancel()
			if err != nil {
				h.Fail(time.Now())
			} else if err := h.Apply(now, time.Now(), reps, ans); err != nil {
				f.t.Errorf("%s: %v", name, err)
			}
		}
		wait := min(max(time.Until(h.Next()), time.Millisecond), T, 50*time.Millisecond)
		time.Sleep(wait)
	}
}

func (f *realFleet) sample(ctx context.Context) {
	defer f.wg.Done()
	for ctx.Err() == nil {
		now := time.Now()
		sum, desc := 0.0, ""
		var ahead time.Duration
		for i, h := range f.hosts {
			c, _, until, _ := h.Cap("web", now)
			sum += c
			st := h.Status(now)[0]
			desc += fmt.Sprintf("%s %.1f %s; ", f.names[i], c, st.State)
			if !until.IsZero() {
				ahead = max(ahead, until.Sub(now))
			}
		}
		f.mu.Lock()
		if f.checkOn {
			f.peak = max(f.peak, sum)
			f.ahead = max(f.ahead, ahead)
			if sum > f.budget*(1+1e-9) && len(f.over) < 5 {
				f.over = append(f.over, fmt.Sprintf("%s: sum %.1f (%s)", now.Format("15:04:05.000"), sum, desc))
			}
		}
		f.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
}

// check starts the bound's checks (after the cold start).
func (f *realFleet) check() {
	f.mu.Lock()
	f.checkOn = true
	f.mu.Unlock()
}

// report fails the test on a sum above the budget or a lease deadline
// more than most ahead.
func (f *realFleet) report(what string, most time.Duration) {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t.Logf("%s: largest sum of the caps %.1f (budget %.0f), latest lease deadline %v ahead", what, f.peak, f.budget, f.ahead.Round(time.Millisecond))
	for _, o := range f.over {
		f.t.Errorf("%s: the caps sum above the budget at %s", what, o)
	}
	if f.ahead > most {
		f.t.Errorf("%s: a lease deadline %v ahead, more than %v", what, f.ahead, most)
	}
}

// leased waits up to d for every host to hold a lease with a cap within
// 2 % (or 2/s) of want, and returns how long it took (-1: not within d).
func (f *realFleet) leased(d time.Duration, want []float64) time.Duration {
	start := time.Now()
	for time.Since(start) < d {
		ok := true
		for i, h := range f.hosts {
			st := h.Status(time.Now())[0]
			ok = ok && st.State == StateLeased && math.Abs(st.Share-want[i]) <= max(0.02*want[i], 2)
		}
		if ok {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return -1
}

func (f *realFleet) states() string {
	out := ""
	for i, h := range f.hosts {
		st := h.Status(time.Now())[0]
		out += fmt.Sprintf("%s %.1f %s; ", f.names[i], st.Share, st.State)
	}
	return out
}

var idleThird = []float64{10000, 10000, 0}
var idleShares = []float64{1495, 1495, 10}

// Issue 26, against a real redis-server: two hosts at 200 ms and one at
// 1 s on one key share one budget, every host keeps exchanging, and no
// lease deadline lies more than 7/4 of the longest interval ahead.
func TestRedisMixedIntervals(t *testing.T) {
	s := newServer(t, false)
	f := startRealFleet(t, s.addr(), []time.Duration{200 * time.Millisecond, 200 * time.Millisecond, time.Second}, []float64{10000, 10000, 10000})
	time.Sleep(1500 * time.Millisecond)
	f.check()
	took := f.leased(3*time.Second, []float64{1000, 1000, 1000})
	t.Logf("mixed intervals: %s after 1.5 s + %v", f.states(), took)
	if took < 0 {
		t.Errorf("the shares did not reach 1000 each within 3 s")
	}
	before, _ := f.hosts[2].Exchanges()
	time.Sleep(2 * time.Second)
	after, _ := f.hosts[2].Exchanges()
	if after-before < 2 {
		t.Errorf("the 1 s host exchanged %d times in 2 s", after-before)
	}
	f.report("mixed intervals", time.Second*7/4)
}

// Issue 26: the bound across Redis's faults, against real redis-servers.
// Three hosts (two flooded, one idle) at 200 ms; after each fault the caps
// never sum above the budget (sampled every millisecond), no lease
// deadline lies more than 350 ms ahead, and every host is leased at its
// max-min share again within 2 s.
func TestRedisFaultsBound(t *testing.T) {
	T := 200 * time.Millisecond
	intervals := []time.Duration{T, T, T}
	// settle flips the idle host's demand (idle <-> flooded) and waits for
	// the shares to follow: a frozen host would keep the old ones.
	settle := func(t *testing.T, f *realFleet, what string) {
		t.Helper()
		want := idleShares
		if math.Float64frombits(f.demand[2].Load()) == 0 {
			f.demand[2].Store(math.Float64bits(10000))
			want = []float64{1000, 1000, 1000}
		} else {
			f.demand[2].Store(0)
		}
		took := f.leased(4*time.Second, want)
		t.Logf("%s: %s after %v", what, f.states(), took)
		if took < 0 || took > 2*time.Second {
			t.Errorf("%s: leased at the max-min shares %v after %v, want within 2 s", what, want, took)
		}
	}
	t.Run("restart without persistence", func(t *testing.T) {
		s := newServer(t, false, "--appendonly", "no")
		f := startRealFleet(t, s.addr(), intervals, idleThird)
		time.Sleep(1500 * time.Millisecond)
		f.check()
		settle(t, f, "before")
		s.stop()
		time.Sleep(50 * time.Millisecond)
		s.start()
		settle(t, f, "restarted empty")
		f.report("restart without persistence", T*7/4)
	})
	t.Run("restart with persistence", func(t *testing.T) {
		s := newServer(t, false, "--appendonly", "yes", "--appendfsync", "always")
		f := startRealFleet(t, s.addr(), intervals, idleThird)
		time.Sleep(1500 * time.Millisecond)
		f.check()
		settle(t, f, "before")
		s.stop()
		s.start()
		settle(t, f, "restarted from its AOF")
		f.report("restart with persistence", T*7/4)
	})
	t.Run("replica promoted", func(t *testing.T) {
		p := newServer(t, false)
		r := newServer(t, false, "--replicaof", "127.0.0.1", strconv.Itoa(p.port))
		f := startRealFleet(t, p.addr(), intervals, idleThird)
		time.Sleep(1500 * time.Millisecond)
		f.check()
		settle(t, f, "before")
		p.stop()
		r.do("REPLICAOF", "NO", "ONE")
		f.target.Store(r.addr())
		settle(t, f, "failed over to the replica")
		f.report("replica promoted", T*7/4)
	})
	t.Run("stale replica promoted", func(t *testing.T) {
		// The replica stopped replicating 2 s before the failover: its
		// epoch state is old, its epoch hashes have expired.
		p := newServer(t, false)
		r := newServer(t, false, "--replicaof", "127.0.0.1", strconv.Itoa(p.port))
		f := startRealFleet(t, p.addr(), intervals, idleThird)
		time.Sleep(1500 * time.Millisecond)
		f.check()
		settle(t, f, "before")
		r.do("REPLICAOF", "NO", "ONE")
		time.Sleep(2 * time.Second)
		p.stop()
		f.target.Store(r.addr())
		settle(t, f, "failed over to a stale replica")
		f.report("stale replica promoted", T*7/4)
	})
	t.Run("replica with a clock behind promoted", func(t *testing.T) {
		p := newServer(t, false)
		r := newServer(t, true, "--replicaof", "127.0.0.1", strconv.Itoa(p.port))
		r.step(-5 * time.Second)
		f := startRealFleet(t, p.addr(), intervals, idleThird)
		time.Sleep(1500 * time.Millisecond)
		f.check()
		settle(t, f, "before")
		p.stop()
		r.do("REPLICAOF", "NO", "ONE")
		f.target.Store(r.addr())
		settle(t, f, "failed over to a replica 5 s behind")
		f.report("replica with a clock behind", T*7/4)
	})
	t.Run("clock steps", func(t *testing.T) {
		s := newServer(t, true)
		f := startRealFleet(t, s.addr(), intervals, idleThird)
		time.Sleep(1500 * time.Millisecond)
		f.check()
		settle(t, f, "before")
		for _, d := range []time.Duration{-30 * time.Second, 0, 30 * time.Second, 0} {
			s.step(d)
			settle(t, f, fmt.Sprintf("Redis's clock set to real %+v", d))
		}
		f.report("clock steps", T*7/4)
	})
}

// A failed dial must not lock the store out of a server that is back: the
// exchange after the server returns succeeds (a failover or a restart
// heals within one retry, T/2), whatever the client library's dial
// breaker would do with a pool of one connection.
func TestRedisReconnectsAtOnce(t *testing.T) {
	s := newServer(t, false)
	o, err := ParseURL(fmt.Sprintf("redis://%s/0?interval=200ms&prefix=t", s.addr()))
	if err != nil {
		t.Fatal(err)
	}
	st := OpenRedis(o)
	defer st.Close()
	reps := []Report{{Key: "web", Budget: 3000, Demand: 100, Interval: 200 * time.Millisecond}}
	exchange := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := st.Exchange(ctx, "h0", reps)
		return err
	}
	if err := exchange(); err != nil {
		t.Fatalf("first exchange: %v", err)
	}
	for round := range 3 {
		s.stop()
		start := time.Now()
		if err := exchange(); err == nil {
			t.Fatalf("round %d: an exchange with the server stopped succeeded", round)
		}
		failed := time.Since(start)
		s.start()
		back := time.Now()
		if err := exchange(); err != nil {
			t.Errorf("round %d: the first exchange after the server came back failed (%v after it was up; the failed one took %v): %v",
				round, time.Since(back).Round(time.Millisecond), failed.Round(time.Millisecond), err)
		} else {
			t.Logf("round %d: the failed exchange took %v; the first after the server came back succeeded", round, failed.Round(time.Millisecond))
		}
	}
}
