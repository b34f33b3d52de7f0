package rulesource

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		url                    string
		network, addr, key, ch string
		db                     int
		resync                 time.Duration
		shown                  string
	}{
		{url: "redis://10.0.0.5:6380/2", network: "tcp", addr: "10.0.0.5:6380", db: 2, key: DefaultKey, ch: DefaultChannel, resync: DefaultResync},
		{url: "redis://h?key=fleet:web&channel=fleet:web:changes&resync=5s", network: "tcp", addr: "h:6379", key: "fleet:web", ch: "fleet:web:changes", resync: 5 * time.Second},
		{url: "unix:///run/redis/redis.sock?db=3&resync=1s", network: "unix", addr: "/run/redis/redis.sock", db: 3, key: DefaultKey, ch: DefaultChannel, resync: time.Second},
		{url: "redis://h:1/0?dial_timeout=1s", network: "tcp", addr: "h:1", key: DefaultKey, ch: DefaultChannel, resync: DefaultResync, shown: "redis://h:1/0?dial_timeout=1s"},
		{url: "rediss://[::1]:7000", network: "tcp", addr: "[::1]:7000", key: DefaultKey, ch: DefaultChannel, resync: DefaultResync},
	} {
		o, err := ParseURL(tc.url)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		if o.Redis.Network != tc.network || o.Redis.Addr != tc.addr || o.Redis.DB != tc.db || o.Key != tc.key ||
			o.VersionKey != tc.key+":version" || o.Channel != tc.ch || o.Resync != tc.resync {
			t.Errorf("%s: got %s %s db %d key %s/%s channel %s resync %v", tc.url, o.Redis.Network, o.Redis.Addr, o.Redis.DB, o.Key, o.VersionKey, o.Channel, o.Resync)
		}
		if tc.shown != "" && o.String() != tc.shown {
			t.Errorf("%s: shown as %s, want %s", tc.url, o.String(), tc.shown)
		}
		if strings.HasPrefix(tc.url, "rediss") != (o.Redis.TLSConfig != nil) {
			t.Errorf("%s: TLS %v", tc.url, o.Redis.TLSConfig != nil)
		}
	}
	if o, err := ParseURL("redis://h?max_retries=3&pool_size=5"); err != nil || o.Redis.MaxRetries != 3 || o.Redis.PoolSize != 5 {
		t.Errorf("go-redis parameters: %v, max_retries %d pool_size %d", err, o.Redis.MaxRetries, o.Redis.PoolSize)
	}
	if o, _ := ParseURL("redis://h"); o.Redis.MaxRetries != -1 || o.Redis.PoolSize != 2 || o.Redis.DialTimeout != 2*time.Second {
		t.Errorf("defaults: max_retries %d pool_size %d dial_timeout %v", o.Redis.MaxRetries, o.Redis.PoolSize, o.Redis.DialTimeout)
	}
	for url, want := range map[string]string{
		"http://h":                 "scheme",
		"redis://h?resync=10ms":    "resync",
		"redis://h?resync=2h":      "resync",
		"redis://h?resync=x":       "resync",
		"redis://h?key=":           "key",
		"redis://h?key=a&key=b":    "key",
		"redis://h?channel=a%20b":  "channel",
		"redis://h?bogus=1":        "bogus",
		"redis://h/x":              "database",
		"unix://":                  "path",
		"redis://h:6379/0?key=%zz": "invalid",
		"redis://:s3cret@h:1/0":    "a password in the URL is on the command line",
		"redis://u:s3cret@h:1/0":   "redis://u:xxxxx@h:1/0",
	} {
		if _, err := ParseURL(url); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one about %s", url, err, want)
		}
	}
}

// TestSetPassword: the password comes from a file or the environment,
// never from the URL (TestParseURL).
func TestSetPassword(t *testing.T) {
	o, err := ParseURL("redis://h:1/0")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(PasswordEnv, "from-env")
	if err := o.SetPassword(""); err != nil || o.Redis.Password != "from-env" {
		t.Errorf("from $%s: %q, %v", PasswordEnv, o.Redis.Password, err)
	}
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := o.SetPassword(file); err != nil || o.Redis.Password != "from-file" {
		t.Errorf("from a file: %q, %v", o.Redis.Password, err)
	}
	if err := o.SetPassword(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing password file is no error")
	}
}
