package manifests

import (
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The checks above are only worth something if they reject what is wrong.
// These tests feed them wrong input.

const sampleTable = "# Arch\n\n### Controller metrics (prefix)\n" +
	"| metric | type | labels |\n|---|---|---|\n" +
	"| `consul_cni_repair_pods_repaired_total` | counter | `namespace`, `action` (evict, delete, label), `result` (success, failure) |\n" +
	"| `consul_cni_repair_detection_to_action_seconds` | histogram | `action` |\n" +
	"| `consul_cni_repair_leader` | gauge | |\n" +
	"| `consul_cni_repair_workqueue_*` | client-go workqueue metrics | `name` |\n" +
	"\n### Other table\n| `not_a_controller_metric` | gauge | |\n"

func sampleSpecs(t *testing.T) []metricSpec {
	specs, err := parseMetricTable(strings.NewReader(sampleTable))
	if err != nil {
		t.Fatal(err)
	}
	return specs
}

func TestParseMetricTable(t *testing.T) {
	specs := sampleSpecs(t)
	if len(specs) != 4 {
		t.Fatalf("parsed %d rows, want 4 (rows outside the controller table ignored): %+v", len(specs), specs)
	}
	s, ok := lookupMetric(specs, "consul_cni_repair_pods_repaired_total")
	if !ok || strings.Join(s.Labels["action"], ",") != "evict,delete,label" || s.Labels["namespace"] != nil {
		t.Errorf("headline row parsed as %+v", s)
	}
	for series, want := range map[string]bool{
		"consul_cni_repair_detection_to_action_seconds_bucket": true,
		"consul_cni_repair_detection_to_action_seconds_count":  true,
		"consul_cni_repair_leader_bucket":                      false, // a gauge has no buckets
		"consul_cni_repair_workqueue_depth":                    true,
		"not_a_controller_metric":                              false,
		"consul_cni_repair_pods_repaired":                      false,
	} {
		if _, ok := lookupMetric(specs, series); ok != want {
			t.Errorf("lookupMetric(%s) = %v, want %v", series, ok, want)
		}
	}
	if _, err := parseMetricTable(strings.NewReader("# nothing here\n")); err == nil {
		t.Error("a document without the table must be an error")
	}
}

func TestCheckQueryRejects(t *testing.T) {
	specs := sampleSpecs(t)
	good := []string{
		`sum by (action, result) (increase(consul_cni_repair_pods_repaired_total{namespace=~"$namespace"}[5m]))`,
		`histogram_quantile(0.99, sum by (le, action) (rate(consul_cni_repair_detection_to_action_seconds_bucket[5m])))`,
		`max by (instance) (consul_cni_repair_leader)`,
		`sum by (name) (consul_cni_repair_workqueue_depth)`,
		grafanaToPromQL(`sum(increase(consul_cni_repair_pods_repaired_total[$__rate_interval]))`),
	}
	for _, q := range good {
		if _, err := checkQuery(specs, q); err != nil {
			t.Errorf("%s: unexpected error %v", q, err)
		}
	}
	bad := map[string]string{
		`sum(rate(consul_cni_repair_pods_repaired_total[5m])`:                      "parse",
		`sum(rate(consul_cni_repair_pods_repaired_total[$__rate_interval]))`:       "parse", // not substituted
		`sum(rate(consul_cni_repair_pods_repaired_total[$range]))`:                 "parse",
		`sum(rate(consul_cni_repair_pods_repairs_total[5m]))`:                      "not in docs/reference/metrics.md",
		`sum(rate(consul_cni_repair_pods_repaired_total{reason="x"}[5m]))`:         `no label "reason"`,
		`sum(rate(consul_cni_repair_pods_repaired_total{result="succeeded"}[5m]))`: "value not among",
		`sum by (node) (rate(consul_cni_repair_pods_repaired_total[5m]))`:          `label "node"`,
		`histogram_quantile(0.9, rate(consul_cni_repair_leader_bucket[5m]))`:       "not in docs/reference/metrics.md",
		`{action="evict"}`: "names no metric",
	}
	for q, want := range bad {
		_, err := checkQuery(specs, q)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one mentioning %q", q, err, want)
		}
	}
}

func TestRuleFileRejects(t *testing.T) {
	for name, file := range map[string]string{
		"bad expr":       "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(\n",
		"unknown field":  "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    severity: warning\n",
		"bad template":   "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    annotations:\n      summary: '{{ $value | nosuchfunc }}'\n",
		"bad duration":   "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    for: 5 minutes\n",
		"record+alert":   "groups:\n- name: g\n  rules:\n  - alert: A\n    record: b\n    expr: up\n",
		"duplicate name": "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n- name: g\n  rules:\n  - alert: B\n    expr: up\n",
	} {
		if _, errs := parseRuleFile([]byte(file)); len(errs) == 0 {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, errs := parseRuleFile([]byte("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up > 0\n    for: 5m\n")); len(errs) != 0 {
		t.Errorf("valid file rejected: %v", errs)
	}
}

// TestRBACCheckDetectsChanges grants the installer one more verb and the
// controller one less in a build and expects both to be reported.
func TestRBACCheckDetectsChanges(t *testing.T) {
	objs := buildOverlay(t, "base")
	inst := find(t, objs, "ClusterRole", installerName)
	rules := inst.Object["rules"].([]any)
	rules[0].(map[string]any)["verbs"] = []any{"get", "patch", "delete"}
	ctrl := find(t, objs, "ClusterRole", controllerName)
	ctrl.Object["rules"] = ctrl.Object["rules"].([]any)[1:] // drop pods get/list/watch

	if d := wantInstaller().diff(rbacOf(t, objs, namespace, installerName)); !strings.Contains(d, "extra [delete pods.core") {
		t.Errorf("installer diff %q: want the extra delete reported", d)
	}
	if d := wantController("base").diff(rbacOf(t, objs, namespace, controllerName)); !strings.Contains(d, "missing [get pods.core") {
		t.Errorf("controller diff %q: want the missing pods verbs reported", d)
	}
}

func TestScrapeChecksReject(t *testing.T) {
	specs := sampleSpecs(t)
	text := `# TYPE consul_cni_repair_pods_repaired_total counter
consul_cni_repair_pods_repaired_total{namespace="a",action="evict",result="success"} 2
consul_cni_repair_pods_repaired_total{namespace="b",action="evict",result="failure"} 1
# TYPE consul_cni_repair_detection_to_action_seconds histogram
consul_cni_repair_detection_to_action_seconds_bucket{action="evict",le="1"} 1
consul_cni_repair_detection_to_action_seconds_bucket{action="evict",le="+Inf"} 1
consul_cni_repair_detection_to_action_seconds_sum{action="evict"} 0.5
consul_cni_repair_detection_to_action_seconds_count{action="evict"} 1
# TYPE consul_cni_repair_workqueue_depth gauge
consul_cni_repair_workqueue_depth{name="pods"} 0
`
	fams, err := parseExposition(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if err := checkFamily(specs, f); err != nil {
			t.Errorf("valid family %s: %v", f.GetName(), err)
		}
	}
	for series, want := range map[string]bool{
		"consul_cni_repair_pods_repaired_total":                true,
		"consul_cni_repair_detection_to_action_seconds_bucket": true,
		"consul_cni_repair_detection_to_action_seconds_count":  true,
		"consul_cni_repair_workqueue_depth":                    true,
		"consul_cni_repair_workqueue_retries_total":            false,
		"consul_cni_repair_leader":                             false,
		"consul_cni_repair_pods_repaired_total_bucket":         false,
	} {
		if got := isExported(fams, series); got != want {
			t.Errorf("isExported(%s) = %v, want %v", series, got, want)
		}
	}
	if got := counterSum(fams["consul_cni_repair_pods_repaired_total"], map[string]string{"action": "evict"}); got != 3 {
		t.Errorf("counterSum = %v, want 3", got)
	}
	if got := counterSum(fams["consul_cni_repair_pods_repaired_total"], map[string]string{"result": "success"}); got != 2 {
		t.Errorf("counterSum = %v, want 2", got)
	}
	for _, bad := range []string{
		"# TYPE consul_cni_repair_pods_repaired_total counter\nconsul_cni_repair_pods_repaired_total{namespace=\"a\",action=\"evict\",result=\"success\",pod=\"x\"} 1\n",
		"# TYPE consul_cni_repair_pods_repaired_total counter\nconsul_cni_repair_pods_repaired_total{namespace=\"a\",action=\"evict\"} 1\n",
		"# TYPE consul_cni_repair_pods_repaired_total counter\nconsul_cni_repair_pods_repaired_total{namespace=\"a\",action=\"evicted\",result=\"success\"} 1\n",
		"# TYPE consul_cni_repair_pods_repaired_total gauge\nconsul_cni_repair_pods_repaired_total{namespace=\"a\",action=\"evict\",result=\"success\"} 1\n",
		"# TYPE consul_cni_repair_unknown gauge\nconsul_cni_repair_unknown 1\n",
	} {
		fams, err := parseExposition(strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if err := checkFamily(specs, f); err == nil {
				t.Errorf("accepted:\n%s", bad)
			}
		}
	}
}

func parseExposition(r *strings.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}
