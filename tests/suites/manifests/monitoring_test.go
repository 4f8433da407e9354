package manifests

import (
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// TestDashboardQueries parses every panel's PromQL with Prometheus' parser
// (after Grafana's substitution of $__rate_interval and friends) and checks
// each metric, label and label value against docs/reference/metrics.md's table.
func TestDashboardQueries(t *testing.T) {
	specs := architectureMetrics(t)
	d, cmLabels := dashboardFromBuild(t, buildOverlay(t, "base"))
	if cmLabels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v: want grafana_dashboard=1 for the Grafana sidecar", cmLabels)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q title %q: both must be set (stable links, provisioning)", d.UID, d.Title)
	}
	ids := map[int]string{}
	queries := 0
	for _, p := range allPanels(d.Panels) {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", p.ID, prev, p.Title)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q target %s: empty expr", p.Title, tg.RefID)
				continue
			}
			if _, err := checkQuery(specs, grafanaToPromQL(tg.Expr)); err != nil {
				t.Errorf("panel %q target %s: %v\n  expr: %s", p.Title, tg.RefID, err, tg.Expr)
			}
		}
	}
	t.Logf("%d panels, %d queries parsed and checked", len(ids), queries)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		metric, label, err := parseLabelValues(v.Definition)
		if err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
			continue
		}
		spec, ok := lookupMetric(specs, metric)
		if !ok {
			t.Errorf("variable %s: metric %s is not in docs/reference/metrics.md's metrics table", v.Name, metric)
		} else if _, ok := spec.Labels[label]; !ok {
			t.Errorf("variable %s: %s has no label %q", v.Name, metric, label)
		}
	}
}

var labelValuesRe = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

func parseLabelValues(def string) (metric, label string, err error) {
	m := labelValuesRe.FindStringSubmatch(strings.TrimSpace(def))
	if m == nil {
		return "", "", fmt.Errorf("query %q: want label_values(<metric>, <label>)", def)
	}
	if _, err := promqlParser.ParseExpr(m[1]); err != nil {
		return "", "", err
	}
	return m[1], m[2], nil
}

// TestDashboardCoversTheQuestions checks that the dashboard answers what an
// operator asks: which pods were repaired (per action, result, reason and
// namespace, over time), how many are broken now, how fast the controller
// acts, which nodes have a ready CNI, and whether the breaker is open.
func TestDashboardCoversTheQuestions(t *testing.T) {
	d, _ := dashboardFromBuild(t, buildOverlay(t, "base"))
	type need struct {
		what     string
		metric   string
		grouping []string // all of them in one aggregation over the metric
		fn       string   // a function the query must call (optional)
	}
	needs := []need{
		{"repaired pods per action over time", "consul_cni_repair_pod_repairs_total", []string{"action"}, "increase"},
		{"repaired pods per reason over time", "consul_cni_repair_pod_repairs_total", []string{"reason"}, "increase"},
		{"repaired pods per namespace over time", "consul_cni_repair_pod_repairs_total", []string{"namespace"}, "increase"},
		{"failed actions per action and cause over time", "consul_cni_repair_pod_repair_failures_total", []string{"action", "cause"}, "increase"},
		{"audit mode's would-be repairs per reason over time", "consul_cni_repair_dry_run_pod_repairs_total", []string{"reason"}, "increase"},
		{"currently broken pods", "consul_cni_repair_broken_pods", nil, ""},
		{"detection-to-action latency", "consul_cni_repair_detection_to_action_seconds_bucket", []string{"le"}, "histogram_quantile"},
		{"nodes CNI ready vs not", "consul_cni_repair_nodes", []string{"cni_ready"}, ""},
		{"circuit breaker state", "consul_cni_repair_circuit_breaker_open_nodes", nil, ""},
	}
	for _, n := range needs {
		found := false
		for _, p := range allPanels(d.Panels) {
			for _, tg := range p.Targets {
				e, err := promqlParser.ParseExpr(grafanaToPromQL(tg.Expr))
				if err != nil {
					continue // reported by TestDashboardQueries
				}
				if p.Type == "timeseries" || len(n.grouping) == 0 {
					if queryAnswers(e, n.metric, n.grouping, n.fn) {
						found = true
					}
				}
			}
		}
		if !found {
			t.Errorf("no panel shows %s (%s by %v)", n.what, n.metric, n.grouping)
		}
	}
}

// queryAnswers reports whether an expression aggregates metric by all of
// grouping (when given) and calls fn (when given).
func queryAnswers(e parser.Expr, metric string, grouping []string, fn string) bool {
	selects, groups, calls := false, false, fn == ""
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			if n.Name == metric {
				selects = true
			}
		case *parser.Call:
			if n.Func.Name == fn {
				calls = true
			}
		case *parser.AggregateExpr:
			if len(grouping) == 0 || n.Without {
				return nil
			}
			inner := false
			parser.Inspect(n.Expr, func(m parser.Node, _ []parser.Node) error {
				if vs, ok := m.(*parser.VectorSelector); ok && vs.Name == metric {
					inner = true
				}
				return nil
			})
			if inner && subset(grouping, n.Grouping) {
				groups = true
			}
		}
		return nil
	})
	return selects && calls && (len(grouping) == 0 || groups)
}

func subset(want, have []string) bool {
	for _, w := range want {
		if !contains(have, w) {
			return false
		}
	}
	return true
}

// TestAlertRules validates the PrometheusRule's groups with Prometheus'
// rule-file parser (the one `promtool check rules` and the server use:
// unknown fields, PromQL, durations, label names and annotation templates)
// and checks every expression against the metric contract.
func TestAlertRules(t *testing.T) {
	specs := architectureMetrics(t)
	objs := buildOverlay(t, "base")
	pr := find(t, objs, "PrometheusRule", controllerName)
	var typed monitoringv1.PrometheusRule
	decodeStrict(t, pr, &typed)
	groups, errs := parseRuleGroups(t, pr.Object["spec"])
	for _, err := range errs {
		t.Errorf("rule file: %v", err)
	}
	if groups == nil {
		t.FailNow()
	}
	alerts := map[string]rulefmt.Rule{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts[r.Alert] = r
			use, err := checkQuery(specs, r.Expr)
			if err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
			}
			if len(use.Metrics) == 0 {
				t.Errorf("alert %s selects no metric", r.Alert)
			}
			if s := r.Labels["severity"]; s != "info" && s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q, want info, warning or critical", r.Alert, s)
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: summary and description annotations are required", r.Alert)
			}
		}
	}
	// The four situations the alerts must cover, each by the metric that
	// tells it.
	for _, want := range []struct{ alert, metric string }{
		{"ConsulCNIPodsRepaired", "consul_cni_repair_pod_repairs_total"},
		{"ConsulCNIRepairFailing", "consul_cni_repair_pod_repair_failures_total"},
		{"ConsulCNIPodsUnmeshedAudit", "consul_cni_repair_dry_run"},
		{"ConsulCNIPodsUnmeshed", "consul_cni_repair_broken_pods"},
		{"ConsulCNIRepairCircuitBreakerOpen", "consul_cni_repair_circuit_breaker_open_nodes"},
		{"ConsulCNINodesNotReady", "consul_cni_repair_nodes"},
	} {
		r, ok := alerts[want.alert]
		if !ok {
			t.Errorf("alert %s missing", want.alert)
			continue
		}
		use, _ := checkQuery(specs, r.Expr)
		if !contains(use.Metrics, want.metric) {
			t.Errorf("alert %s: uses %v, want %s", want.alert, use.Metrics, want.metric)
		}
	}
	t.Logf("%d alerts validated", len(alerts))
}

// parseRuleGroups feeds a PrometheusRule's spec to rulefmt as a rule file.
func parseRuleGroups(tb testing.TB, spec any) (*rulefmt.RuleGroups, []error) {
	tb.Helper()
	b, err := yaml.Marshal(spec)
	if err != nil {
		tb.Fatal(err)
	}
	return parseRuleFile(b)
}

func parseRuleFile(b []byte) (*rulefmt.RuleGroups, []error) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	return rulefmt.Parse(b, false, model.UTF8Validation, promqlParser, logger)
}

// TestServiceMonitor decodes the ServiceMonitor strictly into the Prometheus
// Operator's API type and checks that it really selects the metrics Service
// and its port.
func TestServiceMonitor(t *testing.T) {
	objs := buildOverlay(t, "base")
	var sm monitoringv1.ServiceMonitor
	decodeStrict(t, find(t, objs, "ServiceMonitor", controllerName), &sm)
	var svc corev1.Service
	decodeStrict(t, find(t, objs, "Service", metricsSvcName), &svc)

	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(svc.Labels)) {
		t.Errorf("ServiceMonitor selector %s does not select Service %s (labels %v)", sel, svc.Name, svc.Labels)
	}
	if !sm.Spec.NamespaceSelector.Any && !contains(sm.Spec.NamespaceSelector.MatchNames, svc.Namespace) {
		t.Errorf("ServiceMonitor namespaceSelector %v does not include %s", sm.Spec.NamespaceSelector, svc.Namespace)
	}
	if len(sm.Spec.Endpoints) == 0 {
		t.Fatal("ServiceMonitor has no endpoint")
	}
	for _, ep := range sm.Spec.Endpoints {
		found := false
		for _, p := range svc.Spec.Ports {
			if p.Name == ep.Port {
				found = true
			}
		}
		if !found {
			t.Errorf("ServiceMonitor endpoint port %q is not a port name of Service %s", ep.Port, svc.Name)
		}
		// The headline counter's namespace label is the repaired pod's
		// namespace; without honorLabels Prometheus would rename it.
		if !ep.HonorLabels {
			t.Errorf("ServiceMonitor endpoint %q: honorLabels must be true", ep.Port)
		}
	}
}
