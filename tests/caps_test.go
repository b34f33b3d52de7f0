//go:build linux

package tests

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// requiredCaps are the capabilities the systemd unit grants.
var requiredCaps = []string{"bpf", "net_admin", "perfmon", "sys_resource"}

// runWithCaps runs `xlimit run` in the server's namespace with exactly caps
// in the bounding set (as root, so they are also effective), until it logs
// "enforcing" or exits.
func (e *env) runWithCaps(t *testing.T, rules string, caps []string) (out string, enforcing bool) {
	t.Helper()
	bounding := "-all"
	for _, c := range caps {
		bounding += ",+" + c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := e.lab.Server.Command(ctx, "setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--",
		xlimitBin, "run", "--config", rules, "--iface", e.lab.ServerIf, "--bpffs", e.bpffs,
		"--state-dir", e.stateDir, "--metrics-addr", "", "--api-socket", filepath.Join(e.dir, "api.sock"))
	d := &daemon{t: t, cmd: cmd, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d, d
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.exitErr = cmd.Wait(); close(d.exited) }()
	defer d.kill()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-d.exited:
			return d.Log(), false
		case <-deadline:
			return d.Log(), false
		case <-time.After(20 * time.Millisecond):
			if strings.Contains(d.Log(), "msg=enforcing") {
				return d.Log(), true
			}
		}
	}
}

// TestCapabilities: the daemon runs with exactly CAP_BPF, CAP_NET_ADMIN,
// CAP_PERFMON and CAP_SYS_RESOURCE, and without one of the first three it
// fails with a message that names what is missing.
func TestCapabilities(t *testing.T) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux) to drop capabilities")
	}
	e := newEnv(t)
	rules := e.writeRules("rules.yaml", limitRules())
	out, ok := e.runWithCaps(t, rules, requiredCaps)
	if !ok {
		t.Fatalf("with %v the daemon did not start:\n%s", requiredCaps, out)
	}
	if o, err := e.xlimit("detach", "--iface", e.lab.ServerIf); err != nil {
		t.Fatalf("detach: %v: %s", err, o)
	}
	for _, missing := range []string{"bpf", "net_admin", "perfmon"} {
		var caps []string
		for _, c := range requiredCaps {
			if c != missing {
				caps = append(caps, c)
			}
		}
		out, ok := e.runWithCaps(t, rules, caps)
		if ok {
			t.Errorf("without CAP_%s the daemon started", strings.ToUpper(missing))
			if o, err := e.xlimit("detach", "--iface", e.lab.ServerIf); err != nil {
				t.Fatalf("detach: %v: %s", err, o)
			}
			continue
		}
		t.Logf("e2e caps: without CAP_%s: %s", strings.ToUpper(missing), lastLine(out))
		if !strings.Contains(out, "CAP_BPF") || !strings.Contains(out, "CAP_NET_ADMIN") {
			t.Errorf("without CAP_%s the error does not name the capabilities needed:\n%s", strings.ToUpper(missing), out)
		}
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
