// Package grafana holds xlimit's Grafana dashboard; its test checks the
// dashboard against the metrics the daemon exports.
package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/xlimit/xlimit/userspace/metrics"
)

const dashboardFile = "xlimit-dashboard.json"

// targetLabels are added by Prometheus to every series it scrapes; le is
// the bucket label of histograms.
var targetLabels = []string{"instance", "job", "le"}

var (
	// Desc{fqName: "name", help: "...", unit: "", constLabels: {}, variableLabels: {a,b}}
	descNameRE   = regexp.MustCompile(`fqName: "([^"]+)"`)
	descLabelsRE = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	metricRE     = regexp.MustCompile(`\bxlimit_[a-z0-9_]+`)
	selRE        = regexp.MustCompile(`\b(xlimit_[a-z0-9_]+)\{([^}]*)\}`)
	matcherRE    = regexp.MustCompile(`(\w+)\s*(?:=~|!~|!=|=)\s*"`)
	groupRE      = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	varRE        = regexp.MustCompile(`\$\{?(\w+)`)
)

// exported is the real collector's list: metric name -> label names, from
// its Describe; histograms (known from a Gather of the same collector)
// also get their _bucket, _sum and _count series. Nothing is filled in: a
// panel over a metric the collector does not describe fails the test.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	c := metrics.NewCollector(func() []metrics.Target { return nil }, func() uint64 { return 0 })
	c.ObserveTick(time.Millisecond, time.Second, nil) // the histogram has a sample to gather
	c.Reload("success")                               // so does the reloads vector
	descs := make(chan *prometheus.Desc)
	go func() { c.Describe(descs); close(descs) }()
	m := map[string][]string{}
	for d := range descs {
		s := d.String()
		name, labels := descNameRE.FindStringSubmatch(s), descLabelsRE.FindStringSubmatch(s)
		if name == nil || labels == nil {
			t.Fatalf("cannot read the descriptor %s", s)
		}
		var ls []string
		for l := range strings.SplitSeq(labels[1], ",") {
			if l != "" {
				ls = append(ls, l)
			}
		}
		m[name[1]] = ls
	}
	if len(m) < 10 {
		t.Fatalf("the collector describes only %d metrics: %v", len(m), m)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatalf("register the collector: %v", err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				m[f.GetName()+suffix] = m[f.GetName()]
			}
		}
	}
	return m
}

// queries returns every PromQL expression in the dashboard: panel
// targets, annotations and variable queries.
func queries(v any, out *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			switch s, isString := val.(string); {
			case isString && (k == "expr" || k == "definition" || k == "query" && strings.Contains(s, "xlimit_")):
				*out = append(*out, s)
			default:
				queries(val, out)
			}
		}
	case []any:
		for _, e := range x {
			queries(e, out)
		}
	}
}

func load(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardFile, err)
	}
	return d
}

func TestDashboardMetrics(t *testing.T) {
	d := load(t)
	known := exported(t)
	var exprs []string
	queries(d, &exprs)
	if len(exprs) < 20 {
		t.Fatalf("only %d expressions found", len(exprs))
	}
	used := map[string]bool{}
	for _, e := range exprs {
		names := metricRE.FindAllString(e, -1)
		if len(names) == 0 {
			t.Errorf("expression without an xlimit metric: %s", e)
		}
		allowed := slices.Clone(targetLabels)
		for _, n := range names {
			ls, ok := known[n]
			if !ok {
				t.Errorf("unknown metric %s in: %s", n, e)
				continue
			}
			used[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")] = true
			allowed = append(allowed, ls...)
		}
		for _, sel := range selRE.FindAllStringSubmatch(e, -1) {
			for _, m := range matcherRE.FindAllStringSubmatch(sel[2], -1) {
				if !slices.Contains(known[sel[1]], m[1]) && !slices.Contains(targetLabels, m[1]) {
					t.Errorf("%s has no label %q: %s", sel[1], m[1], e)
				}
			}
		}
		for _, g := range groupRE.FindAllStringSubmatch(e, -1) {
			for l := range strings.SplitSeq(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !slices.Contains(allowed, l) {
					t.Errorf("grouping by %q, which none of %v has: %s", l, names, e)
				}
			}
		}
		// label_values(metric, label)
		if rest, ok := strings.CutPrefix(e, "label_values("); ok {
			i := strings.LastIndex(rest, ",")
			label := strings.TrimSuffix(strings.TrimSpace(rest[i+1:]), ")")
			if !slices.Contains(allowed, label) {
				t.Errorf("variable query over a label %q the metric lacks: %s", label, e)
			}
		}
	}
	// Every metric of the collector is on the dashboard.
	for name := range known {
		if base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count"); !used[base] {
			t.Errorf("metric %s is not on the dashboard", base)
		}
	}
}

func TestDashboardStructure(t *testing.T) {
	d := load(t)
	if d["uid"] != "xlimit-overview" || d["title"] != "xlimit" {
		t.Errorf("uid %v title %v", d["uid"], d["title"])
	}
	vars := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true, "__all": true}
	for _, v := range d["templating"].(map[string]any)["list"].([]any) {
		vars[v.(map[string]any)["name"].(string)] = true
	}
	for _, want := range []string{"datasource", "instance", "iface", "rule"} {
		if !vars[want] {
			t.Errorf("no template variable %q", want)
		}
	}
	raw, _ := os.ReadFile(dashboardFile)
	for _, m := range varRE.FindAllStringSubmatch(string(raw), -1) {
		if !vars[m[1]] {
			t.Errorf("$%s is used but not defined", m[1])
		}
	}

	ids := map[float64]bool{}
	var titles []string
	var walk func([]any)
	walk = func(ps []any) {
		for _, p := range ps {
			p := p.(map[string]any)
			id, _ := p["id"].(float64)
			if ids[id] {
				t.Errorf("duplicate panel id %v", id)
			}
			ids[id] = true
			titles = append(titles, p["title"].(string))
			if _, ok := p["gridPos"].(map[string]any); !ok {
				t.Errorf("panel %q has no gridPos", p["title"])
			}
			if p["type"] != "row" {
				targets, _ := p["targets"].([]any)
				if len(targets) == 0 {
					t.Errorf("panel %q has no queries", p["title"])
				}
				if ds, _ := p["datasource"].(map[string]any); ds["uid"] != "${datasource}" {
					t.Errorf("panel %q does not use the datasource variable", p["title"])
				}
			}
			if sub, ok := p["panels"].([]any); ok {
				walk(sub)
			}
		}
	}
	walk(d["panels"].([]any))
	// What the issue asks the dashboard to show.
	for _, want := range []string{"Passed per rule", "Dropped per rule", "Would drop per rule (shadow)", "Rate in force",
		"Drops by reason", "Rules reloads", "Collector errors", "Observed latency", "Control state"} {
		if !slices.Contains(titles, want) {
			t.Errorf("no panel %q (panels: %q)", want, titles)
		}
	}
}

// TestDashboardPromQL parses every panel and annotation query with
// promtool (Debian package prometheus), its template variables replaced
// by values.
func TestDashboardPromQL(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found: install the Debian package prometheus (or put its promtool on PATH) to parse the queries")
	}
	var exprs []string
	queries(load(t), &exprs)
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
		"$instance", ".*", "$iface", ".*", "$rule", ".*")
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, e := range exprs {
		if strings.HasPrefix(e, "label_values(") {
			continue
		}
		q, _ := json.Marshal(vars.Replace(e)) // a JSON string is a YAML string
		fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", n, q)
		n++
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), fmt.Sprintf("SUCCESS: %d rules found", n)) {
		t.Errorf("promtool: %s", out)
	}
}
