package fleet

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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
		// Wait for the start of an epoch, then report from n hosts.
		for time.Now().UnixMilli()%1000 > 200 {
			time.Sleep(10 * time.Millisecond)
		}
		n := 1 + rng.IntN(30)
		key := "k" + strconv.Itoa(round)
		ds := make([]float64, n)
		var e int64
		for i := range ds {
			ds[i] = rng.ExpFloat64() * 200
			if i%4 == 0 {
				ds[i] = 0
			}
			ans, err := s.Exchange(ctx, "h"+strconv.Itoa(i), []Report{{Key: key, Budget: 3000, Demand: ds[i]}})
			if err != nil {
				t.Fatal(err)
			}
			if ans.Rules[0].In || (i > 0 && ans.Epoch != e) || ans.Rules[0].Reporting != i+1 {
				t.Fatalf("round %d host %d: %+v (epoch %d before)", round, i, ans, e)
			}
			e = ans.Epoch
		}
		for time.Now().UnixMilli()/1000 == e {
			time.Sleep(10 * time.Millisecond)
		}
		want := Allocate(3000, ds)
		sum := 0.0
		for i := range ds {
			ans, err := s.Exchange(ctx, "h"+strconv.Itoa(i), []Report{{Key: key, Budget: 3000, Demand: 1e9}})
			if err != nil {
				t.Fatal(err)
			}
			ra := ans.Rules[0]
			if ans.Epoch != e+1 || !ra.In || ra.Demand != ds[i] {
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
