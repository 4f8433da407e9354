package manifests

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"
)

// scrapeStep is the time between two scrapes loaded into the test storage.
const scrapeStep = 30 * time.Second

// flatten turns scraped families of the controller into series as
// Prometheus stores them (histograms as _bucket, _sum and _count), with the
// target labels Prometheus adds.
func flatten(fams map[string]*dto.MetricFamily, target map[string]string) map[string]float64 {
	out := map[string]float64{}
	key := func(name string, m *dto.Metric, extra ...string) string {
		ls := map[string]string{}
		for k, v := range target {
			ls[k] = v
		}
		for _, lp := range m.GetLabel() {
			ls[lp.GetName()] = lp.GetValue()
		}
		for i := 0; i+1 < len(extra); i += 2 {
			ls[extra[i]] = extra[i+1]
		}
		names := make([]string, 0, len(ls))
		for k := range ls {
			names = append(names, k)
		}
		sort.Strings(names)
		parts := make([]string, 0, len(names))
		for _, k := range names {
			parts = append(parts, fmt.Sprintf("%s=%q", k, ls[k]))
		}
		return name + "{" + strings.Join(parts, ",") + "}"
	}
	for name, f := range fams {
		if !strings.HasPrefix(name, "consul_cni_repair_") && name != "process_start_time_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			switch {
			case m.GetHistogram() != nil:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					out[key(name+"_bucket", m, "le", formatLe(b.GetUpperBound()))] = float64(b.GetCumulativeCount())
				}
				out[key(name+"_bucket", m, "le", "+Inf")] = float64(h.GetSampleCount())
				out[key(name+"_sum", m)] = h.GetSampleSum()
				out[key(name+"_count", m)] = float64(h.GetSampleCount())
			case m.GetCounter() != nil:
				out[key(name, m)] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key(name, m)] = m.GetGauge().GetValue()
			case m.GetUntyped() != nil:
				out[key(name, m)] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

func formatLe(v float64) string {
	if math.IsInf(v, 1) {
		return "+Inf"
	}
	return model.SampleValue(v).String()
}

// loadInput is a promqltest "load" command holding successive scrapes,
// scrapeStep apart ("_" where a series did not exist yet).
func loadInput(scrapes []map[string]float64) string {
	all := map[string]bool{}
	for _, s := range scrapes {
		for k := range s {
			all[k] = true
		}
	}
	keys := make([]string, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "load %s\n", model.Duration(scrapeStep))
	for _, k := range keys {
		b.WriteString("  " + k)
		for _, s := range scrapes {
			if v, ok := s[k]; ok {
				fmt.Fprintf(&b, " %s", model.SampleValue(v).String())
			} else {
				b.WriteString(" _")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

var dashboardVar = regexp.MustCompile(`\$\{?namespace\}?`)

// panelQuery makes a panel target's expression a PromQL query as Grafana
// sends it with every namespace selected.
func panelQuery(expr string) string {
	return grafanaToPromQL(dashboardVar.ReplaceAllString(expr, ".+"))
}

// queriesWithData evaluates every panel target of the dashboard at the last
// of the scrapes and returns, per "panel / refId", the number of series or
// samples returned.
func queriesWithData(tb testing.TB, d dashboard, scrapes []map[string]float64) map[string]int {
	tb.Helper()
	st := promqltest.LoadedStorage(tb, loadInput(scrapes))
	defer st.Close()
	engine := promqltest.NewTestEngine(tb, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	at := time.Unix(0, 0).Add(time.Duration(len(scrapes)-1) * scrapeStep)
	out := map[string]int{}
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			id := p.Title + " / " + tg.RefID
			q, err := engine.NewInstantQuery(context.Background(), st, nil, panelQuery(tg.Expr), at)
			if err != nil {
				tb.Errorf("%s: %v", id, err)
				continue
			}
			res := q.Exec(context.Background())
			switch v := res.Value.(type) {
			case promql.Vector:
				out[id] = len(v)
			case promql.Scalar:
				out[id] = 1
			case promql.Matrix:
				out[id] = len(v)
			}
			if res.Err != nil {
				tb.Errorf("%s: %v", id, res.Err)
			}
			q.Close()
		}
	}
	return out
}

// TestQueriesWithData checks the evaluation used by the integration test on
// two synthetic scrapes: a panel over a metric that is there returns data,
// one over a metric that is missing returns none.
func TestQueriesWithData(t *testing.T) {
	parse := func(text string) map[string]*dto.MetricFamily {
		p := expfmt.NewTextParser(model.UTF8Validation)
		f, err := p.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	const tmpl = "# TYPE consul_cni_repair_pods_repaired_total counter\n" +
		"consul_cni_repair_pods_repaired_total{namespace=\"a\",action=\"evict\",result=\"success\",reason=\"tproxy_status_stuck\",dry_run=\"false\"} %d\n" +
		"# TYPE consul_cni_repair_detection_to_action_seconds histogram\n" +
		"consul_cni_repair_detection_to_action_seconds_bucket{action=\"evict\",le=\"1\"} %d\n" +
		"consul_cni_repair_detection_to_action_seconds_bucket{action=\"evict\",le=\"+Inf\"} %d\n" +
		"consul_cni_repair_detection_to_action_seconds_sum{action=\"evict\"} %d\n" +
		"consul_cni_repair_detection_to_action_seconds_count{action=\"evict\"} %d\n"
	target := map[string]string{"job": metricsSvcName, "instance": "127.0.0.1:8080"}
	scrapes := []map[string]float64{flatten(parse(fmt.Sprintf(tmpl, 0, 0, 0, 0, 0)), target), flatten(parse(fmt.Sprintf(tmpl, 1, 1, 1, 1, 1)), target)}
	var d dashboard
	d.Panels = []panel{{Title: "repaired", Targets: []panelTarget{
		{RefID: "A", Expr: `sum by (namespace) (increase(consul_cni_repair_pods_repaired_total{namespace=~"$namespace"}[$__rate_interval]))`},
		{RefID: "B", Expr: `histogram_quantile(0.5, sum by (le, action) (rate(consul_cni_repair_detection_to_action_seconds_bucket[$__rate_interval])))`},
		{RefID: "C", Expr: `max(consul_cni_repair_circuit_breaker_open_nodes)`},
	}}}
	got := queriesWithData(t, d, scrapes)
	if got["repaired / A"] != 1 || got["repaired / B"] != 1 || got["repaired / C"] != 0 {
		t.Errorf("series per query: %v, want A and B 1, C 0", got)
	}
}
