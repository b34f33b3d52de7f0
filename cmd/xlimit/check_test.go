package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCheckStopsOnSignal: check of a large document ends as soon as its
// context does (SIGINT, SIGTERM), not when the compilation is done.
func TestCheckStopsOnSignal(t *testing.T) {
	var doc strings.Builder
	doc.WriteString("rules:\n")
	for r := range 64 {
		fmt.Fprintf(&doc, "  - name: r%d\n    protocol: tcp\n    ports: [%d]\n    rate: 1000\n", r, 1000+r)
		if r > 0 {
			doc.WriteString("    sources: *shared\n")
			continue
		}
		doc.WriteString("    sources: &shared\n")
		for i := range 65536 {
			fmt.Fprintf(&doc, "      - 10.%d.%d.0/24\n", i>>8, i&255)
		}
	}
	file := writeFile(t, "big.yaml", doc.String())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var o, e bytes.Buffer
	start := time.Now()
	code := mainWithArgs(ctx, &env{stdout: &o, stderr: &e}, []string{"check", file})
	took := time.Since(start)
	if code != 1 || !strings.Contains(e.String(), "interrupted") {
		t.Errorf("check with its context ended: code %d after %v, stdout %q, stderr %q", code, took, o.String(), e.String())
	}
	t.Logf("check of a %d-byte document, interrupted: returned after %v", doc.Len(), took)
}

// TestFailStaticBound: --fail-static-after has an upper bound, refused as
// a usage error before anything is touched.
func TestFailStaticBound(t *testing.T) {
	file := writeFile(t, "r.yaml", "rules:\n  - name: dns\n    protocol: udp\n    ports: [53]\n    rate: 100\n")
	code, _, errOut := runCLI(t, "run", "--config", file, "--iface", "xl-none0", "--metrics-addr", "", "--api-socket", "",
		"--state-dir", t.TempDir(), "--fail-static-after", "8760h")
	if code != 2 || !strings.Contains(errOut, "--fail-static-after 8760h0m0s: at most 1m0s") {
		t.Errorf("run --fail-static-after 8760h: code %d, stderr %q", code, errOut)
	}
}

// TestHelperSSHD is not a test: TestCheckWarnsSSHD runs the test binary
// under the name sshd with XLIMIT_TEST_SSHD set, and it listens on TCP.
func TestHelperSSHD(t *testing.T) {
	if os.Getenv("XLIMIT_TEST_SSHD") == "" {
		t.Skip("helper process of TestCheckWarnsSSHD")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.Exit(1)
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	time.Sleep(time.Minute)
	os.Exit(0)
}

// TestCheckWarnsSSHD: check warns when a rule would limit new TCP
// connections to the port of a listening sshd, and not when that port is
// a management port.
func TestCheckWarnsSSHD(t *testing.T) {
	sshd := filepath.Join(t.TempDir(), "sshd")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(self, sshd); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sshd, "-test.run=^TestHelperSSHD$")
	cmd.Env = append(os.Environ(), "XLIMIT_TEST_SSHD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var port int
	if _, err := fmt.Fscan(out, &port); err != nil {
		t.Fatalf("the sshd helper did not say its port: %v", err)
	}
	limited := writeFile(t, "all.yaml", "rules:\n  - name: all-tcp\n    protocol: tcp\n    rate: 100\n")
	code, _, errOut := runCLI(t, "check", limited)
	want := fmt.Sprintf("rule(s) all-tcp limit new TCP connections to port %d, where sshd (pid %d) listens", port, cmd.Process.Pid)
	if code != 0 || !strings.Contains(errOut, want) {
		t.Errorf("check of a rule on every TCP port: code %d, stderr %q, want %q", code, errOut, want)
	}
	managed := writeFile(t, "managed.yaml", fmt.Sprintf("management:\n  tcp_ports: [%d]\nrules:\n  - name: all-tcp\n    protocol: tcp\n    rate: 100\n", port))
	if code, _, errOut := runCLI(t, "check", managed); code != 0 || strings.Contains(errOut, "sshd") {
		t.Errorf("check with the port managed: code %d, stderr %q", code, errOut)
	}
}

// TestCheckWarnsOpenRedis: check --rules-source/--fleet warns about a
// Redis on the network without a password or TLS, and not about a unix
// socket (issue 41, lower).
func TestCheckWarnsOpenRedis(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte("rules: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, "check", "--rules-source", "redis://10.0.0.5:6379", "--fleet", "redis://10.0.0.5:6379", file)
	if code != 0 || strings.Count(errOut, "without a password") != 2 || strings.Count(errOut, "without TLS") != 2 {
		t.Fatalf("exit %d, stderr:\n%s", code, errOut)
	}
	code, _, errOut = runCLI(t, "check", "--rules-source", "unix:///run/redis.sock", file)
	if code != 0 || strings.Contains(errOut, "warning") {
		t.Fatalf("a unix socket: exit %d, stderr:\n%s", code, errOut)
	}
}
