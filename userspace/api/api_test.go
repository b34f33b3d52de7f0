package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/xlimit/xlimit/userspace/config"
)

// fakeDaemon records what the API hands it.
type fakeDaemon struct {
	mu          sync.Mutex
	text        []byte
	source      string
	applied     [][]byte
	applyErr    error
	feedback    []Feedback
	feedbackErr error
	rules       map[string]bool
	status      StatusReport
	statusErr   error
	panics      bool
}

func newFake() *fakeDaemon {
	return &fakeDaemon{
		text:   []byte(goodRules),
		source: "/etc/xlimit/rules.yaml",
		rules:  map[string]bool{"dns": true, "web": true},
		status: StatusReport{Interfaces: []IfaceStatus{
			{Iface: "eth0", PinDir: "/sys/fs/bpf/xlimit/eth0", Attached: true, Ifindex: 2, ProgramID: 7, LinkID: 3, Generation: 1,
				Rules: []RuleStatus{{Slot: 0, Name: "dns", Unit: "packets", Rate: 100, Burst: 100, RateSource: "static",
					Counters:  CounterStatus{Packets: map[string]uint64{"pass": 10, "drop": 2, "would_drop": 0}, Bytes: map[string]uint64{}, Reasons: map[string]uint64{"rule": 2}},
					PerSource: &PerSourceStatus{Rate: 5, Burst: 10, PrefixV4: 32, PrefixV6: 64, Ban: true, TopSources: []SourceStatus{{Prefix: "192.0.2.1/32", Drops: 7, Banned: true}}}}},
				Total: CounterStatus{Packets: map[string]uint64{"pass": 10, "drop": 2}, Bytes: map[string]uint64{}, Reasons: map[string]uint64{"admit": 10, "rule": 2}}},
			{Iface: "eth1", PinDir: "/sys/fs/bpf/xlimit/eth1", Rules: []RuleStatus{}},
		}},
	}
}

func (f *fakeDaemon) Status() (StatusReport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.panics {
		panic("boom")
	}
	rep := f.status
	rep.Interfaces = slices.Clone(rep.Interfaces)
	return rep, f.statusErr
}

func (f *fakeDaemon) Rules() ([]byte, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.text, f.source
}

func (f *fakeDaemon) ApplyRules(text []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.applyErr != nil {
		return f.applyErr
	}
	f.applied = append(f.applied, slices.Clone(text))
	f.text, f.source = slices.Clone(text), "api"
	return nil
}

func (f *fakeDaemon) Feedback(fb Feedback) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.feedbackErr != nil {
		return f.feedbackErr
	}
	f.feedback = append(f.feedback, fb)
	return nil
}

func (f *fakeDaemon) RuleExists(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rules[name]
}

const goodRules = "rules:\n  - name: dns\n    protocol: udp\n    ports: [53]\n    rate: 100\n"

// badRules has two problems, on lines 4 and 6.
const badRules = "rules:\n  - name: dns\n    protocol: udp\n    ports: [0]\n    rate: 100\n    syn_only: true\n"

type answer struct {
	code   int
	header http.Header
	body   []byte
}

func (a answer) errResp(t *testing.T) ErrorResponse {
	t.Helper()
	var er ErrorResponse
	if err := json.Unmarshal(a.body, &er); err != nil || er.Error == "" {
		t.Fatalf("error answer is not an ErrorResponse: %v: %s", err, a.body)
	}
	return er
}

func call(h http.Handler, method, path, contentType string, body io.Reader) answer {
	req := httptest.NewRequest(method, path, body)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return answer{rec.Code, rec.Header(), rec.Body.Bytes()}
}

func TestStatus(t *testing.T) {
	f := newFake()
	h := Handler(f, nil)
	a := call(h, "GET", "/v1/status", "", nil)
	if a.code != 200 || a.header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /v1/status: %d %v", a.code, a.header)
	}
	var rep StatusReport
	if err := json.Unmarshal(a.body, &rep); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(f.status)
	got, _ := json.Marshal(rep)
	if !bytes.Equal(got, want) {
		t.Errorf("status round trip:\n got %s\nwant %s", got, want)
	}
	// The JSON field names are those of `xlimit status --json`.
	for _, key := range []string{`"interfaces"`, `"iface"`, `"pin_dir"`, `"attached"`, `"ifindex"`, `"program_id"`, `"link_id"`,
		`"generation"`, `"rules"`, `"total"`, `"slot"`, `"name"`, `"unit"`, `"rate"`, `"burst"`, `"rate_source"`, `"shadow"`,
		`"counters"`, `"packets"`, `"bytes"`, `"reasons"`, `"per_source"`, `"prefix_v4"`, `"prefix_v6"`, `"ban"`, `"top_sources"`,
		`"prefix"`, `"drops"`, `"banned"`} {
		if !bytes.Contains(a.body, []byte(key)) {
			t.Errorf("status JSON lacks %s", key)
		}
	}

	a = call(h, "GET", "/v1/status?iface=eth1", "", nil)
	rep = StatusReport{}
	if err := json.Unmarshal(a.body, &rep); err != nil || len(rep.Interfaces) != 1 || rep.Interfaces[0].Iface != "eth1" {
		t.Errorf("?iface=eth1: %v %s", err, a.body)
	}
	a = call(h, "GET", "/v1/status?iface=nope", "", nil)
	if a.code != 200 || !bytes.Contains(a.body, []byte(`"interfaces": []`)) {
		t.Errorf("?iface=nope: %d %s", a.code, a.body)
	}

	f.statusErr = errors.New("map gone")
	a = call(h, "GET", "/v1/status", "", nil)
	if a.code != 500 || !strings.Contains(a.errResp(t).Error, "map gone") {
		t.Errorf("status error: %d %s", a.code, a.body)
	}
}

func TestRoutingAndMethods(t *testing.T) {
	h := Handler(newFake(), nil)
	for _, tc := range []struct {
		method, path string
		code         int
		allow        string
	}{
		{"GET", "/", 404, ""},
		{"GET", "/v1/nope", 404, ""},
		{"GET", "/v1/status/", 404, ""},
		{"POST", "/v1/status", 405, "GET"},
		{"DELETE", "/v1/rules", 405, "GET, PUT"},
		{"POST", "/v1/rules", 405, "GET, PUT"},
		{"GET", "/v1/feedback", 405, "POST"},
		{"PUT", "/v1/feedback", 405, "POST"},
	} {
		a := call(h, tc.method, tc.path, "", nil)
		if a.code != tc.code || a.header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d Allow %q, want %d Allow %q", tc.method, tc.path, a.code, a.header.Get("Allow"), tc.code, tc.allow)
		}
		a.errResp(t)
	}
}

func TestGetRules(t *testing.T) {
	h := Handler(newFake(), nil)
	a := call(h, "GET", "/v1/rules", "", nil)
	var doc RulesDocument
	if err := json.Unmarshal(a.body, &doc); err != nil || a.code != 200 {
		t.Fatalf("GET /v1/rules: %d %v %s", a.code, err, a.body)
	}
	if doc.Text != goodRules || doc.Source != "/etc/xlimit/rules.yaml" || doc.SHA256 != hexSHA256([]byte(goodRules)) || len(doc.SHA256) != 64 {
		t.Errorf("rules document: %+v", doc)
	}
	if a.header.Get("ETag") != `"`+doc.SHA256+`"` {
		t.Errorf("ETag %q", a.header.Get("ETag"))
	}
}

func TestPutRules(t *testing.T) {
	f := newFake()
	h := Handler(f, nil)
	const newRules = "interfaces: [eth0]\nrules:\n  - name: web\n    protocol: tcp\n    ports: [80]\n    rate: 10\n  - name: dns\n    protocol: udp\n    rate: 5\n    warm_up: {period: 1s}\n"
	a := call(h, "PUT", "/v1/rules", "application/yaml", strings.NewReader(newRules))
	if a.code != 200 {
		t.Fatalf("PUT good rules: %d %s", a.code, a.body)
	}
	var res RulesApplied
	if err := json.Unmarshal(a.body, &res); err != nil {
		t.Fatal(err)
	}
	if !res.Applied || !slices.Equal(res.Rules, []string{"web", "dns"}) || !slices.Equal(res.Interfaces, []string{"eth0"}) ||
		res.SHA256 != hexSHA256([]byte(newRules)) || len(res.Warnings) != 1 || !strings.HasPrefix(res.Warnings[0], "api:10: rules[1].warm_up:") {
		t.Errorf("summary: %+v", res)
	}
	if len(f.applied) != 1 || string(f.applied[0]) != newRules {
		t.Errorf("daemon got %q", f.applied)
	}

	// Every problem, each with the name "api" and its line.
	a = call(h, "PUT", "/v1/rules", "text/yaml; charset=utf-8", strings.NewReader(badRules))
	er := a.errResp(t)
	if a.code != 400 || len(er.Errors) != 2 || !strings.HasPrefix(er.Errors[0], "api:4: rules[0].ports[0]: ") || !strings.HasPrefix(er.Errors[1], "api:6: rules[0].syn_only: ") {
		t.Errorf("PUT bad rules: %d %+v", a.code, er)
	}
	for _, body := range []string{"", "not: [yaml", "rules: 3\n", "\x00\xff"} {
		a = call(h, "PUT", "/v1/rules", "", strings.NewReader(body))
		if er := a.errResp(t); a.code != 400 || len(er.Errors) == 0 || !strings.HasPrefix(er.Errors[0], "api") {
			t.Errorf("PUT %q: %d %+v", body, a.code, er)
		}
	}
	if len(f.applied) != 1 {
		t.Errorf("invalid documents reached the daemon: %d applies", len(f.applied))
	}

	// Media types.
	for _, ct := range []string{"application/json", "application/x-www-form-urlencoded", "text/yaml; charset=latin1", "garbage/"} {
		if a := call(h, "PUT", "/v1/rules", ct, strings.NewReader(goodRules)); a.code != 415 {
			t.Errorf("PUT with Content-Type %q: %d", ct, a.code)
		}
	}
	for _, ct := range []string{"application/yaml", "application/x-yaml", "text/x-yaml", "text/plain"} {
		if a := call(h, "PUT", "/v1/rules", ct, strings.NewReader(goodRules)); a.code != 200 {
			t.Errorf("PUT with Content-Type %q: %d %s", ct, a.code, a.body)
		}
	}

	// Size: exactly the limit is read (and then judged on content), one
	// byte more is 413, with or without a Content-Length.
	atLimit := goodRules + "#" + strings.Repeat("x", MaxRulesBytes-len(goodRules)-2) + "\n"
	if a := call(h, "PUT", "/v1/rules", "", strings.NewReader(atLimit)); a.code != 200 {
		t.Errorf("PUT of exactly %d bytes: %d %s", len(atLimit), a.code, a.body)
	}
	over := atLimit + "\n"
	if a := call(h, "PUT", "/v1/rules", "", strings.NewReader(over)); a.code != 413 {
		t.Errorf("PUT over the limit: %d", a.code)
	}
	if a := call(h, "PUT", "/v1/rules", "", io.MultiReader(strings.NewReader(over))); a.code != 413 {
		t.Errorf("PUT over the limit without Content-Length: %d", a.code)
	}
}

func TestPutRulesDaemonErrors(t *testing.T) {
	f := newFake()
	h := Handler(f, nil)
	f.applyErr = fmt.Errorf("%w: compile rules: too many port ranges", ErrRejected)
	if a := call(h, "PUT", "/v1/rules", "", strings.NewReader(goodRules)); a.code != 422 || !strings.Contains(a.errResp(t).Error, "too many port ranges") {
		t.Errorf("rejected: %d %s", a.code, a.body)
	}
	f.applyErr = errors.New("write map: EPERM")
	if a := call(h, "PUT", "/v1/rules", "", strings.NewReader(goodRules)); a.code != 500 {
		t.Errorf("failed: %d %s", a.code, a.body)
	}
	f.applyErr = fmt.Errorf("re-parse: %w", configError())
	if a := call(h, "PUT", "/v1/rules", "", strings.NewReader(goodRules)); a.code != 400 || len(a.errResp(t).Errors) != 2 {
		t.Errorf("config error from the daemon: %d %s", a.code, a.body)
	}
}

func configError() error {
	_, err := parseForTest(badRules)
	return err
}

func parseForTest(text string) (*config.Config, error) { return config.Parse("api", []byte(text)) }

func TestPutRulesIfMatch(t *testing.T) {
	f := newFake()
	h := Handler(f, nil)
	put := func(ifMatch string) int {
		req := httptest.NewRequest("PUT", "/v1/rules", strings.NewReader(goodRules+"# v2\n"))
		req.Header.Set("If-Match", ifMatch)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	cur := hexSHA256([]byte(goodRules))
	if c := put(`"0000"`); c != 412 {
		t.Errorf("stale If-Match: %d", c)
	}
	if c := put(`"0000", W/"` + cur + `"`); c != 200 {
		t.Errorf("matching If-Match: %d", c)
	}
	if c := put(`"` + cur + `"`); c != 412 {
		t.Errorf("If-Match of the replaced text: %d", c)
	}
	if c := put("*"); c != 200 {
		t.Errorf("If-Match *: %d", c)
	}
}

func TestFeedback(t *testing.T) {
	f := newFake()
	h := Handler(f, nil)
	a := call(h, "POST", "/v1/feedback", "application/json", strings.NewReader(`{"rule":"dns","queueing_delay_ms":12.5,"errors":1,"requests":40}`))
	if a.code != 204 || len(a.body) != 0 {
		t.Fatalf("good feedback: %d %s", a.code, a.body)
	}
	if want := (Feedback{Rule: "dns", QueueingDelayMS: 12.5, Errors: 1, Requests: 40}); len(f.feedback) != 1 || f.feedback[0] != want {
		t.Errorf("daemon got %+v", f.feedback)
	}
	a = call(h, "POST", "/v1/feedback", "", strings.NewReader(`{"rule":"nosuch","requests":1}`))
	if a.code != 404 || !strings.Contains(a.errResp(t).Error, "nosuch") {
		t.Errorf("unknown rule: %d %s", a.code, a.body)
	}
	for _, body := range []string{
		``, `null`, `[]`, `{}`, `"dns"`, `{"rule":"dns"`, `{"rule":"dns"}{"rule":"dns"}`, `{"rule":"dns"} x`,
		`{"rule":"dns","extra":1}`, `{"rule":"DNS"}`, `{"rule":"dns","errors":1.5,"requests":2}`,
		`{"rule":"dns","requests":-1}`, `{"rule":"dns","errors":-1}`, `{"rule":"dns","errors":3,"requests":2}`,
		`{"rule":"dns","queueing_delay_ms":-0.1}`, `{"rule":"dns","queueing_delay_ms":1e300}`,
		`{"rule":"dns","queueing_delay_ms":"5"}`, `{"rule":"dns","requests":99999999999999999999}`,
		`{"rule":"` + strings.Repeat("a", 32) + `"}`, `{"rule":"a\u0000b"}`,
	} {
		a := call(h, "POST", "/v1/feedback", "application/json", strings.NewReader(body))
		if er := a.errResp(t); a.code != 400 || len(er.Errors) == 0 {
			t.Errorf("feedback %q: %d %+v", body, a.code, er)
		}
	}
	if len(f.feedback) != 1 {
		t.Errorf("invalid feedback reached the daemon: %+v", f.feedback)
	}
	if a := call(h, "POST", "/v1/feedback", "text/plain", strings.NewReader(`{"rule":"dns"}`)); a.code != 415 {
		t.Errorf("text/plain feedback: %d", a.code)
	}
	big := `{"rule":"dns","requests":1}` + strings.Repeat(" ", MaxFeedbackBytes)
	if a := call(h, "POST", "/v1/feedback", "", strings.NewReader(big)); a.code != 413 {
		t.Errorf("oversized feedback: %d", a.code)
	}
	f.feedbackErr = fmt.Errorf("%w: rule dns takes no feedback", ErrRejected)
	if a := call(h, "POST", "/v1/feedback", "", strings.NewReader(`{"rule":"dns"}`)); a.code != 422 {
		t.Errorf("rejected feedback: %d %s", a.code, a.body)
	}
	f.feedbackErr = fmt.Errorf("%w: dns went away", ErrUnknownRule)
	if a := call(h, "POST", "/v1/feedback", "", strings.NewReader(`{"rule":"dns"}`)); a.code != 404 {
		t.Errorf("rule gone: %d %s", a.code, a.body)
	}
	f.feedbackErr = errors.New("control plane stopped")
	if a := call(h, "POST", "/v1/feedback", "", strings.NewReader(`{"rule":"dns"}`)); a.code != 500 {
		t.Errorf("failed feedback: %d %s", a.code, a.body)
	}
}

func TestDaemonPanicIs500(t *testing.T) {
	f := newFake()
	f.panics = true
	if a := call(Handler(f, nil), "GET", "/v1/status", "", nil); a.code != 500 || !strings.Contains(a.errResp(t).Error, "boom") {
		t.Errorf("panicking daemon: %d %s", a.code, a.body)
	}
}

func FuzzFeedback(f *testing.F) {
	for _, s := range []string{`{"rule":"dns","queueing_delay_ms":1,"errors":0,"requests":1}`, `{"rule":"web"}`, `{"rule":"x"}`, `{`, `[1]`, `{"rule":"dns","errors":2,"requests":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		d := newFake()
		a := call(Handler(d, nil), "POST", "/v1/feedback", "application/json", bytes.NewReader(body))
		switch a.code {
		case 204:
			if len(d.feedback) != 1 || d.feedback[0].Validate() != nil || !d.rules[d.feedback[0].Rule] {
				t.Fatalf("accepted %q as %+v", body, d.feedback)
			}
		case 400, 404, 413:
			a.errResp(t)
			if len(d.feedback) != 0 {
				t.Fatalf("rejected %q with %d but handed it on", body, a.code)
			}
		default:
			t.Fatalf("feedback %q: unexpected %d %s", body, a.code, a.body)
		}
	})
}

func FuzzPutRules(f *testing.F) {
	for _, s := range []string{goodRules, badRules, "", "rules: []\n", "interfaces: [eth0]\nallow: [10.0.0.0/8]\nrules:\n  - {name: a, protocol: tcp, ports: ['1-2'], rate: 1}\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		d := newFake()
		a := call(Handler(d, nil), "PUT", "/v1/rules", "application/yaml", bytes.NewReader(body))
		_, perr := parseForTest(string(body))
		switch a.code {
		case 200:
			if perr != nil || len(d.applied) != 1 || !bytes.Equal(d.applied[0], body) {
				t.Fatalf("accepted %q (parse: %v)", body, perr)
			}
		case 400:
			er := a.errResp(t)
			if perr == nil || len(d.applied) != 0 || len(er.Errors) == 0 {
				t.Fatalf("rejected %q: %+v (parse: %v)", body, er, perr)
			}
			for _, line := range er.Errors {
				if !strings.HasPrefix(line, "api") {
					t.Fatalf("error line %q does not name the document", line)
				}
			}
		case 413:
			if len(body) <= MaxRulesBytes {
				t.Fatalf("413 for %d bytes", len(body))
			}
		default:
			t.Fatalf("PUT %q: unexpected %d %s", body, a.code, a.body)
		}
	})
}
