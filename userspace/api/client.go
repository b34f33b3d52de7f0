package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// ErrUnavailable means no daemon answers on the socket (it does not exist
// or nobody listens): callers such as `xlimit status` then read the pins.
var ErrUnavailable = errors.New("no xlimit daemon answers")

// StatusError is a non-2xx answer of the API.
type StatusError struct {
	Code    int
	Message string
	Errors  []string // the problems of a rejected rules document
}

func (e *StatusError) Error() string {
	msg := fmt.Sprintf("api: %d %s: %s", e.Code, http.StatusText(e.Code), e.Message)
	if len(e.Errors) > 0 {
		msg += "\n" + strings.Join(e.Errors, "\n")
	}
	return msg
}

// Client talks to a daemon's API socket.
type Client struct {
	path string
	hc   *http.Client
}

// NewClient returns a client of the API socket at path. Requests time out
// after 10 s unless their context ends sooner.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", path)
			if err != nil {
				return nil, fmt.Errorf("%w on %s: %w", ErrUnavailable, path, err)
			}
			return c, nil
		},
		MaxIdleConns:    1,
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{path: path, hc: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Status reads GET /v1/status.
func (c *Client) Status(ctx context.Context) (StatusReport, error) {
	var rep StatusReport
	err := c.do(ctx, http.MethodGet, "/v1/status", nil, nil, &rep)
	return rep, err
}

// Rules reads GET /v1/rules.
func (c *Client) Rules(ctx context.Context) (RulesDocument, error) {
	var doc RulesDocument
	err := c.do(ctx, http.MethodGet, "/v1/rules", nil, nil, &doc)
	return doc, err
}

// PutRules replaces the rules. ifMatch, when not empty, is the SHA-256 of
// the rules the caller read; the daemon refuses (412) if they changed since.
func (c *Client) PutRules(ctx context.Context, text []byte, ifMatch string) (RulesApplied, error) {
	var res RulesApplied
	hdr := http.Header{"Content-Type": {"application/yaml"}}
	if ifMatch != "" {
		hdr.Set("If-Match", `"`+ifMatch+`"`)
	}
	err := c.do(ctx, http.MethodPut, "/v1/rules", hdr, text, &res)
	return res, err
}

// Feedback posts a feedback sample.
func (c *Client) Feedback(ctx context.Context, f Feedback) error {
	body, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode feedback: %w", err)
	}
	return c.do(ctx, http.MethodPost, "/v1/feedback", http.Header{"Content-Type": {"application/json"}}, body, nil)
}

func (c *Client) do(ctx context.Context, method, path string, hdr http.Header, body []byte, out any) error {
	u := "http://xlimit" + path
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("build %s %s: %w", method, path, err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read answer of %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		se := &StatusError{Code: resp.StatusCode}
		var er ErrorResponse
		if json.Unmarshal(data, &er) == nil && er.Error != "" {
			se.Message, se.Errors = er.Error, er.Errors
		} else {
			se.Message = strings.TrimSpace(string(data))
		}
		return se
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode answer of %s %s: %w", method, path, err)
	}
	return nil
}
