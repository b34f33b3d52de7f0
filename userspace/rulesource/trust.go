package rulesource

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/redis/go-redis/v9"
)

// TrustWarnings says what of a Redis connection lets others than the
// operator change the rules of every host (docs/fleet.md, "Trust"): the
// store is trusted whole, and one SET can deny 0.0.0.0/0 everywhere.
// A unix socket or a loopback address is the host's own business; a
// network address without a password is open to anyone who reaches it,
// and one without TLS carries the password and the rules in clear. what
// names the connection (--rules-source, --fleet).
func TrustWarnings(o *redis.Options, what string) []string {
	if o == nil || o.Network == "unix" || loopback(o.Addr) {
		return nil
	}
	var out []string
	if o.Password == "" {
		out = append(out, fmt.Sprintf("%s: Redis at %s without a password: anyone who reaches it can change the rules of every host (one SET can deny every source); give Redis a password (requirepass or an ACL user) or use a unix socket", what, o.Addr))
	}
	if o.TLSConfig == nil {
		out = append(out, fmt.Sprintf("%s: Redis at %s without TLS (redis://): the rules, and any password, cross the network in clear and can be altered on the way; use rediss://", what, o.Addr))
	}
	return out
}

func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}
