//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/metrics"
	"github.com/xlimit/xlimit/userspace/rulesource"
)

// ruleSource is the daemon's side of --rules-source: the rules come from a
// Redis key (userspace/rulesource), every accepted document is kept as the
// last good rules, and the daemon starts from that snapshot when Redis does
// not answer.
type ruleSource struct {
	opts    rulesource.Options
	store   *rulesource.Redis
	src     *rulesource.Source
	seed    rulesource.Document // the document in force at start
	fresh   bool                // seed was read from the store at start
	invalid int                 // documents rejected at start, before metrics existed
	version atomic.Int64        // version of the source's document in force; -1 unknown
}

// sourceMetaFile sits beside last-good.yaml: which source and version the
// snapshot is. It counts only while its SHA-256 matches the snapshot (a run
// without --rules-source may have replaced the snapshot since).
const sourceMetaFile = "last-good.source.json"

type sourceMeta struct {
	Source  string `json:"source"`
	Version int64  `json:"version"`
	SHA256  string `json:"sha256"`
}

// startupRules returns the rules to start with: from the rules file as
// loadStartupConfig does, or, with --rules-source, from the store, else the
// local snapshot, else the --config file (bootstrap rules).
func (d *daemon) startupRules(ctx context.Context) (*config.Config, []byte, error) {
	if d.flags.rulesSource == "" {
		return d.loadStartupConfig()
	}
	o, err := rulesource.ParseURL(d.flags.rulesSource)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --rules-source: %v", errUsage, err)
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
		cfg, err := config.Parse(s.docName(doc), doc.Text)
		if err == nil {
			d.log.Info("rules from the rules source", "source", o, "version", doc.Version)
			s.seed, s.fresh = doc, true
			s.version.Store(doc.Version)
			d.rulesSource = s.describe(doc)
			return cfg, doc.Text, nil
		}
		s.invalid++
		d.log.Error("the rules source's document is invalid; it is not applied", "source", o, "version", doc.Version, "err", err)
	}

	text, err := os.ReadFile(d.lastGoodPath())
	if err == nil {
		cfg, perr := config.Parse(d.lastGoodPath(), text)
		if perr == nil {
			// Seeded without a version: the store's first answer is handed
			// over even when it is this very document, so that the rules
			// are then shown as the source's.
			s.seed = rulesource.NewDocument(text, -1)
			s.version.Store(s.snapshotVersion(d.flags.stateDir, text))
			d.log.Warn("RUNNING THE LOCAL SNAPSHOT OF THE RULES until the rules source answers", "file", d.lastGoodPath(), "version", s.version.Load())
			d.rulesSource, d.rulesText = d.lastGoodPath(), text
			return cfg, nil, nil
		}
		d.log.Error("the local snapshot of the rules is invalid", "file", d.lastGoodPath(), "err", perr)
	} else if !errors.Is(err, fs.ErrNotExist) {
		d.log.Error("cannot read the local snapshot of the rules", "err", err)
	}

	if d.flags.config == "" {
		return nil, nil, fmt.Errorf("no rules to start with: the rules source %s gave none, there is no snapshot %s, and no --config", o, d.lastGoodPath())
	}
	data, err := os.ReadFile(d.flags.config)
	var cfg *config.Config
	if err == nil {
		cfg, err = config.Parse(d.flags.config, data)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("load the bootstrap rules: %w", err)
	}
	d.log.Warn("RUNNING THE BOOTSTRAP RULES FILE until the rules source answers", "file", d.flags.config)
	s.seed = rulesource.NewDocument(data, -1)
	d.rulesSource = d.flags.config
	return cfg, data, nil
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
	if s.fresh {
		s.saveMeta(d.flags.stateDir, s.seed)
	}
	s.src = rulesource.New(s.store, rulesource.Config{Resync: s.opts.Resync, Name: s.opts.String(), Logger: d.log})
	s.src.Seed(s.seed)
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

// applySource applies a document from the store, on the loop goroutine,
// with the all-or-nothing of a file reload.
func (d *daemon) applySource(doc rulesource.Document) {
	s := d.src
	if cur, _ := d.Rules(); bytes.Equal(cur, doc.Text) {
		s.version.Store(doc.Version)
		s.saveMeta(d.flags.stateDir, doc)
		d.setRules(doc.Text, s.describe(doc), d.cfg)
		d.log.Info("the rules source's document is the one in force", "version", doc.Version)
		return
	}
	cfg, err := config.Parse(s.docName(doc), doc.Text)
	if err == nil {
		err = d.apply(cfg)
	}
	if err != nil {
		d.metrics.reload("failure")
		d.log.Error("rules from the rules source rejected; the running rules stay in force", "version", doc.Version, "err", err)
		return
	}
	d.metrics.reload("success")
	d.saveLastGood(doc.Text)
	s.saveMeta(d.flags.stateDir, doc)
	s.version.Store(doc.Version)
	d.setRules(doc.Text, s.describe(doc), cfg)
	d.warn(cfg)
	d.log.Info("reloaded from the rules source", "version", doc.Version, "rules", len(cfg.Rules))
}

// onHUP re-reads the rules: the file, or the store at once.
func (d *daemon) onHUP() {
	if d.src != nil && d.src.src != nil {
		d.log.Info("SIGHUP: reading the rules source now")
		d.src.src.Refresh()
		return
	}
	d.reload()
}

// applyFromAPI is PUT /v1/rules: refused while the rules come from a
// rules source, which would overwrite them at its next change anyway.
func (d *daemon) applyFromAPI(text []byte) error {
	if d.src != nil {
		return fmt.Errorf("%w: the rules come from the rules source %s; change them there ('xlimit rules push')", api.ErrRejected, d.src.opts)
	}
	return d.applyAPI(text)
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
func (s *ruleSource) saveMeta(stateDir string, doc rulesource.Document) {
	data, _ := json.Marshal(sourceMeta{Source: s.opts.String(), Version: doc.Version, SHA256: doc.SHA256})
	path := filepath.Join(stateDir, sourceMetaFile)
	if err := os.WriteFile(path+".tmp", data, 0o600); err == nil {
		_ = os.Rename(path+".tmp", path)
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
