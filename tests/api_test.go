//go:build linux

package tests

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xlimit/xlimit/userspace/api"
)

// TestAPIRules: PUT /v1/rules on the daemon's socket applies rules that
// validate and persists them for a restart; rules that do not validate get
// every FILE:LINE: field: problem back and change nothing; status over the
// socket matches status from the pins.
func TestAPIRules(t *testing.T) {
	e := newEnv(t)
	rules := e.writeRules("rules.yaml", limitRules())
	d := e.startDaemon(rules)
	c := api.NewClient(filepath.Join(e.dir, "api.sock"))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	st, err := c.Status(ctx)
	if err != nil {
		t.Fatalf("status over the API: %v", err)
	}
	if len(st.Interfaces) != 1 || len(st.Interfaces[0].Rules) != 1 || st.Interfaces[0].Rules[0].Rate != limitPPS {
		t.Fatalf("status over the API: %+v", st)
	}

	// `xlimit status` asks the daemon when one answers on the socket: the
	// bpffs here is a test mount the command could not find by itself.
	out, err := hostCmd(xlimitBin, "status", "--api-socket", filepath.Join(e.dir, "api.sock"))
	if err != nil || !strings.Contains(string(out), e.lab.ServerIf+": attached") || !strings.Contains(string(out), "udp-flood") {
		t.Errorf("status through the API: %v:\n%s", err, out)
	}

	_, err = c.PutRules(ctx, []byte("rules:\n  - name: udp-flood\n    protocol: udp\n    ports: [0]\n    rate: 5\n"), "")
	var se *api.StatusError
	if !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Error(), "api:4: rules[0].ports[0]") {
		t.Fatalf("invalid rules: %v", err)
	}
	if _, _, rate, _ := e.status().rule("udp-flood"); !within(rate, limitPPS, 1e-9) {
		t.Fatalf("invalid rules changed the rate to %v", rate)
	}

	if _, err := c.PutRules(ctx, []byte(strings.Replace(limitRules(), "rate: 1000", "rate: 3000", 1)), ""); err != nil {
		t.Fatalf("valid rules: %v", err)
	}
	if _, _, rate, _ := e.status().rule("udp-flood"); !within(rate, 3000, 1e-9) {
		t.Fatalf("after PUT the rate is %v, want 3000", rate)
	}
	doc, err := c.Rules(ctx)
	if err != nil || !strings.Contains(string(doc.Text), "rate: 3000") {
		t.Fatalf("GET /v1/rules: %+v, %v", doc, err)
	}

	// A restart keeps the rules put through the API.
	c.Close()
	d.kill()
	d2 := e.startDaemon(rules)
	if !strings.Contains(d2.Log(), "RUNNING THE RULES PUT THROUGH THE API") {
		t.Errorf("the restarted daemon did not say it runs the API's rules:\n%s", d2.Log())
	}
	if _, _, rate, _ := e.status().rule("udp-flood"); !within(rate, 3000, 1e-9) {
		t.Errorf("after a restart the rate is %v, want the API's 3000", rate)
	}
}

// TestAPIFeedback: a service that reports its own queueing delay above the
// target through POST /v1/feedback gets its rate cut by the control loop;
// a rule not steered by feedback refuses reports.
func TestAPIFeedback(t *testing.T) {
	e := newEnv(t)
	e.startDaemon(e.writeRules("rules.yaml", `rules:
  - name: svc
    protocol: tcp
    ports: [8080]
    rate: 2000
    behavior: adaptive
    adaptive: {target_latency: 25ms, min_rate: 200, max_rate: 4000, signal: feedback}
  - name: other
    protocol: udp
    ports: [9000]
    rate: 1000
`))
	c := api.NewClient(filepath.Join(e.dir, "api.sock"))
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var se *api.StatusError
	if err := c.Feedback(ctx, api.Feedback{Rule: "other", QueueingDelayMS: 1, Requests: 1}); !errors.As(err, &se) || se.Code != 422 {
		t.Errorf("feedback for a static rule: %v, want 422", err)
	}
	// Without reports the signal is stale and the rate holds.
	time.Sleep(300 * time.Millisecond)
	if _, _, rate, _ := e.status().rule("svc"); !within(rate, 2000, 1e-6) {
		t.Fatalf("without feedback the rate moved to %v", rate)
	}
	// 100 ms of queueing against a 25 ms target, reported every 50 ms.
	for range 20 {
		if err := c.Feedback(ctx, api.Feedback{Rule: "svc", QueueingDelayMS: 100, Requests: 100}); err != nil {
			t.Fatalf("feedback: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, _, rate, _ := e.status().rule("svc")
	t.Logf("e2e feedback: 1 s of 100 ms reported delay (target 25 ms) took the rate from 2000/s to %.0f/s", rate)
	if rate > 1000 {
		t.Errorf("after 1 s of 4x-target delay the rate is %.0f/s, want well below 2000", rate)
	}
}
