package rulesource

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of the URL's parameters.
const (
	DefaultKey     = "xlimit:rules"
	DefaultChannel = "xlimit:rules"
	DefaultResync  = 30 * time.Second
)

// Options is a parsed rules source URL.
type Options struct {
	// Redis holds the connection options (address, database, password,
	// TLS, timeouts) that go-redis reads from the URL.
	Redis *redis.Options
	// Key holds the rules document (the YAML of a rules file); VersionKey
	// (Key + ":version") the integer that every push increments.
	Key, VersionKey string
	// Channel is where pushes announce a new version.
	Channel string
	// Resync is how often the key is read even without a message.
	Resync time.Duration
	// URL is the URL with any password replaced by "xxxxx", for logs.
	URL string
}

// ParseURL parses a rules source URL:
//
//	redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?PARAMS]
//	rediss://...                          (TLS)
//	unix://[[USER]:PASSWORD@]/PATH/redis.sock[?db=DB&PARAMS]
//
// Besides go-redis's own parameters (dial_timeout, read_timeout, ...), PARAMS
// may set key (default xlimit:rules), channel (default xlimit:rules) and
// resync (a Go duration from 100ms to 1h, default 30s). Unknown parameters
// are errors.
func ParseURL(raw string) (Options, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Options{}, fmt.Errorf("parse rules source URL: %w", err)
	}
	if _, has := u.User.Password(); has {
		return Options{}, fmt.Errorf("parse rules source URL %s: a password in the URL is on the command line, which every user of the host can read: put it in a file (--rules-source-password-file, --password-file) or in $%s", u.Redacted(), PasswordEnv)
	}
	switch u.Scheme {
	case "redis", "rediss", "unix":
	default:
		return Options{}, fmt.Errorf("parse rules source URL: scheme %q: want redis, rediss or unix", u.Scheme)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return Options{}, fmt.Errorf("parse rules source URL: %w", err)
	}
	o := Options{Key: DefaultKey, Channel: DefaultChannel, Resync: DefaultResync}
	take := func(name string, into *string) error {
		vs, ok := q[name]
		if !ok {
			return nil
		}
		delete(q, name)
		if len(vs) != 1 || strings.TrimSpace(vs[0]) == "" || strings.ContainsAny(vs[0], " \t\r\n") {
			return fmt.Errorf("parse rules source URL: %s: want one non-empty value without spaces", name)
		}
		*into = vs[0]
		return nil
	}
	var resync string
	for name, into := range map[string]*string{"key": &o.Key, "channel": &o.Channel, "resync": &resync} {
		if err := take(name, into); err != nil {
			return Options{}, err
		}
	}
	if resync != "" {
		d, err := time.ParseDuration(resync)
		if err != nil || d < 100*time.Millisecond || d > time.Hour {
			return Options{}, fmt.Errorf("parse rules source URL: resync %q: want a duration from 100ms to 1h", resync)
		}
		o.Resync = d
	}
	o.VersionKey = o.Key + ":version"
	u.RawQuery = q.Encode()
	ro, err := redis.ParseURL(u.String())
	if err != nil {
		return Options{}, fmt.Errorf("parse rules source URL: %w", err)
	}
	if ro.DialTimeout == 0 {
		ro.DialTimeout = 2 * time.Second
	}
	if ro.ReadTimeout == 0 {
		ro.ReadTimeout = 2 * time.Second
	}
	if ro.WriteTimeout == 0 {
		ro.WriteTimeout = 2 * time.Second
	}
	// The daemon retries with its own backoff: one attempt each, unless
	// the URL says otherwise.
	if !q.Has("max_retries") {
		ro.MaxRetries = -1
	}
	ro.DialerRetries = 1
	if !q.Has("pool_size") {
		ro.PoolSize = 2
	}
	o.Redis = ro
	shown, _ := url.Parse(raw)
	o.URL = shown.Redacted()
	return o, nil
}

// PasswordEnv is the environment variable that may hold the rules
// source's password (in Kubernetes, from a Secret).
const PasswordEnv = "XLIMIT_RULES_SOURCE_PASSWORD"

// SetPassword gives o its password: the content of file, without its
// final newline, when file is not "", else $XLIMIT_RULES_SOURCE_PASSWORD
// when set; else o keeps no password. The password never comes from the
// command line (ParseURL refuses one in the URL).
func (o *Options) SetPassword(file string) error {
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("read the rules source's password: %w", err)
		}
		o.Redis.Password = strings.TrimRight(string(data), "\r\n")
		return nil
	}
	if pw, ok := os.LookupEnv(PasswordEnv); ok {
		o.Redis.Password = pw
	}
	return nil
}

// String describes where the rules come from, for logs and GET /v1/rules.
func (o Options) String() string {
	return o.URL
}
