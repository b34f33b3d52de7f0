//go:build linux

package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/durable"
	"github.com/xlimit/xlimit/userspace/metrics"
	"github.com/xlimit/xlimit/userspace/rulesource"
)

// ruleSource is the daemon's side of a rules source: the rules come from a
// Redis key (userspace/rulesource), every accepted document is kept as the
// last good rules, and the daemon starts from that snapshot when Redis does
// not answer.
type ruleSource struct {
	opts    rulesource.Options
	store   *rulesource.Redis
	src     *rulesource.Source
	seed    rulesource.Document // the document in force at start
	invalid int                 // documents rejected at start, before metrics existed
	version atomic.Int64        // version of the source's document in force; -1 unknown
}

// sourceMetaFile sits beside last-good.yaml: which source and version the
// snapshot is. It counts only while its SHA-256 matches the snapshot (a run
// without a rules source may have replaced the snapshot since).
const sourceMetaFile = "last-good.source.json"

type sourceMeta struct {
	Source  string `json:"source"`
	Version int64  `json:"version"`
	SHA256  string `json:"sha256"`
}

// startupFromSource returns the rules to start with under a rules source:
// the store's document, else the local snapshot, else the --config file
// (bootstrap rules).
func (d *daemon) startupFromSource(ctx context.Context) (*prepared, error) {
	o, err := rulesource.ParseURL(d.opts.RulesSource)
	if err != nil {
		return nil, fmt.Errorf("%w: --rules-source: %v", ErrUsage, err)
	}
	if err := o.SetPassword(d.opts.RulesSourcePasswordFile); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	rulesource.SetClientLogger(d.log)
	s := &ruleSource{opts: o, store: rulesource.Open(o)}
	s.version.Store(-1)
	d.src = s

	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	doc, ok, err := s.store.Read(rctx)
	cancel()
	switch {
	case err != nil:
		d.log.Error("RULES SOURCE UNREACHABLE at start; retrying in the background", "source", o, "err", err)
	case !ok:
		d.log.Warn("the rules source holds no rules yet; push them with 'xlimit rules push'", "source", o, "key", o.Key)
	default:
		p, err := d.prepare(document{origin: FromSource, name: s.docName(doc), label: s.describe(doc), text: doc.Text, src: doc})
		if err == nil {
			d.log.Info("rules from the rules source", "source", o, "version", doc.Version)
			// Seeded with its version: the store's first answer is this
			// document and needs no apply.
			s.seed = doc
			return p, nil
		}
		s.invalid++
		d.log.Error("the rules source's document is invalid; it is not applied", "source", o, "version", doc.Version, "err", err)
	}

	text, err := config.ReadFile(d.lastGoodPath())
	if err == nil {
		p, perr := d.prepare(document{origin: FromSnapshot, name: d.lastGoodPath(), label: d.lastGoodPath(), text: text})
		if perr == nil {
			// Seeded without a version: the store's first answer is handed
			// over even when it is this very document, so that the rules
			// are then shown as the source's.
			s.seed = rulesource.NewDocument(text, -1)
			s.version.Store(s.snapshotVersion(d.opts.StateDir, text))
			d.log.Warn("RUNNING THE LOCAL SNAPSHOT OF THE RULES until the rules source answers", "file", d.lastGoodPath(), "version", s.version.Load())
			return p, nil
		}
		d.log.Error("the local snapshot of the rules is invalid", "file", d.lastGoodPath(), "err", perr)
	} else if !errors.Is(err, fs.ErrNotExist) {
		d.log.Error("cannot read the local snapshot of the rules", "err", err)
	}

	if d.opts.Config == "" {
		return nil, fmt.Errorf("no rules to start with: the rules source %s gave none, there is no snapshot %s, and no --config", o, d.lastGoodPath())
	}
	p, err := d.prepareFile(FromBootstrap)
	if err != nil {
		return nil, fmt.Errorf("load the bootstrap rules: %w", err)
	}
	d.log.Warn("RUNNING THE BOOTSTRAP RULES FILE until the rules source answers", "file", d.opts.Config)
	s.seed = rulesource.NewDocument(p.doc.text, -1)
	return p, nil
}

// startRulesSource follows the store from now on; the returned func stops
// following. Call it once the startup rules are applied and metrics serve.
func (d *daemon) startRulesSource(ctx context.Context) (stop func()) {
	s := d.src
	if s == nil {
		return func() {}
	}
	if d.metrics != nil {
		d.metrics.collector.WatchRulesSource(s.state)
	}
	for range s.invalid {
		d.metrics.reload("failure")
	}
	s.src = rulesource.New(s.store, rulesource.Config{Resync: s.opts.Resync, Name: s.opts.String(), Logger: d.log})
	s.src.Seed(s.seed)
	// The versions only move forward, from the snapshot's on.
	s.src.SeedVersion(max(s.seed.Version, s.version.Load()))
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.src.Run(ctx)
	}()
	d.log.Info("following the rules source", "source", s.opts, "key", s.opts.Key, "channel", s.opts.Channel, "resync", s.opts.Resync)
	return func() {
		cancel()
		<-done
		if err := s.store.Close(); err != nil {
			d.log.Warn("close the rules source", "err", err)
		}
	}
}

// sourceUpdates is the channel of new documents; nil (never ready) without
// a rules source.
func (d *daemon) sourceUpdates() <-chan rulesource.Document {
	if d.src == nil || d.src.src == nil {
		return nil
	}
	return d.src.src.Updates()
}

// docName names a document in validation errors: KEY@vVERSION:LINE: ...
func (s *ruleSource) docName(doc rulesource.Document) string {
	return fmt.Sprintf("%s@v%d", s.opts.Key, doc.Version)
}

// describe is the rules' source in GET /v1/rules and the API's status.
func (s *ruleSource) describe(doc rulesource.Document) string {
	return fmt.Sprintf("%s key %s version %d", s.opts, s.opts.Key, doc.Version)
}

func (s *ruleSource) state() metrics.RulesSource {
	st := metrics.RulesSource{Version: s.version.Load()}
	if s.src != nil {
		st.Up, st.Errors = s.src.Up(), s.src.Errors()
	}
	return st
}

// saveMeta records which document the snapshot is (after saveLastGood).
func (s *ruleSource) saveMeta(stateDir string, doc rulesource.Document, log *slog.Logger) {
	data, err := json.Marshal(sourceMeta{Source: s.opts.String(), Version: doc.Version, SHA256: doc.SHA256})
	if err == nil {
		err = durable.WriteFile(filepath.Join(stateDir, sourceMetaFile), data, 0o600)
	}
	if err != nil {
		log.Warn("cannot record the version of the rules snapshot", "err", err)
	}
}

// snapshotVersion is the version recorded for the snapshot text, or -1.
func (s *ruleSource) snapshotVersion(stateDir string, text []byte) int64 {
	data, err := os.ReadFile(filepath.Join(stateDir, sourceMetaFile))
	if err != nil {
		return -1
	}
	var m sourceMeta
	if json.Unmarshal(data, &m) != nil || m.SHA256 != rulesource.NewDocument(text, 0).SHA256 {
		return -1
	}
	return m.Version
}
