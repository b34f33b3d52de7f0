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
	"strings"
	"sync/atomic"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
	"github.com/xlimit/xlimit/userspace/config"
	"github.com/xlimit/xlimit/userspace/durable"
	"github.com/xlimit/xlimit/userspace/metrics"
	"github.com/xlimit/xlimit/userspace/rulesource"
)

// ruleSource is the daemon's side of a rules source: the rules come from a
// Redis key (userspace/rulesource), every accepted document is kept as the
// last good rules, and the daemon starts from that snapshot when Redis does
// not answer. A part: it is given what it prepares documents with and
// where the snapshot is, and is nil without a rules source (its methods
// are nil-safe where the daemon calls them whatever the origin).
type ruleSource struct {
	opts     rulesource.Options
	log      *slog.Logger
	stateDir string
	store    *rulesource.Redis
	src      *rulesource.Source
	seed     rulesource.Document // the document in force at start
	seedFrom string              // the store instance of the snapshot's version ("" unknown)
	invalid  int                 // documents rejected at start, before metrics existed
	version  atomic.Int64        // version of the source's document in force; -1 unknown
}

// sourceMetaFile sits beside last-good.yaml: which source and version the
// snapshot is. It counts only while its SHA-256 matches the snapshot (a run
// without a rules source may have replaced the snapshot since).
const sourceMetaFile = "last-good.source.json"

type sourceMeta struct {
	Source  string `json:"source"`
	Version int64  `json:"version"`
	SHA256  string `json:"sha256"`
	// Store is the store instance (Redis run_id) the version counts on.
	Store string `json:"store,omitempty"`
}

// openRuleSource opens the rules source of --rules-source (url, with the
// password of passwordFile) without reading it yet.
func openRuleSource(url, passwordFile, stateDir string, log *slog.Logger) (*ruleSource, error) {
	o, err := rulesource.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("%w: --rules-source: %v", ErrUsage, err)
	}
	if err := o.SetPassword(passwordFile); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	for _, w := range rulesource.TrustWarnings(o.Redis, "--rules-source") {
		log.Warn("RULES SOURCE OPEN TO THE NETWORK: " + w)
	}
	rulesource.SetClientLogger(log)
	s := &ruleSource{opts: o, log: log, stateDir: stateDir, store: rulesource.Open(o)}
	s.version.Store(-1)
	return s, nil
}

// startup returns the rules to start with: the store's document, else the
// local snapshot at lastGood, else bootstrap's (the --config file; nil
// without one). prepare prepares a document.
func (s *ruleSource) startup(ctx context.Context, prepare func(document) (*prepared, error), lastGood string, bootstrap func() (*prepared, error)) (*prepared, error) {
	o := s.opts
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	doc, ok, err := s.store.Read(rctx)
	cancel()
	why := "" // why the store's document is not the one run: shown as the rules' source
	switch {
	case err != nil:
		s.log.Error("RULES SOURCE UNREACHABLE at start; retrying in the background", "source", o, "err", err)
		why = "the rules source is unreachable"
	case !ok:
		s.log.Warn("the rules source holds no rules yet; push them with 'xlimit rules push'", "source", o, "key", o.Key)
		why = "the rules source holds no rules"
	default:
		p, err := prepare(s.document(doc))
		if err == nil {
			s.log.Info("rules from the rules source", "source", o, "version", doc.Version)
			// Seeded with its version: the store's first answer is this
			// document and needs no apply.
			s.seed = doc
			return p, nil
		}
		s.invalid++
		s.log.Error("the rules source's document is invalid; it is not applied", "source", o, "version", doc.Version, "err", err)
		first, _, _ := strings.Cut(err.Error(), "\n")
		if len(first) > 200 {
			first = first[:200] + "…"
		}
		why = fmt.Sprintf("the rules source's version %d is invalid: %s", doc.Version, first)
	}

	text, err := config.ReadFile(lastGood)
	if err == nil {
		p, perr := prepare(document{origin: FromSnapshot, name: lastGood, label: lastGood + " (local snapshot: " + why + ")", text: text})
		if perr == nil {
			// Seeded without a version: the store's first answer is handed
			// over even when it is this very document, so that the rules
			// are then shown as the source's.
			s.seed = rulesource.NewDocument(text, -1)
			v, from := s.snapshotVersion(text)
			s.version.Store(v)
			s.seedFrom = from
			s.log.Warn("RUNNING THE LOCAL SNAPSHOT OF THE RULES until the rules source answers", "file", lastGood, "version", s.version.Load())
			return p, nil
		}
		s.log.Error("the local snapshot of the rules is invalid", "file", lastGood, "err", perr)
	} else if !errors.Is(err, fs.ErrNotExist) {
		s.log.Error("cannot read the local snapshot of the rules", "err", err)
	}

	if bootstrap == nil {
		return nil, fmt.Errorf("no rules to start with: the rules source %s gave none, there is no snapshot %s, and no --config", o, lastGood)
	}
	p, err := bootstrap()
	if err != nil {
		return nil, fmt.Errorf("load the bootstrap rules: %w", err)
	}
	s.log.Warn("RUNNING THE BOOTSTRAP RULES FILE until the rules source answers", "file", p.doc.name)
	s.seed = rulesource.NewDocument(p.doc.text, -1)
	return p, nil
}

// start follows the store from now on; the returned func stops following.
// Call it once the startup rules are applied and metrics serve (m, nil
// without metrics).
func (s *ruleSource) start(ctx context.Context, m *metricsServer) (stop func()) {
	if s == nil {
		return func() {}
	}
	if m != nil {
		m.collector.WatchRulesSource(s.state)
	}
	for range s.invalid {
		m.reload("failure")
	}
	s.src = rulesource.New(s.store, rulesource.Config{Resync: s.opts.Resync, Name: s.opts.String(), Logger: s.log})
	s.src.Seed(s.seed)
	// The versions only move forward on one store instance, from the
	// snapshot's on.
	if s.seed.Version >= 0 {
		s.src.SeedVersion(s.seed.Version, s.seed.Store)
	} else {
		s.src.SeedVersion(s.version.Load(), s.seedFrom)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.src.Run(ctx)
	}()
	s.log.Info("following the rules source", "source", s.opts, "key", s.opts.Key, "channel", s.opts.Channel, "resync", s.opts.Resync)
	return func() {
		cancel()
		<-done
		if err := s.store.Close(); err != nil {
			s.log.Warn("close the rules source", "err", err)
		}
	}
}

// updates is the channel of new documents; nil (never ready) without a
// rules source or before start.
func (s *ruleSource) updates() <-chan rulesource.Document {
	if s == nil || s.src == nil {
		return nil
	}
	return s.src.Updates()
}

// refresh reads the store now (SIGHUP); false without a rules source
// followed.
func (s *ruleSource) refresh() bool {
	if s == nil || s.src == nil {
		return false
	}
	s.src.Refresh()
	return true
}

// refuseLocal is the API's answer to rules put locally while the rules
// come from the source: an error, or nil without a rules source.
func (s *ruleSource) refuseLocal() error {
	if s == nil {
		return nil
	}
	return fmt.Errorf("%w: the rules come from the rules source %s; change them there ('xlimit rules push')", api.ErrRejected, s.opts)
}

// document is the store's doc on its way to the kernel.
func (s *ruleSource) document(doc rulesource.Document) document {
	return document{origin: FromSource, name: s.docName(doc), label: s.describe(doc), text: doc.Text, src: doc}
}

// committed records that doc is in force and is the snapshot (after the
// snapshot is written).
func (s *ruleSource) committed(doc rulesource.Document) {
	s.saveMeta(doc)
	s.version.Store(doc.Version)
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
func (s *ruleSource) saveMeta(doc rulesource.Document) {
	data, err := json.Marshal(sourceMeta{Source: s.opts.String(), Version: doc.Version, SHA256: doc.SHA256, Store: doc.Store})
	if err == nil {
		err = durable.WriteFile(filepath.Join(s.stateDir, sourceMetaFile), data, 0o600)
	}
	if err != nil {
		s.log.Warn("cannot record the version of the rules snapshot", "err", err)
	}
}

// snapshotVersion is the version recorded for the snapshot text, or -1,
// and the store instance it counts on ("" unknown).
func (s *ruleSource) snapshotVersion(text []byte) (int64, string) {
	data, err := os.ReadFile(filepath.Join(s.stateDir, sourceMetaFile))
	if err != nil {
		return -1, ""
	}
	var m sourceMeta
	if json.Unmarshal(data, &m) != nil || m.SHA256 != rulesource.NewDocument(text, 0).SHA256 {
		return -1, ""
	}
	return m.Version, m.Store
}
