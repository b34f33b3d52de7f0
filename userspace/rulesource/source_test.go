package rulesource

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// fakeStore is a Store in memory. Publish announces a change to every live
// subscription; Set changes the document silently (a lost message).
type fakeStore struct {
	mu            sync.Mutex
	doc           Document
	exists        bool
	failSubscribe int   // the next this many Subscribe calls fail
	readErr       error // every Read fails with it while set
	subs          []*fakeSub
	subscribes    int
	reads         int
	server        string // Document.Store of every read
}

type fakeSub struct {
	msgs   chan struct{}
	broken chan struct{}
	once   sync.Once
}

func (f *fakeStore) Read(ctx context.Context) (Document, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	if f.readErr != nil {
		return Document{}, false, f.readErr
	}
	d := f.doc
	d.Store = f.server
	return d, f.exists, nil
}

func (f *fakeStore) Subscribe(ctx context.Context) (Subscription, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subscribes++
	if f.failSubscribe > 0 {
		f.failSubscribe--
		return nil, errors.New("connection refused")
	}
	s := &fakeSub{msgs: make(chan struct{}, 16), broken: make(chan struct{})}
	f.subs = append(f.subs, s)
	return s, nil
}

func (s *fakeSub) Receive(ctx context.Context) error {
	select {
	case <-s.msgs:
		return nil
	case <-s.broken:
		return errors.New("connection reset")
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *fakeSub) Close() error { s.cut(); return nil }
func (s *fakeSub) cut()         { s.once.Do(func() { close(s.broken) }) }

func (f *fakeStore) Set(text string, version int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.doc, f.exists = NewDocument([]byte(text), version), true
}

func (f *fakeStore) Publish(text string, version int64) {
	f.Set(text, version)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.subs {
		select {
		case s.msgs <- struct{}{}:
		case <-s.broken:
		}
	}
}

// CutSubscriptions breaks every live subscription (CLIENT KILL TYPE pubsub).
func (f *fakeStore) CutSubscriptions() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.subs {
		s.cut()
	}
	f.subs = nil
}

// collect records what a Source delivers, with the fake time of delivery.
type collect struct {
	mu   sync.Mutex
	docs []Document
	at   []time.Time
}

func (c *collect) run(ctx context.Context, src *Source) {
	for {
		var d Document
		select {
		case d = <-src.Updates():
		case <-ctx.Done():
			return
		}
		c.mu.Lock()
		c.docs = append(c.docs, d)
		c.at = append(c.at, time.Now())
		c.mu.Unlock()
	}
}

func (c *collect) versions() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var v []int64
	for _, d := range c.docs {
		v = append(v, d.Version)
	}
	return v
}

// start runs a Source over store in the bubble; the returned func stops it.
func start(t *testing.T, store Store, cfg Config, seed *Document) (*Source, *collect, func()) {
	src := New(store, cfg)
	if seed != nil {
		src.Seed(*seed)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &collect{}
	done := make(chan struct{})
	go func() { src.Run(ctx); close(done) }()
	go c.run(ctx, src)
	return src, c, func() { cancel(); <-done }
}

func TestSourceFollowsMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		f.Set("rules: []\n", 1)
		src, c, stop := start(t, f, Config{Resync: 30 * time.Second}, nil)
		defer stop()
		synctest.Wait()
		if !src.Up() || !slices.Equal(c.versions(), []int64{1}) {
			t.Fatalf("after connecting: up %v, delivered %v, want up and [1]", src.Up(), c.versions())
		}
		t0 := time.Now()
		f.Publish("rules: [] # 2\n", 2)
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{1, 2}) || !c.at[1].Equal(t0) {
			t.Fatalf("after a message: delivered %v at %v, want [1 2] at once", c.versions(), c.at)
		}
		// A message without a change (a push of the same text bumps the
		// version, so this is a spurious message) delivers nothing.
		f.mu.Lock()
		f.subs[0].msgs <- struct{}{}
		f.mu.Unlock()
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{1, 2}) {
			t.Fatalf("a message without a change delivered %v", c.versions())
		}
		if src.Errors() != 0 {
			t.Errorf("errors %d, want 0", src.Errors())
		}
	})
}

// TestSourceResyncCatchesLostMessage: a change without a message (lost
// PUBLISH) is delivered at the next resync, not before.
func TestSourceResyncCatchesLostMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		f.Set("a\n", 1)
		_, c, stop := start(t, f, Config{Resync: 10 * time.Second}, nil)
		defer stop()
		synctest.Wait()
		t0 := time.Now()
		time.Sleep(3 * time.Second)
		f.Set("b\n", 2) // silently
		time.Sleep(6 * time.Second)
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{1}) {
			t.Fatalf("before the resync: delivered %v, want [1]", c.versions())
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{1, 2}) || c.at[1].Sub(t0) != 10*time.Second {
			t.Fatalf("delivered %v at %v, want [1 2] with 2 at +10s", c.versions(), c.at)
		}
		// A text set by hand without a version is a change too.
		f.Set("c\n", 2)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if len(c.docs) != 3 || string(c.docs[2].Text) != "c\n" {
			t.Fatalf("a new text under the same version was not delivered: %v", c.versions())
		}
	})
}

// TestSourceSeed: the document already in force is not delivered again.
func TestSourceSeed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		f.Set("a\n", 7)
		seed := NewDocument([]byte("a\n"), 7)
		src, c, stop := start(t, f, Config{}, &seed)
		defer stop()
		synctest.Wait()
		if !src.Up() || len(c.versions()) != 0 {
			t.Fatalf("up %v, delivered %v; want up and nothing", src.Up(), c.versions())
		}
	})
}

// TestSourceBackoff: while the store refuses, attempts are spaced by a
// doubling, jittered, capped backoff; the first success delivers the
// document and reports up.
func TestSourceBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{failSubscribe: 8}
		f.Set("a\n", 3)
		src, c, stop := start(t, f, Config{MinBackoff: time.Second, MaxBackoff: 8 * time.Second}, nil)
		defer stop()
		// Attempts at 0, then after waits of 1, 2, 4, 8, 8, 8, 8, 8 s ± 20 %.
		var attempts []time.Time
		for len(attempts) < 9 {
			synctest.Wait()
			f.mu.Lock()
			n := f.subscribes
			f.mu.Unlock()
			for len(attempts) < n {
				attempts = append(attempts, time.Now())
			}
			if !src.Up() && len(c.versions()) != 0 {
				t.Fatal("delivered while down")
			}
			time.Sleep(10 * time.Millisecond)
		}
		want := []time.Duration{1, 2, 4, 8, 8, 8, 8, 8}
		for i, w := range want {
			got := attempts[i+1].Sub(attempts[i])
			lo, hi := w*time.Second*8/10, w*time.Second*12/10+10*time.Millisecond
			if got < lo || got > hi {
				t.Errorf("wait %d: %v, want %v ± 20 %%", i, got, w*time.Second)
			}
		}
		synctest.Wait()
		if !src.Up() || !slices.Equal(c.versions(), []int64{3}) || src.Errors() != 8 {
			t.Fatalf("after recovery: up %v, delivered %v, errors %d; want up, [3], 8", src.Up(), c.versions(), src.Errors())
		}
	})
}

// TestSourceReconnectReads: a cut subscription reconnects after the
// minimum backoff and reads the document, catching a push made while it
// was cut; a store whose reads fail is down.
func TestSourceReconnectReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		f.Set("a\n", 1)
		src, c, stop := start(t, f, Config{MinBackoff: 500 * time.Millisecond, Resync: time.Hour}, nil)
		defer stop()
		synctest.Wait()
		f.CutSubscriptions()
		f.Publish("b\n", 2) // nobody hears it
		synctest.Wait()
		if src.Up() {
			t.Fatal("up with the subscription cut")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !src.Up() || !slices.Equal(c.versions(), []int64{1, 2}) {
			t.Fatalf("after reconnecting: up %v, delivered %v; want up, [1 2]", src.Up(), c.versions())
		}

		f.mu.Lock()
		f.readErr = errors.New("LOADING")
		f.mu.Unlock()
		src.Refresh()
		synctest.Wait()
		if src.Up() || src.Errors() != 2 {
			t.Fatalf("with reads failing: up %v, errors %d; want down, 2", src.Up(), src.Errors())
		}
		f.mu.Lock()
		f.readErr = nil
		f.mu.Unlock()
		f.Set("c\n", 3)
		src.Refresh() // a refresh while down retries at once
		synctest.Wait()
		if !src.Up() || !slices.Equal(c.versions(), []int64{1, 2, 3}) {
			t.Fatalf("after refresh: up %v, delivered %v", src.Up(), c.versions())
		}
	})
}

// TestSourceMissingKey: no document is no update, and the source is up.
func TestSourceMissingKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		src, c, stop := start(t, f, Config{Resync: time.Second}, nil)
		defer stop()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if !src.Up() || len(c.versions()) != 0 {
			t.Fatalf("up %v, delivered %v", src.Up(), c.versions())
		}
		f.Publish("a\n", 1)
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{1}) {
			t.Fatalf("delivered %v", c.versions())
		}
	})
}

// TestSourceVersionsMoveForward: a document of a lower version than the
// one in force (a stale replica, a restored backup) is refused, counted
// and logged once, and the Source stays up; so is one below the version
// of the snapshot in force at start (SeedVersion).
func TestSourceVersionsMoveForward(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		f.Set("v5\n", 5)
		src, c, stop := start(t, f, Config{Resync: 10 * time.Second}, nil)
		defer stop()
		synctest.Wait()
		f.Publish("v3\n", 3)
		synctest.Wait()
		time.Sleep(25 * time.Second) // two resyncs read it again
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{5}) || src.Errors() != 1 || !src.Up() {
			t.Fatalf("after an older version: delivered %v, errors %d, up %v; want [5], 1, up", c.versions(), src.Errors(), src.Up())
		}
		f.Publish("v6\n", 6)
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{5, 6}) {
			t.Fatalf("after a newer version: delivered %v, want [5 6]", c.versions())
		}
	})
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		f.Set("v2\n", 2)
		seed := NewDocument([]byte("snapshot\n"), -1)
		src := New(f, Config{Resync: 10 * time.Second})
		src.Seed(seed)
		src.SeedVersion(4, "")
		ctx, cancel := context.WithCancel(context.Background())
		c := &collect{}
		done := make(chan struct{})
		go func() { src.Run(ctx); close(done) }()
		go c.run(ctx, src)
		defer func() { cancel(); <-done }()
		synctest.Wait()
		if len(c.docs) != 0 || src.Errors() != 1 {
			t.Fatalf("version 2 under a snapshot of version 4: delivered %v, errors %d", c.versions(), src.Errors())
		}
		f.Publish("v4\n", 4)
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{4}) {
			t.Fatalf("the snapshot's version: delivered %v, want [4]", c.versions())
		}
	})
}

// TestSourceSizeCap: a document over MaxDocumentBytes is refused and the
// Source stays up.
func TestSourceSizeCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{}
		f.Set(string(make([]byte, MaxDocumentBytes+1)), 1)
		src, c, stop := start(t, f, Config{Resync: 10 * time.Second}, nil)
		defer stop()
		synctest.Wait()
		if len(c.docs) != 0 || src.Errors() != 1 || !src.Up() {
			t.Fatalf("a document of %d bytes: delivered %v, errors %d, up %v", MaxDocumentBytes+1, c.versions(), src.Errors(), src.Up())
		}
	})
}

// TestSourceStoreRestart: the versions move forward on one store instance
// only (issue 41, M3). A Redis restarted without persistence, or a
// replica promoted, counts again from its own versions: a running Source
// takes its document, as a daemon started then does, instead of refusing
// every push until the counter passes the old value (a fleet split). On
// the same instance, an older version is still refused.
func TestSourceStoreRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{server: "run-a"}
		f.Set("v12\n", 12)
		src, c, stop := start(t, f, Config{Resync: 10 * time.Second}, nil)
		defer stop()
		synctest.Wait()
		f.Publish("replay\n", 3) // the same instance: refused
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{12}) || src.Errors() != 1 {
			t.Fatalf("an older version on the same store: delivered %v, errors %d; want [12], 1", c.versions(), src.Errors())
		}
		f.mu.Lock()
		f.server, f.exists = "run-b", false // restarted, empty
		f.mu.Unlock()
		f.CutSubscriptions()
		time.Sleep(time.Second)
		synctest.Wait()
		f.Publish("new\n", 1) // the first push to the new instance
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{12, 1}) {
			t.Fatalf("the first push after the store restarted: delivered %v, want [12 1]", c.versions())
		}
		f.Publish("replay\n", 0)
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{12, 1}) {
			t.Fatalf("an older version on the new store: delivered %v, want [12 1]", c.versions())
		}
	})
	// A daemon started from its snapshot (version 12 of store run-a) takes
	// the document of another instance.
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStore{server: "run-b"}
		f.Set("new\n", 1)
		src := New(f, Config{Resync: 10 * time.Second})
		src.Seed(NewDocument([]byte("snapshot\n"), -1))
		src.SeedVersion(12, "run-a")
		ctx, cancel := context.WithCancel(context.Background())
		c := &collect{}
		done := make(chan struct{})
		go func() { src.Run(ctx); close(done) }()
		go c.run(ctx, src)
		defer func() { cancel(); <-done }()
		synctest.Wait()
		if !slices.Equal(c.versions(), []int64{1}) {
			t.Fatalf("version 1 of another store under a snapshot of version 12: delivered %v, want [1]", c.versions())
		}
	})
}
