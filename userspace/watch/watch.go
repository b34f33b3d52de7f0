// Package watch tells the daemon when its rules file changed.
//
// It watches the file's directory rather than the file, because editors
// and configuration tools rarely write a file in place: vim, sed -i,
// Ansible and Kubernetes ConfigMap volumes write a new file and rename it
// over the old one (or swap a symlink), which ends any watch on the old
// file. Events in the directory are filtered by name, debounced (a save is
// often several events), and then the file is read: a Change is delivered
// only when what the file holds differs from what the previous Change (or
// New) saw, so a touch, a chmod or a save without edits does not make the
// daemon reload. A file that is deleted is reported once (Exists false);
// when it is created again, its content is reported.
//
// When the rules file is a symlink, its target's directory is watched too
// and any event in the link's directory counts (a ConfigMap volume swaps a
// "..data" symlink, not the file's name). When the watched directory itself
// goes away, the watcher retries every second until it is back.
package watch

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Defaults.
const (
	DefaultDebounce = 250 * time.Millisecond
	// DefaultMaxSize bounds what is read of the file.
	DefaultMaxSize = 16 << 20
)

// retryInterval is how often a lost directory watch is re-added (a
// variable for tests).
var retryInterval = time.Second

// Change is the state of the file after a change.
type Change struct {
	Path string
	// Exists is false when the file is gone (deleted, or renamed away);
	// the daemon should keep its rules and say so.
	Exists bool
	// Data is what the file held when it was read; nil when it does not
	// exist or could not be read.
	Data []byte
	// SHA256 is the hash of Data.
	SHA256 [32]byte
	// Err is why an existing file could not be read (permissions, larger
	// than the size limit, ...).
	Err error
}

// Options configure New.
type Options struct {
	// Debounce is how long the directory must stay quiet after an event
	// before the file is read (default DefaultDebounce).
	Debounce time.Duration
	// MaxSize is the most bytes read of the file (default DefaultMaxSize);
	// a larger file is reported with Err.
	MaxSize int64
	// Logger (default: discard).
	Logger *slog.Logger
}

// Watcher watches one file. Its Changes channel has room for one Change:
// when the receiver is slow, an undelivered Change is replaced by the
// newer one, never queued behind it.
type Watcher struct {
	path    string
	opts    Options
	log     *slog.Logger
	fsw     *fsnotify.Watcher
	changes chan Change
	stop    chan struct{}
	done    chan struct{}

	dirs map[string]bool // directories watched (true) or lost (false)
	last state           // what the last Change (or New) saw
	link bool            // path is a symlink

	closeOnce sync.Once
	closeErr  error
}

type state struct {
	exists bool
	sum    [32]byte
	data   []byte
	err    string
}

func (s *state) same(o *state) bool {
	return s.exists == o.exists && s.sum == o.sum && s.err == o.err
}

// New starts watching path. The directory holding it must exist; the file
// need not (its creation is then a Change).
func New(path string, opts Options) (*Watcher, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.MaxSize <= 0 {
		opts.MaxSize = DefaultMaxSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", path, err)
	}
	w := &Watcher{
		path: abs, opts: opts, log: opts.Logger, fsw: fsw,
		changes: make(chan Change, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		dirs:    map[string]bool{},
	}
	if err := fsw.Add(filepath.Dir(abs)); err != nil {
		fsw.Close()
		return nil, fmt.Errorf("watch %s: %w", filepath.Dir(abs), err)
	}
	w.dirs[filepath.Dir(abs)] = true
	w.followLink()
	w.last = w.read()
	go w.loop()
	return w, nil
}

// Changes delivers the file's changes. It is closed by Close.
func (w *Watcher) Changes() <-chan Change { return w.changes }

// Close stops watching and closes the Changes channel. It is idempotent.
func (w *Watcher) Close() error {
	w.closeOnce.Do(func() {
		close(w.stop)
		<-w.done
		if err := w.fsw.Close(); err != nil {
			w.closeErr = fmt.Errorf("close watch of %s: %w", w.path, err)
		}
	})
	return w.closeErr
}

func (w *Watcher) loop() {
	defer close(w.done)
	defer close(w.changes)
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	defer debounce.Stop()
	var retry *time.Ticker
	var retryC <-chan time.Time
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		select {
		case <-w.stop:
			return
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return
			}
			if _, watched := w.dirs[ev.Name]; watched && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				w.log.Warn("the directory of the rules file went away; retrying every second", "dir", ev.Name)
				w.dirs[ev.Name] = false
				if retry == nil {
					retry = time.NewTicker(retryInterval)
					retryC = retry.C
				}
			}
			if w.relevant(ev.Name) {
				debounce.Reset(w.opts.Debounce)
			}
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return
			}
			// On an overflow events were lost: look at the file.
			w.log.Warn("watching the rules file", "err", err)
			debounce.Reset(w.opts.Debounce)
		case <-retryC:
			if w.readd() {
				retry.Stop()
				retry, retryC = nil, nil
				// Whatever happened while nothing watched: look.
				debounce.Reset(w.opts.Debounce)
			}
		case <-debounce.C:
			w.followLink()
			w.check()
		}
	}
}

// relevant reports whether an event on name may have changed the file.
func (w *Watcher) relevant(name string) bool {
	if name == w.path || w.link && filepath.Dir(name) == filepath.Dir(w.path) {
		return true
	}
	if _, watched := w.dirs[name]; watched {
		return true
	}
	target, err := filepath.EvalSymlinks(w.path)
	return err == nil && name == target
}

// followLink watches the directory of the symlink's target (and stops
// watching the previous one) when the file is a symlink.
func (w *Watcher) followLink() {
	fi, err := os.Lstat(w.path)
	w.link = err == nil && fi.Mode()&fs.ModeSymlink != 0
	own := filepath.Dir(w.path)
	want := ""
	if w.link {
		if target, err := filepath.EvalSymlinks(w.path); err == nil {
			if d := filepath.Dir(target); d != own {
				want = d
			}
		}
	}
	for d := range w.dirs {
		if d != own && d != want {
			_ = w.fsw.Remove(d)
			delete(w.dirs, d)
		}
	}
	if want != "" && !w.dirs[want] {
		if err := w.fsw.Add(want); err != nil {
			w.log.Warn("cannot watch the directory of the rules file's target", "dir", want, "err", err)
			return
		}
		w.dirs[want] = true
	}
}

// readd re-adds lost directory watches and reports whether all are back.
func (w *Watcher) readd() bool {
	all := true
	for d, ok := range w.dirs {
		if ok {
			continue
		}
		if err := w.fsw.Add(d); err != nil {
			all = false
			continue
		}
		w.log.Info("watching the directory of the rules file again", "dir", d)
		w.dirs[d] = true
	}
	return all
}

func (w *Watcher) read() state {
	f, err := os.Open(w.path)
	if errors.Is(err, fs.ErrNotExist) {
		return state{}
	}
	if err != nil {
		return state{exists: true, err: err.Error()}
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, io.LimitReader(f, w.opts.MaxSize+1)); err != nil {
		return state{exists: true, err: fmt.Sprintf("read %s: %v", w.path, err)}
	}
	if int64(buf.Len()) > w.opts.MaxSize {
		return state{exists: true, err: fmt.Sprintf("read %s: larger than %d bytes", w.path, w.opts.MaxSize)}
	}
	return state{exists: true, data: buf.Bytes(), sum: sha256.Sum256(buf.Bytes())}
}

// check reads the file and delivers a Change if it differs from the last.
func (w *Watcher) check() {
	s := w.read()
	if s.same(&w.last) {
		return
	}
	w.last = s
	c := Change{Path: w.path, Exists: s.exists, Data: s.data, SHA256: s.sum}
	if s.err != "" {
		c.Err = errors.New(s.err)
	}
	w.log.Debug("rules file changed", "path", w.path, "exists", c.Exists, "err", c.Err)
	// Latest wins: replace an undelivered Change.
	select {
	case w.changes <- c:
	default:
		select {
		case <-w.changes:
		default:
		}
		w.changes <- c
	}
}
