package rulesource

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Document is a rules document read from the store.
type Document struct {
	Text    []byte
	Version int64  // KEY:version; 0 when absent (the key was set by hand)
	SHA256  string // hex SHA-256 of Text
	// Store names the store's instance the document was read from
	// (Redis: its run_id): a restart or a failover changes it; "" unknown.
	Store string
}

// NewDocument returns the document of text at version.
func NewDocument(text []byte, version int64) Document {
	sum := sha256.Sum256(text)
	return Document{Text: text, Version: version, SHA256: hex.EncodeToString(sum[:])}
}

// Store is what a Source needs of the rules store.
type Store interface {
	// Read returns the document and its version; ok is false when the key
	// does not exist.
	Read(ctx context.Context) (doc Document, ok bool, err error)
	// Subscribe subscribes to the channel and returns once the store has
	// confirmed the subscription.
	Subscribe(ctx context.Context) (Subscription, error)
}

// Subscription is a confirmed subscription to the channel.
type Subscription interface {
	// Receive blocks until a message arrives (nil) or the subscription is
	// broken (an error). It checks the connection's health itself.
	Receive(ctx context.Context) error
	Close() error
}

// Config tunes a Source.
type Config struct {
	// Resync is how often the key is read without a message (default 30 s).
	Resync time.Duration
	// MinBackoff and MaxBackoff bound the wait between reconnection
	// attempts, which doubles from MinBackoff (defaults 250 ms and 5 s);
	// each wait is jittered by up to ±20 %.
	MinBackoff, MaxBackoff time.Duration
	// ReadTimeout bounds each read of the key (default 5 s).
	ReadTimeout time.Duration
	// Name is the source's name in logs (the redacted URL).
	Name string
	// Logger may be nil.
	Logger *slog.Logger
}

// Source follows the document in a Store. Run it on its own goroutine;
// receive documents from Updates.
type Source struct {
	store   Store
	cfg     Config
	log     *slog.Logger
	updates chan Document
	refresh chan struct{}

	up     atomic.Bool
	errors atomic.Uint64

	// Run's goroutine only.
	last    Document
	hasLast bool
	missing bool   // the key was missing at the last read (logged once)
	refused string // SHA-256 of the last document refused (logged once)

	floor      int64  // no version below this one is taken (SeedVersion)...
	floorStore string // ...from this store instance ("" unknown: any)
	otherStore string // the last store instance logged as new (logged once)
}

// New returns a Source over store.
func New(store Store, cfg Config) *Source {
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 250 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(5*time.Second, cfg.MinBackoff)
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{store: store, cfg: cfg, log: log.With("source", cfg.Name),
		updates: make(chan Document), refresh: make(chan struct{}, 1)}
}

// Seed tells the Source which document is already in force (for example
// the local snapshot), so that finding the same one in the store hands
// nothing over. Call it before Run.
func (s *Source) Seed(doc Document) {
	s.last, s.hasLast = doc, true
}

// SeedVersion tells the Source the version in force when it is known but
// its document may not be the store's (the local snapshot): a document of
// a lower version is then refused like one older than the last taken.
// store is the store instance v was read from (Document.Store; "" when
// unknown). Call it before Run.
func (s *Source) SeedVersion(v int64, store string) { s.floor, s.floorStore = v, store }

// sameStore reports whether two documents' store instances may be one:
// equal, or one of them unknown.
func sameStore(a, b string) bool { return a == "" || b == "" || a == b }

// backwards is why doc does not move the version forward, or "". The
// versions only move forward on one store instance: a lower version
// there is a replay or a key set by hand, and is refused. The same
// version with other text is a key set by hand (docs/fleet.md) and is
// taken. Another instance (Redis restarted without its data, a replica
// promoted: Document.Store changed) counts from its own versions: its
// document is taken whatever its version, as a daemon starting then
// would take it, so that the fleet does not split (issue 41, M3).
func (s *Source) backwards(doc Document) string {
	floor, from := int64(-1), ""
	if sameStore(s.floorStore, doc.Store) {
		floor, from = s.floor, s.floorStore
	}
	if s.hasLast && sameStore(s.last.Store, doc.Store) && s.last.Version > floor {
		floor, from = s.last.Version, s.last.Store
	}
	if doc.Version < floor {
		return fmt.Sprintf("version %d is older than version %d, in force (store instance %q)", doc.Version, floor, from)
	}
	if known := s.knownStore(); known != "" && doc.Store != "" && doc.Store != known && s.otherStore != doc.Store {
		s.otherStore = doc.Store
		s.log.Warn("the rules store is another instance (restarted without its data, or failed over): its versions count from its own; its document is taken",
			"store", doc.Store, "was", known, "version", doc.Version)
	}
	return ""
}

// knownStore is the store instance of the rules in force, or "".
func (s *Source) knownStore() string {
	if s.hasLast && s.last.Store != "" {
		return s.last.Store
	}
	return s.floorStore
}

// Updates delivers every new document. Run blocks until each is received.
func (s *Source) Updates() <-chan Document { return s.updates }

// Refresh asks for a read of the key now (a reconnection attempt now when
// the store is down). It never blocks.
func (s *Source) Refresh() {
	select {
	case s.refresh <- struct{}{}:
	default:
	}
}

// Up reports whether the Source is subscribed and its last read succeeded.
func (s *Source) Up() bool { return s.up.Load() }

// Errors counts failed connections, subscriptions and reads.
func (s *Source) Errors() uint64 { return s.errors.Load() }

// Run follows the store until ctx is done.
func (s *Source) Run(ctx context.Context) {
	backoff := s.cfg.MinBackoff
	down := false // in a period of failures (logged once, then every minute)
	var downSince, reminded time.Time
	for {
		wasUp, err := s.session(ctx)
		s.up.Store(false)
		if ctx.Err() != nil {
			return
		}
		s.errors.Add(1)
		now := time.Now()
		if wasUp {
			backoff, down = s.cfg.MinBackoff, false
		}
		switch {
		case !down:
			s.log.Error("rules source down; the rules in force stay, retrying", "err", err, "retry_in", backoff)
			down, downSince, reminded = true, now, now
		case now.Sub(reminded) >= time.Minute:
			s.log.Warn("rules source still down; the rules in force stay, retrying", "down_for", now.Sub(downSince).Round(time.Second), "err", err, "retry_in", backoff)
			reminded = now
		default:
			s.log.Debug("rules source still down", "err", err, "retry_in", backoff)
		}
		t := time.NewTimer(time.Duration(float64(backoff) * (0.8 + 0.4*rand.Float64())))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-s.refresh:
			t.Stop()
		case <-t.C:
		}
		backoff = min(2*backoff, s.cfg.MaxBackoff)
	}
}

// session subscribes, reads, and then reads again on every message, every
// resync interval and every refresh, until something fails. wasUp reports
// whether it got as far as a successful first read.
func (s *Source) session(ctx context.Context) (wasUp bool, err error) {
	sub, err := s.store.Subscribe(ctx)
	if err != nil {
		return false, fmt.Errorf("subscribe: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	msgs, errc, done := make(chan struct{}, 1), make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		for {
			if err := sub.Receive(rctx); err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- struct{}{}:
			default: // one pending message is enough: a read gets the latest
			}
		}
	}()
	defer func() {
		cancel()
		sub.Close()
		<-done
	}()

	if err := s.read(ctx, "connect"); err != nil {
		return false, err
	}
	if !s.up.Swap(true) {
		s.log.Info("rules source up", "version", s.last.Version, "resync", s.cfg.Resync)
	}
	resync := time.NewTimer(s.cfg.Resync)
	defer resync.Stop()
	for {
		why := ""
		select {
		case <-ctx.Done():
			return true, nil
		case err := <-errc:
			return true, fmt.Errorf("subscription: %w", err)
		case <-msgs:
			why = "message"
		case <-resync.C:
			why = "resync"
		case <-s.refresh:
			why = "refresh"
		}
		if err := s.read(ctx, why); err != nil {
			return true, err
		}
		resync.Reset(s.cfg.Resync)
	}
}

// read reads the key and hands the document over when it is new.
func (s *Source) read(ctx context.Context, why string) error {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	doc, ok, err := s.store.Read(rctx)
	cancel()
	if err != nil {
		return fmt.Errorf("read the rules: %w", err)
	}
	if !ok {
		if !s.missing {
			s.log.Warn("the rules key does not exist; the rules in force stay")
			s.missing = true
		}
		return nil
	}
	s.missing = false
	if s.hasLast && doc.SHA256 == s.last.SHA256 && doc.Version == s.last.Version {
		s.log.Debug("rules source read: unchanged", "why", why, "version", doc.Version)
		return nil
	}
	if len(doc.Text) > MaxDocumentBytes {
		return s.refuse(doc, fmt.Sprintf("document of more than %d bytes, the limit of a rules document", MaxDocumentBytes))
	}
	if why := s.backwards(doc); why != "" {
		return s.refuse(doc, why)
	}
	s.log.Info("rules source: new document", "why", why, "version", doc.Version, "sha256", doc.SHA256[:12])
	select {
	case s.updates <- doc:
	case <-ctx.Done():
		return nil
	}
	s.last, s.hasLast = doc, true
	return nil
}

// refuse counts a document not handed over (once per document) and
// keeps the rules in force; the Source stays up.
func (s *Source) refuse(doc Document, why string) error {
	if s.refused != doc.SHA256 {
		s.refused = doc.SHA256
		s.errors.Add(1)
		s.log.Error("rules source: document refused; the rules in force stay", "version", doc.Version, "why", why)
	}
	return nil
}
