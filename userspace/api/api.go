// Package api is xlimit's local HTTP API, served by the daemon on a unix
// socket (`xlimit run --api-socket`, mode 0600):
//
//	GET  /v1/status    rules, rates in force and counters (the schema of `xlimit status --json`)
//	GET  /v1/rules     the rules text in force, its source and its SHA-256 (also the ETag)
//	PUT  /v1/rules     replace the rules: body = YAML, validated like a file named "api"
//	                   (?confirm=DURATION: reverted unless confirmed in time, confirm.go)
//	POST /v1/rules/confirm  confirm rules applied with ?confirm
//	POST /v1/feedback  a protected service's own queueing delay and error counts
//
// Every answer is JSON; every error is an ErrorResponse. The package knows
// the daemon only through the Daemon interface, so it is tested with a fake
// and never touches the kernel.
package api

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/xlimit/xlimit/userspace/config"
)

// Daemon is what the API needs of the daemon. Its methods may be called
// from several goroutines at once, except ApplyRules, which the API calls
// from one request at a time.
type Daemon interface {
	// Status reads the rules, rates and counters of every interface.
	Status() (StatusReport, error)
	// Rules returns the rules text in force and where it came from (a
	// file path, "api", or the last good file of the state directory).
	Rules() (text []byte, source string)
	// ApplyRules applies and persists a rules document that config.Parse
	// accepted. All or nothing: on error the running rules stay. Wrap
	// ErrRejected around errors that are the document's fault (it does not
	// compile for the data plane); any other error is a server error.
	ApplyRules(text []byte) error
	// Feedback hands a validated feedback sample to the control plane.
	// Wrap ErrUnknownRule (404) or ErrRejected (422, e.g. the rule does not
	// take feedback) where they apply.
	Feedback(Feedback) error
	// RuleExists reports whether a rule of that name is in force.
	RuleExists(name string) bool
}

var (
	// ErrUnknownRule marks an error about a rule that is not in force.
	ErrUnknownRule = errors.New("unknown rule")
	// ErrRejected marks a request that is well-formed but that the daemon
	// refuses (HTTP 422).
	ErrRejected = errors.New("rejected")
)

// Body limits.
const (
	MaxRulesBytes    = config.MaxDocumentBytes
	MaxFeedbackBytes = 64 << 10
)

// rulesMediaTypes are the Content-Types accepted by PUT /v1/rules (an
// absent Content-Type is accepted too).
var rulesMediaTypes = []string{"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain"}

type handler struct {
	d      Daemon
	log    *slog.Logger
	routes map[string]map[string]http.HandlerFunc // path -> method -> handler
	putMu  sync.Mutex                             // one PUT /v1/rules at a time: If-Match and apply are one step
}

// Handler returns the API's http.Handler. log may be nil.
func Handler(d Daemon, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &handler{d: d, log: log}
	h.routes = map[string]map[string]http.HandlerFunc{
		"/v1/status":        {http.MethodGet: h.getStatus},
		"/v1/rules":         {http.MethodGet: h.getRules, http.MethodPut: h.putRules},
		"/v1/feedback":      {http.MethodPost: h.postFeedback},
		"/v1/rules/confirm": {http.MethodPost: h.postConfirm},
	}
	return h
}

// ServeHTTP routes by path, then by method, so that a known path with
// another method gets 405 with an Allow header, and every answer is JSON.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		// A panicking Daemon must not take the connection (or, with
		// http.ErrAbortHandler semantics, the log) down silently.
		if v := recover(); v != nil {
			h.log.Error("api: handler panicked", "method", r.Method, "path", r.URL.Path, "panic", v)
			writeError(w, http.StatusInternalServerError, fmt.Sprintf("internal error: %v", v), nil)
		}
	}()
	w.Header().Set("Cache-Control", "no-store")
	methods, ok := h.routes[r.URL.Path]
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such endpoint %s (see /v1/status, /v1/rules, /v1/feedback)", r.URL.Path), nil)
		return
	}
	fn, ok := methods[r.Method]
	if !ok {
		allow := make([]string, 0, len(methods))
		for m := range methods {
			allow = append(allow, m)
		}
		slices.Sort(allow)
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", ")), nil)
		return
	}
	fn(w, r)
}

func (h *handler) getStatus(w http.ResponseWriter, r *http.Request) {
	rep, err := h.d.Status()
	if err != nil {
		h.log.Warn("api: status failed", "err", err)
		writeError(w, http.StatusInternalServerError, fmt.Sprintf("read status: %v", err), nil)
		return
	}
	// ?iface=X (repeatable) narrows the report to those interfaces.
	if want := r.URL.Query()["iface"]; len(want) > 0 {
		rep.Interfaces = slices.DeleteFunc(rep.Interfaces, func(s IfaceStatus) bool { return !slices.Contains(want, s.Iface) })
	}
	if rep.Interfaces == nil {
		rep.Interfaces = []IfaceStatus{}
	}
	writeJSON(w, http.StatusOK, rep)
}

func (h *handler) getRules(w http.ResponseWriter, _ *http.Request) {
	text, source := h.d.Rules()
	sum := hexSHA256(text)
	w.Header().Set("ETag", `"`+sum+`"`)
	writeJSON(w, http.StatusOK, RulesDocument{Source: source, SHA256: sum, Text: string(text)})
}

func (h *handler) putRules(w http.ResponseWriter, r *http.Request) {
	if !mediaTypeOK(w, r, rulesMediaTypes) {
		return
	}
	within, err := confirmParam(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error(), nil)
		return
	}
	confirmer, canConfirm := h.d.(Confirmer)
	if within > 0 && !canConfirm {
		writeError(w, http.StatusNotImplemented, "this daemon takes no confirmations", nil)
		return
	}
	data, ok := readBody(w, r, MaxRulesBytes)
	if !ok {
		return
	}
	cfg, err := config.Parse("api", data)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid rules", errorLines(err))
		return
	}

	h.putMu.Lock()
	defer h.putMu.Unlock()
	if tags := r.Header.Get("If-Match"); tags != "" {
		cur, _ := h.d.Rules()
		if sum := hexSHA256(cur); !etagMatches(tags, sum) {
			writeError(w, http.StatusPreconditionFailed, fmt.Sprintf("the rules in force changed (sha256 now %s); read them again", sum), nil)
			return
		}
	}
	var revertAt time.Time
	if within > 0 {
		revertAt, err = confirmer.ApplyRulesConfirm(data, within)
	} else {
		err = h.d.ApplyRules(data)
	}
	if err != nil {
		switch lines := config.Errors(err); {
		case len(lines) > 0:
			writeError(w, http.StatusBadRequest, "invalid rules", errorLines(err))
		case errors.Is(err, ErrRejected):
			writeError(w, http.StatusUnprocessableEntity, err.Error(), nil)
		default:
			h.log.Error("api: applying rules failed; the running rules stay", "err", err)
			writeError(w, http.StatusInternalServerError, fmt.Sprintf("apply rules: %v", err), nil)
		}
		return
	}
	res := RulesApplied{Applied: true, SHA256: hexSHA256(data), Rules: []string{}, Interfaces: cfg.Interfaces}
	for i := range cfg.Rules {
		res.Rules = append(res.Rules, cfg.Rules[i].Name)
	}
	for _, warn := range cfg.Warnings {
		res.Warnings = append(res.Warnings, warn.Error())
	}
	h.log.Info("api: rules applied", "rules", len(cfg.Rules), "sha256", res.SHA256)
	w.Header().Set("ETag", `"`+res.SHA256+`"`)
	if within > 0 {
		writeJSON(w, http.StatusOK, RulesPending{RulesApplied: res, RevertAt: revertAt})
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (h *handler) postFeedback(w http.ResponseWriter, r *http.Request) {
	if !mediaTypeOK(w, r, []string{"application/json"}) {
		return
	}
	data, ok := readBody(w, r, MaxFeedbackBytes)
	if !ok {
		return
	}
	f, err := decodeFeedback(data)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid feedback", splitJoined(err))
		return
	}
	if !h.d.RuleExists(f.Rule) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no rule %q is in force", f.Rule), nil)
		return
	}
	if err := h.d.Feedback(f); err != nil {
		switch {
		case errors.Is(err, ErrUnknownRule):
			writeError(w, http.StatusNotFound, err.Error(), nil)
		case errors.Is(err, ErrRejected):
			writeError(w, http.StatusUnprocessableEntity, err.Error(), nil)
		default:
			h.log.Error("api: feedback failed", "rule", f.Rule, "err", err)
			writeError(w, http.StatusInternalServerError, fmt.Sprintf("feedback: %v", err), nil)
		}
		return
	}
	h.log.Debug("api: feedback", "rule", f.Rule, "queueing_delay_ms", f.QueueingDelayMS, "requests", f.Requests, "errors", f.Errors)
	w.WriteHeader(http.StatusNoContent)
}

// decodeFeedback decodes exactly one JSON object with known fields only,
// then validates it.
func decodeFeedback(data []byte) (Feedback, error) {
	var f Feedback
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Feedback{}, fmt.Errorf("decode feedback: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Feedback{}, errors.New("decode feedback: data after the JSON object")
	}
	if err := f.Validate(); err != nil {
		return Feedback{}, err
	}
	return f, nil
}

// mediaTypeOK accepts an absent Content-Type or one of allowed (with at
// most a charset=utf-8 parameter) and answers 415 otherwise.
func mediaTypeOK(w http.ResponseWriter, r *http.Request, allowed []string) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return true
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err == nil && slices.Contains(allowed, mt) {
		if cs, ok := params["charset"]; !ok || strings.EqualFold(cs, "utf-8") {
			return true
		}
	}
	writeError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type %q not supported (use %s)", ct, strings.Join(allowed, ", ")), nil)
	return false
}

// readBody reads at most limit bytes and answers 413 above it.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	tooLarge := func() {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", limit), nil)
	}
	if r.ContentLength > limit {
		tooLarge()
		return nil, false
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			tooLarge()
		} else {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("read body: %v", err), nil)
		}
		return nil, false
	}
	return data, true
}

// etagMatches evaluates an If-Match list against the current hash.
func etagMatches(header, sum string) bool {
	for tag := range strings.SplitSeq(header, ",") {
		tag = strings.TrimSpace(tag)
		if tag == "*" {
			return true
		}
		tag = strings.Trim(strings.TrimPrefix(tag, "W/"), `"`)
		if strings.EqualFold(tag, sum) {
			return true
		}
	}
	return false
}

// errorLines returns the "FILE:LINE: field: problem" lines of a config
// error, or its text split into lines when it carries none.
func errorLines(err error) []string {
	list := config.Errors(err)
	if len(list) == 0 {
		return splitJoined(err)
	}
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = e.Error()
	}
	return out
}

// splitJoined returns the lines of an errors.Join (or any error).
func splitJoined(err error) []string {
	return strings.Split(err.Error(), "\n")
}

func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		code = http.StatusInternalServerError
		body, _ = json.Marshal(ErrorResponse{Error: fmt.Sprintf("encode answer: %v", err)})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(body, '\n'))
}

func writeError(w http.ResponseWriter, code int, msg string, lines []string) {
	writeJSON(w, code, ErrorResponse{Error: msg, Errors: lines})
}
