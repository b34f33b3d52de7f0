package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync/atomic"
	"time"
)

// Claimer is what a Presence needs of the store.
type Claimer interface {
	// Claim records nonce as the reporter of member id for ttl and
	// returns the reporter recorded before ("" none, or expired).
	Claim(ctx context.Context, id, nonce string, ttl time.Duration) (string, error)
}

// Presence detects a second daemon reporting as the same fleet member:
// each daemon claims its member id with a nonce of its own, renewed more
// often than it expires; finding another nonce there means another
// reporter (a state directory copied with an image, two daemons with one
// state directory). Their demands then merge in the store and each takes
// a whole share (issue 41, M4): the operator must be told.
type Presence struct {
	id, nonce string
	others    atomic.Uint64
}

// NewPresence returns the Presence of member id, with a random nonce.
func NewPresence(id string) *Presence {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return &Presence{id: id, nonce: hex.EncodeToString(b[:])}
}

// Check claims the member id for ttl and reports whether another reporter
// held it since the last check (counted in Others).
func (p *Presence) Check(ctx context.Context, c Claimer, ttl time.Duration) (bool, error) {
	prev, err := c.Claim(ctx, p.id, p.nonce, ttl)
	if err != nil {
		return false, err
	}
	if prev != "" && prev != p.nonce {
		p.others.Add(1)
		return true, nil
	}
	return false, nil
}

// Others counts the checks that found another reporter.
func (p *Presence) Others() uint64 { return p.others.Load() }

// ID is the member id.
func (p *Presence) ID() string { return p.id }
