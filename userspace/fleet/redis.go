package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/xlimit/xlimit/userspace/rulesource"
)

// DefaultPrefix prefixes every key of the fleet store.
const DefaultPrefix = "xlimit:fleet"

// Options is a parsed --fleet URL.
type Options struct {
	Redis    *redis.Options
	Prefix   string        // key prefix (default DefaultPrefix)
	Interval time.Duration // the epoch T (default DefaultInterval)
	URL      string        // redacted, for logs
}

// ParseURL parses a --fleet URL: the forms of --rules-source (redis://,
// rediss://, unix://, parsed by userspace/rulesource with go-redis's own
// parameters), with the parameters prefix (default xlimit:fleet) and
// interval (the epoch, a Go duration from 50ms to 1m, default 200ms)
// instead of key, channel and resync.
func ParseURL(raw string) (Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Options{}, fmt.Errorf("parse fleet URL: %w", err)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return Options{}, fmt.Errorf("parse fleet URL: %w", err)
	}
	for _, name := range []string{"key", "channel", "resync"} {
		if q.Has(name) {
			return Options{}, fmt.Errorf("parse fleet URL: %s is a --rules-source parameter (a fleet URL takes prefix and interval)", name)
		}
	}
	o := Options{Prefix: DefaultPrefix, Interval: DefaultInterval}
	if vs, ok := q["prefix"]; ok {
		if len(vs) != 1 || strings.TrimSpace(vs[0]) == "" || strings.ContainsAny(vs[0], " \t\r\n") {
			return Options{}, fmt.Errorf("parse fleet URL: prefix: want one non-empty value without spaces")
		}
		o.Prefix = vs[0]
		q.Del("prefix")
	}
	if vs, ok := q["interval"]; ok {
		d, err := time.ParseDuration(strings.Join(vs, ","))
		if err != nil || len(vs) != 1 || d < 50*time.Millisecond || d > time.Minute || d%time.Millisecond != 0 {
			return Options{}, fmt.Errorf("parse fleet URL: interval %q: want a duration in whole ms from 50ms to 1m", strings.Join(vs, ","))
		}
		o.Interval = d
		q.Del("interval")
	}
	u.RawQuery = q.Encode()
	ro, err := rulesource.ParseURL(u.String())
	if err != nil {
		return Options{}, fmt.Errorf("parse fleet URL: %w", err)
	}
	o.Redis = ro.Redis
	if !q.Has("read_timeout") {
		// An exchange answers within an epoch or is useless.
		o.Redis.ReadTimeout = max(o.Interval, 100*time.Millisecond)
		o.Redis.WriteTimeout = o.Redis.ReadTimeout
	}
	if !q.Has("dial_timeout") {
		o.Redis.DialTimeout = max(o.Interval, 100*time.Millisecond)
	}
	shown, _ := url.Parse(raw)
	o.URL = shown.Redacted()
	return o, nil
}

// exchangeScript is one host's exchange: for each rule it advances the
// key's epoch if its end has passed, records the host's demand in the
// current epoch's hash, and returns the current epoch's allocation
// (computed when the epoch began from the two previous epochs' hashes,
// which nobody writes any more: each host that reported in either, at
// its latest demand) and what this host reported there. Each key has its epoch state, the hash PREFIX:KEY:e: seq (one
// more per epoch), T (this epoch's length, ms: the shortest interval its
// hosts asked for during the epoch before), start and end (Redis's TIME,
// ms), hold (the latest end of a lease of an earlier epoch: end + L,
// L = 3T/4 rounded up), next (the shortest interval asked so far) and
// the allocation, as one string "seq start end next T hold allocation". The epoch is a number, not TIME ÷ T: a clock stepped
// forward ends the epoch early (the next one keeps the grid, its
// previous hash is the epoch that just ended), a clock stepped back
// before the epoch's start starts it again from now, so no epoch lasts
// more than twice T. Redis 7.0 has no TTL per hash field: every epoch has
// a hash of its own, deleted three epochs later.
//
// ARGV: prefix, node, T in ms (the host's), number of rules, then per
// rule: key, budget, demand, and the epoch this host last reported in
// (0: unknown; the previous demand is looked up there only). It returns
// now (ms), then per rule: the epoch state's string (above), the host's
// previous demand ("" when it did not report) and, for a key without
// hosts in the allocation, how many hosts reported in the current epoch
// so far. Keys are computed, not declared: no Redis Cluster (as for
// --rules-source).
//
// The allocation repeats Allocate's operations in the same order; the
// epochs are MemStore's (store.go).
var exchangeScript = redis.NewScript(`
local prefix, node, T, nrules = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local floorFraction = ` + strconv.FormatFloat(FloorFraction, 'g', -1, 64) + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function f(x) return string.format('%.17g', x) end
local function window(tk) return math.floor((3 * tk + 3) / 4) end
local function allocate(dk1, dk2, budget)
  -- Every host that reported in either of the two epochs before, at its
  -- latest demand: a host that missed one exchange is still counted.
  local seen, raw = {}, {}
  for _, dk in ipairs({dk1, dk2}) do
    local h = redis.call('HGETALL', dk)
    for i = 1, #h, 2 do
      if not seen[h[i]] then seen[h[i]] = true raw[#raw + 1] = h[i + 1] end
    end
  end
  local n = #raw
  if n == 0 then return f(budget) .. ' inf 0 0 0' end
  local floor = budget * floorFraction / n
  local ds = {}
  for i = 1, n do
    local d = tonumber(raw[i])
    if d == nil or d ~= d or d < floor then d = floor end
    ds[#ds + 1] = d
  end
  table.sort(ds)
  local rem, level, extra = budget, math.huge, 0
  for i = 1, n do
    local fair = rem / (n - i + 1)
    if ds[i] > fair then level = fair break end
    rem = rem - ds[i]
  end
  if level == math.huge then extra = rem / n end
  return f(budget) .. ' ' .. f(level) .. ' ' .. f(extra) .. ' ' .. f(floor) .. ' ' .. n
end
local out = {tostring(now)}
for i = 0, nrules - 1 do
  local key, budget, demand, lasts = ARGV[5 + 4 * i], ARGV[6 + 4 * i], ARGV[7 + 4 * i], ARGV[8 + 4 * i]
  local base = prefix .. ':' .. key
  local ek = base .. ':e'
  local rec = redis.call('GET', ek)
  -- The common case (the epoch goes on) reads seq, start, end and next
  -- and converts no other number.
  local seqs, st, en, tn, rest
  if rec then
    seqs, st, en, tn, rest = string.match(rec, '^(%d+) (%-?%d+) (%-?%d+) (%d+) (.+)$')
    st, en, tn = tonumber(st), tonumber(en), tonumber(tn)
  end
  local seq, tk, hold, a
  local changed = true
  if not (seqs and st and en and tn and rest) then
    -- A new key, or one the store lost: its first epoch, cold.
    seq, tk, st, en, hold, tn = 1, T, now, now + T, now, T
    a = allocate(base .. ':d:0', base .. ':d:-1', tonumber(budget))
  elseif now < st or now >= en or T < tn then
    seq = tonumber(seqs)
    local v1, v2, v3 = string.match(rest, '^(%d+) (%-?%d+) (.+)$')
    tk, hold, a = tonumber(v1), tonumber(v2), v3
    if now < st then
      -- The clock stepped back before the epoch's start: it starts
      -- again now, and the leases of the earlier epochs, granted before
      -- the step, end within an epoch and a window of now.
      st, en = now, now + tk
      hold = math.min(hold, now + tk + window(tk))
    elseif now >= en then
      hold = math.max(hold, en + window(tk))
      local skip = math.floor((now - en) / tn)
      seq, st, tk = seq + 1, en + skip * tn, tn
      en, tn = st + tk, T
      a = allocate(base .. ':d:' .. (seq - 1), base .. ':d:' .. (seq - 2), tonumber(budget))
      -- Only the last three epochs' hashes are kept; their TTL (Redis's
      -- clock too) only collects the keys nobody exchanges for any
      -- more, so a clock stepped forward by less than a minute loses
      -- nothing.
      redis.call('DEL', base .. ':d:' .. (seq - 3))
    end
    if T < tn then tn = T end
  else
    changed = false
  end
  local dk
  if changed then
    seqs = string.format('%d', seq)
    dk = base .. ':d:' .. seqs
    rec = seqs .. string.format(' %d %d %d %d %d ', st, en, tn, tk, hold) .. a
    local ttl = math.max(60000, 20 * tk)
    redis.call('SET', ek, rec, 'PX', ttl)
    redis.call('HSET', dk, node, demand)
    redis.call('PEXPIRE', dk, ttl)
  else
    dk = base .. ':d:' .. seqs
    redis.call('HSET', dk, node, demand)
  end
  out[#out + 1] = rec
  -- What this host reported last in the two epochs before: where it
  -- says it reported (one lookup), or in both when it does not know.
  local prev = false
  local last, seqn = tonumber(lasts), tonumber(seqs)
  if last > 0 and last < seqn and last >= seqn - 2 then
    prev = redis.call('HGET', base .. ':d:' .. lasts, node)
  elseif last == 0 then
    prev = redis.call('HGET', base .. ':d:' .. (seqn - 1), node) or redis.call('HGET', base .. ':d:' .. (seqn - 2), node)
  end
  out[#out + 1] = prev or ''
  -- A cold key (nobody reported in the two previous epochs): how many
  -- have reported in this one so far, for the new hosts' safe share.
  if string.sub(rec, -2) == ' 0' then out[#out + 1] = tostring(redis.call('HLEN', dk)) else out[#out + 1] = '' end
end
return out
`)

// RedisStore is the Store in Redis.
type RedisStore struct {
	opts   Options
	ro     redis.Options
	client atomic.Pointer[redis.Client]
	// server is the identity of the server the one connection is open
	// to (run_id and master_replid from INFO, read when it connects).
	server atomic.Value
}

// OpenRedis returns the store of o; it does not connect yet. It keeps one
// connection (the exchanges are sequential), and names the server behind
// it on every new connection: a restart or a failover is a new server.
//
// A failed exchange that is not the server's own error reply drops the
// client, so the next exchange (T/2 later) dials afresh: go-redis, with a
// pool of one, answers every dial after a failed one with the old error
// until its background probe, once a second, gets through, which would
// keep a host off a promoted replica for a second or more while the
// other hosts lease the budget without it (TestRedisReconnectsAtOnce).
func OpenRedis(o Options) *RedisStore {
	s := &RedisStore{opts: o}
	ro := *o.Redis
	ro.PoolSize, ro.MinIdleConns, ro.DialerRetries = 1, 0, 1
	prev := ro.OnConnect
	ro.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if prev != nil {
			if err := prev(ctx, cn); err != nil {
				return err
			}
		}
		info, err := cn.Info(ctx, "server", "replication").Result()
		if err != nil {
			return fmt.Errorf("name the fleet store: %w", err)
		}
		s.server.Store(serverID(info))
		return nil
	}
	s.ro = ro
	s.client.Store(redis.NewClient(&s.ro))
	return s
}

// redial replaces the client after a failed exchange (see OpenRedis).
func (s *RedisStore) redial(old *redis.Client) {
	if s.client.CompareAndSwap(old, redis.NewClient(&s.ro)) {
		old.Close()
	}
}

// serverID is run_id/master_replid from an INFO answer.
func serverID(info string) string {
	var run, repl string
	for line := range strings.Lines(info) {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "run_id:"); ok {
			run = v
		} else if v, ok := strings.CutPrefix(line, "master_replid:"); ok {
			repl = v
		}
	}
	return run + "/" + repl
}

// Close closes the connections.
func (s *RedisStore) Close() error { return s.client.Load().Close() }

// Exchange implements Store: one EVALSHA (EVAL the first time).
func (s *RedisStore) Exchange(ctx context.Context, node string, reports []Report) (Answer, error) {
	args := make([]any, 0, 4+4*len(reports))
	T := s.opts.Interval
	if len(reports) > 0 && reports[0].Interval > 0 {
		T = reports[0].Interval // the host's: every report has it
	}
	args = append(args, s.opts.Prefix, node, T.Milliseconds(), len(reports))
	for _, r := range reports {
		args = append(args, r.Key, strconv.FormatFloat(r.Budget, 'g', -1, 64), strconv.FormatFloat(r.Demand, 'g', -1, 64), r.Last)
	}
	c := s.client.Load()
	vals, err := exchangeScript.Run(ctx, c, nil, args...).StringSlice()
	if err != nil {
		if _, reply := errors.AsType[redis.Error](err); !reply {
			s.redial(c)
		}
		return Answer{}, fmt.Errorf("exchange with the fleet store: %w", err)
	}
	ans, err := parseAnswer(vals, len(reports))
	if id, ok := s.server.Load().(string); ok {
		ans.Server = id
	}
	return ans, err
}

func parseAnswer(vals []string, n int) (Answer, error) {
	const per = 3
	if len(vals) != 1+per*n {
		return Answer{}, fmt.Errorf("exchange with the fleet store: %d values for %d rules", len(vals), n)
	}
	var ans Answer
	var err error
	if ans.NowMS, err = strconv.ParseInt(vals[0], 10, 64); err != nil {
		return Answer{}, fmt.Errorf("exchange with the fleet store: time %q", vals[0])
	}
	for i := range n {
		v := vals[1+per*i : 1+per*(i+1)]
		var ra RuleAnswer
		// "seq start end next T hold budget level extra floor hosts"
		f := strings.Fields(v[0])
		if len(f) != 11 {
			return Answer{}, fmt.Errorf("exchange with the fleet store: epoch %q", v[0])
		}
		var start, next int64
		for j, p := range []*int64{&ra.Seq, &start, &ra.EndMS, &next, &ra.IntervalMS, &ra.HoldMS} {
			if *p, err = strconv.ParseInt(f[j], 10, 64); err != nil {
				return Answer{}, fmt.Errorf("exchange with the fleet store: epoch %q", v[0])
			}
		}
		if ra.Alloc, err = parseAlloc(strings.Join(f[6:], " ")); err != nil {
			return Answer{}, err
		}
		if d := v[1]; d != "" {
			if ra.Demand, err = strconv.ParseFloat(d, 64); err != nil {
				return Answer{}, fmt.Errorf("exchange with the fleet store: demand %q", d)
			}
			ra.In = true
		}
		if c := v[2]; c != "" {
			if ra.Reporting, err = strconv.Atoi(c); err != nil {
				return Answer{}, fmt.Errorf("exchange with the fleet store: count %q", c)
			}
		}
		ans.Rules = append(ans.Rules, ra)
	}
	return ans, nil
}

func parseAlloc(s string) (Alloc, error) {
	f := strings.Fields(s)
	if len(f) != 5 {
		return Alloc{}, fmt.Errorf("exchange with the fleet store: allocation %q", s)
	}
	var a Alloc
	var err error
	for i, p := range []*float64{&a.Budget, &a.Level, &a.Extra, &a.Floor} {
		if *p, err = strconv.ParseFloat(f[i], 64); err != nil {
			return Alloc{}, fmt.Errorf("exchange with the fleet store: allocation %q", s)
		}
	}
	if a.Hosts, err = strconv.Atoi(f[4]); err != nil {
		return Alloc{}, fmt.Errorf("exchange with the fleet store: allocation %q", s)
	}
	return a, nil
}

// claimScript records a member's reporter and returns the one before.
// KEYS: the member key. ARGV: nonce, ttl in ms.
var claimScript = redis.NewScript(`
local prev = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return prev or ''
`)

// Claim implements Claimer: the key PREFIX:member:ID holds the nonce of
// the member's last reporter for ttl.
func (s *RedisStore) Claim(ctx context.Context, id, nonce string, ttl time.Duration) (string, error) {
	c := s.client.Load()
	prev, err := claimScript.Run(ctx, c, []string{s.opts.Prefix + ":member:" + id}, nonce, ttl.Milliseconds()).Text()
	if err != nil {
		return "", fmt.Errorf("claim fleet member %s: %w", id, err)
	}
	return prev, nil
}
