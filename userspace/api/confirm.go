package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Rules applied with a confirmation deadline ("commit confirmed"):
//
//	PUT  /v1/rules?confirm=DURATION  apply; revert to the previous rules unless confirmed within DURATION
//	POST /v1/rules/confirm           confirm the rules waiting for it
//
// Rules waiting for their confirmation are not kept for a restart: a
// daemon restarted meanwhile starts from the previous rules.

// Bounds of a confirmation deadline: long enough to reconnect and
// confirm, short enough that a lock-out ends on its own.
const (
	MinConfirm = 5 * time.Second
	MaxConfirm = time.Hour
)

// Confirmer is what a daemon implements to take rules with a
// confirmation deadline.
type Confirmer interface {
	// ApplyRulesConfirm is ApplyRules, except that the daemon goes back
	// to the rules in force now unless ConfirmRules comes within.
	ApplyRulesConfirm(text []byte, within time.Duration) (revertAt time.Time, err error)
	// ConfirmRules confirms the rules waiting for it; an error wrapping
	// ErrRejected when none is.
	ConfirmRules() error
}

// RulesPending is the answer of a PUT /v1/rules?confirm=...
type RulesPending struct {
	RulesApplied
	RevertAt time.Time `json:"revert_at"` // the previous rules return then, unless confirmed
}

// confirmParam reads ?confirm=DURATION: 0 when absent.
func confirmParam(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get("confirm")
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < MinConfirm || d > MaxConfirm {
		return 0, fmt.Errorf("confirm %q: want a duration from %v to %v", v, MinConfirm, MaxConfirm)
	}
	return d, nil
}

func (h *handler) postConfirm(w http.ResponseWriter, _ *http.Request) {
	c, ok := h.d.(Confirmer)
	if !ok {
		writeError(w, http.StatusNotImplemented, "this daemon takes no confirmations", nil)
		return
	}
	if err := c.ConfirmRules(); err != nil {
		writeError(w, http.StatusUnprocessableEntity, err.Error(), nil)
		return
	}
	h.log.Info("api: rules confirmed")
	w.WriteHeader(http.StatusNoContent)
}

// PutRulesConfirm replaces the rules for within: the daemon reverts to
// the previous ones unless Confirm comes in time.
func (c *Client) PutRulesConfirm(ctx context.Context, text []byte, within time.Duration) (RulesPending, error) {
	var res RulesPending
	hdr := http.Header{"Content-Type": {"application/yaml"}}
	err := c.do(ctx, http.MethodPut, "/v1/rules?confirm="+url.QueryEscape(within.String()), hdr, text, &res)
	return res, err
}

// Confirm confirms the rules waiting for a confirmation.
func (c *Client) Confirm(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/rules/confirm", nil, nil, nil)
}
