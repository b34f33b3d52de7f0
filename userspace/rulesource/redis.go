package rulesource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is the Store of a rules source URL.
type Redis struct {
	opts   Options
	client *redis.Client
	// PingAfter is how long a subscription may stay silent before it is
	// pinged; a ping unanswered for as long again breaks it (default 5 s).
	PingAfter time.Duration
}

// Open returns the Store of o. It does not connect yet.
func Open(o Options) *Redis {
	return &Redis{opts: o, client: redis.NewClient(o.Redis), PingAfter: 5 * time.Second}
}

// Close closes the connections.
func (r *Redis) Close() error { return r.client.Close() }

// MaxDocumentBytes is the largest document taken from the store (the
// rules document's limit, config.MaxDocumentBytes): a larger key is read
// no further than one byte past it, and the Source refuses it.
const MaxDocumentBytes = 16 << 20

// Read implements Store: in one transaction, the key's existence, its
// first MaxDocumentBytes+1 bytes at most, and its version; and the
// server's run_id (Document.Store) before and after it, which must agree
// (a restart in between is an error: the next read tells).
func (r *Redis) Read(ctx context.Context) (Document, bool, error) {
	before, err := r.runID(ctx)
	if err != nil {
		return Document{}, false, err
	}
	doc, ok, err := r.read(ctx)
	if err != nil {
		return doc, ok, err
	}
	after, err := r.runID(ctx)
	if err != nil {
		return Document{}, false, err
	}
	if before != after {
		return Document{}, false, fmt.Errorf("read %s: the server changed during the read (run_id %s, then %s)", r.opts.Key, before, after)
	}
	doc.Store = after
	return doc, ok, nil
}

// runID is the server's run_id (INFO server): another after a restart,
// another on a promoted replica. A server that refuses INFO (an ACL, a
// renamed command) gives "": the store's instance is then unknown and
// the versions only move forward (docs/fleet.md).
func (r *Redis) runID(ctx context.Context) (string, error) {
	info, err := r.client.Info(ctx, "server").Result()
	var rerr redis.Error
	switch {
	case errors.As(err, &rerr):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("read the server's run_id: %w", err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v, nil
		}
	}
	return "", nil
}

func (r *Redis) read(ctx context.Context) (Document, bool, error) {
	var (
		exists  *redis.IntCmd
		text    *redis.StringCmd
		version *redis.StringCmd
	)
	_, err := r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		exists = p.Exists(ctx, r.opts.Key)
		text = p.GetRange(ctx, r.opts.Key, 0, MaxDocumentBytes)
		version = p.Get(ctx, r.opts.VersionKey)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Document{}, false, fmt.Errorf("read %s: %w", r.opts.Key, err)
	}
	if exists.Val() == 0 {
		return Document{}, false, nil
	}
	var v int64
	if s, err := version.Result(); err == nil {
		if v, err = strconv.ParseInt(s, 10, 64); err != nil {
			return Document{}, false, fmt.Errorf("read %s: not an integer: %q", r.opts.VersionKey, s)
		}
	} else if !errors.Is(err, redis.Nil) {
		return Document{}, false, fmt.Errorf("read %s: %w", r.opts.VersionKey, err)
	}
	return NewDocument([]byte(text.Val()), v), true, nil
}

// Subscribe implements Store.
func (r *Redis) Subscribe(ctx context.Context) (Subscription, error) {
	ps := r.client.Subscribe(ctx)
	// Subscribe with a bounded wait for the confirmation: the client's
	// Subscribe only sends the command.
	if err := ps.Subscribe(ctx, r.opts.Channel); err != nil {
		ps.Close()
		return nil, fmt.Errorf("subscribe to %s: %w", r.opts.Channel, err)
	}
	for {
		msg, err := ps.ReceiveTimeout(ctx, r.opts.Redis.ReadTimeout)
		if err != nil {
			ps.Close()
			return nil, fmt.Errorf("subscribe to %s: %w", r.opts.Channel, err)
		}
		if _, ok := msg.(*redis.Subscription); ok {
			return &redisSub{ps: ps, pingAfter: r.PingAfter}, nil
		}
	}
}

type redisSub struct {
	ps        *redis.PubSub
	pingAfter time.Duration
}

// Receive implements Subscription. A silent connection is pinged; a ping
// without an answer breaks the subscription, so a Redis that is gone
// without closing the connection is noticed too.
func (s *redisSub) Receive(ctx context.Context) error {
	pinged := false
	for {
		msg, err := s.ps.ReceiveTimeout(ctx, s.pingAfter)
		var ne net.Error
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &ne) && ne.Timeout() && !pinged:
			if err := s.ps.Ping(ctx); err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			pinged = true
			continue
		case errors.As(err, &ne) && ne.Timeout():
			return fmt.Errorf("no answer to a ping within %v", s.pingAfter)
		default:
			return err
		}
		switch msg.(type) {
		case *redis.Message:
			return nil
		case *redis.Pong:
			pinged = false
		}
	}
}

func (s *redisSub) Close() error { return s.ps.Close() }

// pushScript sets the document, increments its version and announces the
// new version, atomically. KEYS: key, version key. ARGV: text, channel.
// It returns {version, number of subscribers that got the message}.
var pushScript = redis.NewScript(`
redis.call('SET', KEYS[1], ARGV[1])
local v = redis.call('INCR', KEYS[2])
local n = redis.call('PUBLISH', ARGV[2], v)
return {v, n}
`)

// Push stores text as the rules document, increments its version and
// publishes the version, in one atomic script. The caller validates text.
// It returns the new version and how many subscribers got the message.
func (r *Redis) Push(ctx context.Context, text []byte) (version, receivers int64, err error) {
	res, err := pushScript.Run(ctx, r.client, []string{r.opts.Key, r.opts.VersionKey}, text, r.opts.Channel).Int64Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("push the rules to %s: %w", r.opts.Key, err)
	}
	if len(res) != 2 {
		return 0, 0, fmt.Errorf("push the rules to %s: unexpected answer %v", r.opts.Key, res)
	}
	return res[0], res[1], nil
}

// slogPrintf sends go-redis's own log lines to a slog.Logger at debug
// level: the Source reports every failure that matters itself.
type slogPrintf struct{ log *slog.Logger }

func (l slogPrintf) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "go-redis: "+fmt.Sprintf(format, v...))
}

// SetClientLogger routes go-redis's log lines (process-wide) to log at
// debug level.
func SetClientLogger(log *slog.Logger) {
	redis.SetLogger(slogPrintf{log})
}
