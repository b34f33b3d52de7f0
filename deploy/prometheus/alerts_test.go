// Package prometheus holds xlimit's Prometheus alerting rules; its tests
// run promtool over them.
package prometheus

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found: install the Debian package prometheus (make deps does)")
	}
	return p
}

// TestAlertRulesCheck runs promtool check rules (syntax, PromQL, templates).
func TestAlertRulesCheck(t *testing.T) {
	out, err := exec.Command(promtool(t), "check", "rules", "xlimit-alerts.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestAlertRulesUnit runs the rule unit tests of xlimit-alerts_test.yaml.
func TestAlertRulesUnit(t *testing.T) {
	out, err := exec.Command(promtool(t), "test", "rules", "xlimit-alerts_test.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// TestEveryAlertTested: each alert of the rules file has a firing case in
// the unit tests (an exp_alerts list that is not empty).
func TestEveryAlertTested(t *testing.T) {
	rules, err := os.ReadFile("xlimit-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("xlimit-alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, m := range regexp.MustCompile(`(?m)^\s+- alert: (\S+)`).FindAllSubmatch(rules, -1) {
		alerts = append(alerts, string(m[1]))
	}
	want := []string{"XlimitDaemonDown", "XlimitNotScraped", "XlimitFailStatic", "XlimitRulesSourceDown",
		"XlimitReloadFailed", "XlimitInterfaceNotAttached", "XlimitDropsSpiking"}
	for _, a := range want {
		if !slices.Contains(alerts, a) {
			t.Errorf("alert %s missing from xlimit-alerts.yaml", a)
		}
	}
	firing := map[string]bool{}
	var current string
	for _, line := range strings.Split(string(tests), "\n") {
		s := strings.TrimSpace(line)
		if a, ok := strings.CutPrefix(s, "alertname: "); ok {
			current = a
		} else if s == "exp_alerts:" {
			firing[current] = true
		}
	}
	for _, a := range alerts {
		if !firing[a] {
			t.Errorf("alert %s has no test in which it fires", a)
		}
	}
}
