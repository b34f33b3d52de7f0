// Command fleetsim runs the fleet sharing's simulation (userspace/fleet:
// every host's Host against one MemStore on a virtual clock) at fleet
// scale, measures what one exchange costs a real redis-server, and writes
// both as a table (make bench: bench/results/fleet-sim.txt).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/xlimit/xlimit/userspace/fleet"
)

func main() {
	out := flag.String("out", "", "write the table here too")
	hosts := flag.Int("hosts", 1000, "simulated hosts")
	rules := flag.Int("rules", 100, "fleet rules per host")
	dur := flag.Duration("duration", 12*time.Second, "simulated time")
	redisHosts := flag.Int("redis-hosts", 100, "hosts exchanging with the real redis-server")
	sim := flag.Bool("sim", true, "run the simulation (false: only the Redis cost)")
	flag.Parse()
	var w io.Writer = os.Stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			log.Fatal(err)
		}
		defer f.Close()
		w = io.MultiWriter(os.Stdout, f)
	}
	fmt.Fprintf(w, "# fleet sharing: simulation (virtual clock) and Redis cost (real redis-server)\n")
	fmt.Fprintf(w, "# %s, go run ./bench/fleetsim; loop tick 50ms, epoch T (default 200ms), window L = 3T/4, budget 3000/s per rule,\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "# exchanges' round trip uniform in [0, 2ms]; demand Zipf(skew) over the hosts, total Load × budget (odd rules Load/3), ranks redrawn at the shift (half time)\n")
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(w, "# load average at the start: %s", la)
	}
	fmt.Fprintln(w)
	if *sim {
		fmt.Fprintf(w, "%-6s %-6s %-6s %-5s %-5s %-6s | %-10s %-10s %-10s %-10s %-10s %-9s %-8s %-12s %-12s\n",
			"hosts", "rules", "T", "skew", "load", "lost", "cold_over", "max_over", "leased_ovr", "admit_err", "converge", "fallback", "gaps", "calls/s", "redis_cmd/s")
		for _, c := range []struct {
			skew, load, lost float64
			interval         time.Duration
		}{{1.1, 2, 0, fleet.DefaultInterval}, {0.5, 1.5, 0, fleet.DefaultInterval}, {1.1, 2, 0.05, fleet.DefaultInterval}, {1.1, 2, 0, time.Second}} {
			p := fleet.SimParams{Hosts: *hosts, Rules: *rules, Duration: *dur, ShiftAt: *dur / 2, Tick: 50 * time.Millisecond,
				Interval: c.interval, Step: time.Millisecond, Skew: c.skew, Budget: 3000, Load: c.load, Lost: c.lost, Seed: 1, RTT: 2 * time.Millisecond}
			start := time.Now()
			r, err := fleet.Simulate(p)
			if err != nil {
				log.Fatal(err)
			}
			conv := "never"
			if r.Converge >= 0 {
				conv = r.Converge.String()
			}
			fmt.Fprintf(w, "%-6d %-6d %-6s %-5.1f %-5.1f %-6.2f | %-10s %-10s %-10s %-10s %-10s %-9s %-8d %-12.0f %-12.0f   (%.0fs wall)\n",
				p.Hosts, p.Rules, c.interval, c.skew, c.load, c.lost, pct(r.ColdOver), pct(r.MaxOver), pct(r.MaxOverLeased), pct(r.AdmitErr), conv, pct(r.Fallback), r.Gaps,
				r.CallsPerSec, r.CommandsPerSec, time.Since(start).Seconds())
		}
		fmt.Fprintf(w, "\ncold_over: the sum of the rates above the budget during the cold start, the first 2T + L + one tick (no allocation yet:\n")
		fmt.Fprintf(w, "every host new, the k-th to report at budget ÷ k without safe_rate);\n")
		fmt.Fprintf(w, "max_over: the same afterwards; leased_ovr: the same over the rates an allocation covers (the bound: ≤ 0);\n")
		fmt.Fprintf(w, "admit_err: mean |admitted − min(budget, offered)| ÷ budget before the shift (the hosts' 10 %% headroom is most of it);\n")
		fmt.Fprintf(w, "converge: from the shift until 99 %% of the (host, rule) shares are within 10 %% of their max-min share and every\n")
		fmt.Fprintf(w, "rule admits within 2 %% of it; calls/s: exchanges (one EVALSHA each); redis_cmd/s: the commands the script runs.\n\n")
	}
	if err := redisCost(w, *redisHosts, *rules); err != nil {
		fmt.Fprintf(w, "redis cost: not measured: %v\n", err)
	}
}

func pct(f float64) string { return fmt.Sprintf("%.3f%%", f*100) }

// redisCost runs n hosts × rules exchanges per epoch against a real
// redis-server for a few epochs and reads the server's own accounting.
func redisCost(w io.Writer, n, rules int) error {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return fmt.Errorf("redis-server is not installed")
	}
	dir, err := os.MkdirTemp("", "xlfsim")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command("redis-server", "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	ver, _ := exec.Command("redis-server", "--version").Output()
	admin := redis.NewClient(&redis.Options{Network: "unix", Addr: sock})
	defer admin.Close()
	ctx := context.Background()
	for i := 0; admin.Ping(ctx).Err() != nil; i++ {
		if i > 300 {
			return fmt.Errorf("redis-server does not answer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A generous timeout: this measures the cost, not the deadline.
	o, err := fleet.ParseURL("unix://" + sock + "?read_timeout=5s")
	if err != nil {
		return err
	}
	st := fleet.OpenRedis(o)
	defer st.Close()
	reps := make([]fleet.Report, rules)
	for r := range reps {
		reps[r] = fleet.Report{Key: fmt.Sprintf("k%d", r), Budget: 3000}
	}
	const epochs = 10
	var wall time.Duration
	last := make([][]int64, n) // per host and rule, the epoch it reported in (as fleet.Host sends it)
	for e := 0; e < epochs; e++ {
		for h := range n {
			for r := range reps {
				reps[r].Demand = float64((h*7+r*13)%997) + 0.5
				reps[r].Last = 0
				if last[h] != nil {
					reps[r].Last = last[h][r]
				}
			}
			t0 := time.Now()
			ans, err := st.Exchange(ctx, fmt.Sprintf("host-%04d", h), reps)
			if err != nil {
				return err
			}
			wall += time.Since(t0)
			last[h] = make([]int64, len(reps))
			for r := range reps {
				last[h][r] = ans.Rules[r].Seq
			}
		}
		time.Sleep(fleet.DefaultInterval) // the next epoch
	}
	info, err := admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return err
	}
	calls, usec := 0.0, 0.0
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_eval:") {
			for _, kv := range strings.Split(strings.TrimSpace(strings.SplitN(line, ":", 2)[1]), ",") {
				k, v, _ := strings.Cut(kv, "=")
				f, _ := strconv.ParseFloat(v, 64)
				switch k {
				case "calls":
					calls += f
				case "usec":
					usec += f
				}
			}
		}
	}
	per := usec / calls
	fmt.Fprintf(w, "Redis cost, measured: %s", ver)
	fmt.Fprintf(w, "%d hosts × %d rules, %d epochs: %.0f exchanges, redis-server CPU %.1f µs per exchange (%.2f µs per rule), client wall %.0f µs per exchange\n",
		n, rules, epochs, calls, per, per/float64(rules), float64(wall.Microseconds())/calls)
	fmt.Fprintf(w, "per host and tick (50 ms, one exchange per 4 ticks): %.1f µs of redis-server CPU\n", per/4)
	for _, T := range []time.Duration{fleet.DefaultInterval, time.Second} {
		fmt.Fprintf(w, "1000 hosts × %d rules at one exchange per host per %v epoch: %.0f exchanges/s × %.0f µs = %.2f redis-server CPU cores\n",
			rules, T, 1000/T.Seconds(), per, 1000/T.Seconds()*per/1e6)
	}
	return nil
}
