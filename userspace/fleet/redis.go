package fleet

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
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

// exchangeScript is one host's exchange: it records the host's demands in
// the current epoch's hash and returns, per rule, the current epoch's
// allocation (computed by the first caller of the epoch from the previous
// epoch's hash, which nobody writes any more) and what this host reported
// in the previous epoch. The epoch comes from Redis's clock and never goes
// back (the epoch key), so all hosts agree on it and a frozen hash stays
// frozen. Redis 7.0 has no TTL per hash field: every epoch has hashes of
// its own, whose keys expire after three epochs.
//
// ARGV: prefix, node, T in ms, number of rules, then per rule: key,
// budget, demand. It returns now (ms), the epoch, then per rule the
// allocation ("budget level extra floor hosts") and the host's previous
// demand ("" when it did not report) and, for a key without hosts in the
// allocation, how many hosts reported in the current epoch so far. Keys are computed, not declared:
// no Redis Cluster (as for --rules-source).
//
// The allocation repeats Allocate's operations in the same order.
var exchangeScript = redis.NewScript(`
local prefix, node, T, nrules = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local floorFraction = ` + strconv.FormatFloat(FloorFraction, 'g', -1, 64) + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local e = math.floor(now / T)
local ek = prefix .. ':epoch'
local last = tonumber(redis.call('GET', ek) or '0')
if last >= e then e = last else redis.call('SET', ek, e, 'PX', 10 * T) end
local ttl = 3 * T
local function f(x) return string.format('%.17g', x) end
local function allocate(dk, budget)
  local h = redis.call('HGETALL', dk)
  local n = #h / 2
  if n == 0 then return f(budget) .. ' inf 0 0 0' end
  local floor = budget * floorFraction / n
  local ds = {}
  for i = 2, #h, 2 do
    local d = tonumber(h[i])
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
local out = {tostring(now), tostring(e)}
for i = 0, nrules - 1 do
  local key, budget, demand = ARGV[5 + 3 * i], tonumber(ARGV[6 + 3 * i]), ARGV[7 + 3 * i]
  local base = prefix .. ':' .. key
  local dk = base .. ':d:' .. e
  redis.call('HSET', dk, node, demand)
  local ak = base .. ':a:' .. e
  local a = redis.call('GET', ak)
  if not a then
    -- The first exchange of the epoch for this key: it just created
    -- the epoch's hash, which expires with the allocation.
    redis.call('PEXPIRE', dk, ttl)
    a = allocate(base .. ':d:' .. (e - 1), budget)
    redis.call('SET', ak, a, 'PX', ttl)
  end
  out[#out + 1] = a
  out[#out + 1] = redis.call('HGET', base .. ':d:' .. (e - 1), node) or ''
  -- A cold key (nobody reported in the previous epoch): how many have
  -- reported in this one so far, for the new hosts' safe share.
  if string.sub(a, -2) == ' 0' then out[#out + 1] = tostring(redis.call('HLEN', dk)) else out[#out + 1] = '' end
end
return out
`)

// RedisStore is the Store in Redis.
type RedisStore struct {
	opts   Options
	client *redis.Client
}

// OpenRedis returns the store of o; it does not connect yet.
func OpenRedis(o Options) *RedisStore {
	return &RedisStore{opts: o, client: redis.NewClient(o.Redis)}
}

// Close closes the connections.
func (s *RedisStore) Close() error { return s.client.Close() }

// Exchange implements Store: one EVALSHA (EVAL the first time).
func (s *RedisStore) Exchange(ctx context.Context, node string, reports []Report) (Answer, error) {
	args := make([]any, 0, 4+3*len(reports))
	args = append(args, s.opts.Prefix, node, s.opts.Interval.Milliseconds(), len(reports))
	for _, r := range reports {
		args = append(args, r.Key, strconv.FormatFloat(r.Budget, 'g', -1, 64), strconv.FormatFloat(r.Demand, 'g', -1, 64))
	}
	vals, err := exchangeScript.Run(ctx, s.client, nil, args...).StringSlice()
	if err != nil {
		return Answer{}, fmt.Errorf("exchange with the fleet store: %w", err)
	}
	return parseAnswer(vals, len(reports))
}

func parseAnswer(vals []string, n int) (Answer, error) {
	if len(vals) != 2+3*n {
		return Answer{}, fmt.Errorf("exchange with the fleet store: %d values for %d rules", len(vals), n)
	}
	var ans Answer
	var err error
	if ans.NowMS, err = strconv.ParseInt(vals[0], 10, 64); err != nil {
		return Answer{}, fmt.Errorf("exchange with the fleet store: time %q", vals[0])
	}
	if ans.Epoch, err = strconv.ParseInt(vals[1], 10, 64); err != nil {
		return Answer{}, fmt.Errorf("exchange with the fleet store: epoch %q", vals[1])
	}
	for i := range n {
		a, err := parseAlloc(vals[2+3*i])
		if err != nil {
			return Answer{}, err
		}
		ra := RuleAnswer{Alloc: a}
		if c := vals[4+3*i]; c != "" {
			if ra.Reporting, err = strconv.Atoi(c); err != nil {
				return Answer{}, fmt.Errorf("exchange with the fleet store: count %q", c)
			}
		}
		if d := vals[3+3*i]; d != "" {
			if ra.Demand, err = strconv.ParseFloat(d, 64); err != nil {
				return Answer{}, fmt.Errorf("exchange with the fleet store: demand %q", d)
			}
			ra.In = true
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
