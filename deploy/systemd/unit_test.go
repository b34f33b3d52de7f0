package systemd

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const unitFile = "xlimit.service"

// unit is a parsed unit file: section -> key -> values (in order; a key
// may repeat).
type unit map[string]map[string][]string

func parseUnit(t *testing.T, data []byte) unit {
	t.Helper()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not KEY=VALUE in a section: %q", unitFile, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unit) one(t *testing.T, section, key string) string {
	t.Helper()
	v := u[section][key]
	if len(v) != 1 {
		t.Fatalf("[%s] %s: %d values %q, want one", section, key, len(v), v)
	}
	return v[0]
}

// TestUnitSettings pins the settings operators and the daemon rely on.
func TestUnitSettings(t *testing.T) {
	data, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	u := parseUnit(t, data)
	for _, tc := range []struct{ section, key, want string }{
		{"Service", "Type", "notify"},
		{"Service", "NotifyAccess", "main"},
		{"Service", "ExecStartPre", "-/usr/local/bin/xlimit check /etc/xlimit/rules.yaml"},
		{"Service", "ExecStart", "/usr/local/bin/xlimit run --config /etc/xlimit/rules.yaml --state-dir /var/lib/xlimit --api-socket /run/xlimit/api.sock"},
		{"Service", "WatchdogSec", "5s"},
		{"Service", "Restart", "on-failure"},
		{"Service", "KillMode", "mixed"},
		{"Service", "CapabilityBoundingSet", "CAP_BPF CAP_NET_ADMIN CAP_PERFMON CAP_SYS_RESOURCE"},
		{"Service", "AmbientCapabilities", "CAP_BPF CAP_NET_ADMIN CAP_PERFMON CAP_SYS_RESOURCE"},
		{"Service", "NoNewPrivileges", "yes"},
		{"Service", "ProtectSystem", "strict"},
		{"Service", "ReadWritePaths", "/sys/fs/bpf"},
		{"Service", "StateDirectory", "xlimit"},
		{"Service", "RuntimeDirectory", "xlimit"},
		{"Service", "ProtectHome", "yes"},
		{"Service", "PrivateTmp", "yes"},
		{"Service", "ProtectControlGroups", "yes"},
		{"Service", "RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"},
		{"Service", "LockPersonality", "yes"},
		{"Service", "MemoryDenyWriteExecute", "yes"},
		{"Service", "RestrictRealtime", "yes"},
		{"Service", "SystemCallArchitectures", "native"},
		{"Unit", "RequiresMountsFor", "/sys/fs/bpf"},
	} {
		if got := u.one(t, tc.section, tc.key); got != tc.want {
			t.Errorf("[%s] %s=%s, want %s", tc.section, tc.key, got, tc.want)
		}
	}
	if got := u["Service"]["ExecReload"]; !slices.Equal(got, []string{"/usr/local/bin/xlimit check /etc/xlimit/rules.yaml", "/bin/kill -HUP $MAINPID"}) {
		t.Errorf("ExecReload %q", got)
	}
	if _, ok := u["Service"]["TimeoutStopSec"]; !ok {
		t.Error("no TimeoutStopSec")
	}
	// ProtectKernelTunables=yes would make /sys/fs/bpf read-only whatever
	// ReadWritePaths says (see the comment in the unit): it must stay off,
	// with /sys read-only by other means.
	if v, ok := u["Service"]["ProtectKernelTunables"]; ok && !slices.Equal(v, []string{"no"}) {
		t.Errorf("ProtectKernelTunables=%q: the daemon could not pin in /sys/fs/bpf", v)
	}
	if ro := strings.Fields(u.one(t, "Service", "ReadOnlyPaths")); !slices.Contains(ro, "/sys") || !slices.Contains(ro, "/proc/sys") {
		t.Errorf("ReadOnlyPaths=%q: want /sys and /proc/sys", ro)
	}
	// The daemon never mounts: CAP_SYS_ADMIN is not granted.
	if strings.Contains(u.one(t, "Service", "CapabilityBoundingSet"), "SYS_ADMIN") {
		t.Error("CAP_SYS_ADMIN granted")
	}
}

// buildXlimit builds the daemon into dir.
func buildXlimit(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "xlimit")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/xlimit").CombinedOutput(); err != nil {
		t.Fatalf("build xlimit: %v\n%s", err, out)
	}
	return bin
}

// TestUnitVerifies runs `systemd-analyze verify` on the unit with its
// binary paths pointed at a freshly built xlimit, and fails on any
// complaint about the unit (verify only warns about unknown keys).
func TestUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not found: install the Debian package systemd to verify the unit")
	}
	data, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := buildXlimit(t, dir)
	rewritten := strings.ReplaceAll(string(data), "/usr/local/bin/xlimit", bin)
	if strings.Contains(rewritten, "/usr/local/bin") {
		t.Fatal("the unit refers to another binary under /usr/local/bin")
	}
	path := filepath.Join(dir, unitFile)
	if err := os.WriteFile(path, []byte(rewritten), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", path).CombinedOutput()
	var complaints []string
	for line := range strings.Lines(string(out)) {
		if strings.Contains(line, unitFile) || strings.Contains(line, bin) {
			complaints = append(complaints, strings.TrimSpace(line))
		}
	}
	if err != nil || len(complaints) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, strings.Join(complaints, "\n"))
	}
	if len(out) > 0 {
		t.Logf("systemd-analyze verify said (about other units):\n%s", out)
	}

	// The flags of ExecStart are flags of this xlimit: pflag rejects an
	// unknown one before it reaches --help.
	u := parseUnit(t, data)
	args := strings.Fields(u.one(t, "Service", "ExecStart"))[1:]
	if out, err := exec.Command(bin, append(args, "--help")...).CombinedOutput(); err != nil {
		t.Errorf("xlimit %s --help: %v\n%s", strings.Join(args, " "), err, out)
	}
	check := strings.Fields(strings.TrimPrefix(u.one(t, "Service", "ExecStartPre"), "-"))[1:]
	if out, err := exec.Command(bin, append(check, "--help")...).CombinedOutput(); err != nil {
		t.Errorf("xlimit %s --help: %v\n%s", strings.Join(check, " "), err, out)
	}
}
