package manifests

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// promqlParser is Prometheus' own PromQL parser with its default options,
// as a Prometheus server or Grafana's Prometheus data source backend uses it.
var promqlParser = parser.NewParser(parser.Options{})

// grafanaBuiltins are the Grafana variables our queries use in place of a
// duration; Grafana substitutes them before the query reaches Prometheus.
var grafanaBuiltins = regexp.MustCompile(`\$\{?(__rate_interval|__interval|__range)\}?`)

// grafanaToPromQL does Grafana's variable substitution for the built-in
// interval variables. Dashboard variables may only appear inside label
// matcher strings (namespace=~"$namespace"), where they are plain text to
// the parser; anywhere else they make the query fail to parse.
func grafanaToPromQL(expr string) string {
	return grafanaBuiltins.ReplaceAllString(expr, "5m")
}

// targetLabels are labels Prometheus adds to every scraped series.
var targetLabels = map[string]bool{"instance": true, "job": true}

// queryUse is what an expression asks of the metrics.
type queryUse struct {
	Metrics []string // series names selected
}

// checkQuery parses a PromQL expression and checks it against the metric
// contract: every selected series is in the table, every label it matches
// or groups by is one the metric has (or a target label, or le for a
// histogram's buckets), and every value it matches with = or != is one the
// table allows for that label.
func checkQuery(specs []metricSpec, expr string) (queryUse, error) {
	var use queryUse
	e, err := promqlParser.ParseExpr(expr)
	if err != nil {
		return use, fmt.Errorf("PromQL parse: %w", err)
	}
	var errs []string
	seen := map[string]bool{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
		}
		if name == "" {
			errs = append(errs, fmt.Sprintf("selector %s names no metric", vs))
			return nil
		}
		if !seen[name] {
			seen[name] = true
			use.Metrics = append(use.Metrics, name)
		}
		spec, ok := lookupMetric(specs, name)
		if !ok {
			errs = append(errs, fmt.Sprintf("metric %s is not in docs/reference/metrics.md's metrics table", name))
			return nil
		}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName || targetLabels[m.Name] {
				continue
			}
			allowed, known := spec.Labels[m.Name]
			if !known && !(m.Name == "le" && strings.HasSuffix(name, "_bucket")) {
				errs = append(errs, fmt.Sprintf("%s has no label %q", name, m.Name))
				continue
			}
			if len(allowed) > 0 && (m.Type == labels.MatchEqual || m.Type == labels.MatchNotEqual) && !contains(allowed, m.Value) {
				errs = append(errs, fmt.Sprintf("%s{%s=%q}: value not among %v", name, m.Name, m.Value, allowed))
			}
		}
		return nil
	})
	// Grouping labels must exist on at least one metric aggregated.
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		agg, ok := n.(*parser.AggregateExpr)
		if !ok || agg.Without {
			return nil
		}
		available := map[string]bool{}
		for k := range targetLabels {
			available[k] = true
		}
		parser.Inspect(agg.Expr, func(m parser.Node, _ []parser.Node) error {
			vs, ok := m.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			if spec, ok := lookupMetric(specs, vs.Name); ok {
				for l := range spec.Labels {
					available[l] = true
				}
				if strings.HasSuffix(vs.Name, "_bucket") {
					available["le"] = true
				}
			}
			return nil
		})
		for _, g := range agg.Grouping {
			if !available[g] {
				errs = append(errs, fmt.Sprintf("%s by (%s): no aggregated metric has label %q", agg.Op, strings.Join(agg.Grouping, ", "), g))
			}
		}
		return nil
	})
	if len(errs) > 0 {
		sort.Strings(errs)
		return use, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return use, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
