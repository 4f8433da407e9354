package manifests

import (
	"fmt"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// isExported reports whether a series name is present in the scraped
// families (a histogram's _bucket, _sum and _count belong to its family).
func isExported(fams map[string]*dto.MetricFamily, series string) bool {
	if _, ok := fams[series]; ok {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suf); ok {
			if f, ok := fams[base]; ok && f.GetType() == dto.MetricType_HISTOGRAM {
				return true
			}
		}
	}
	return false
}

// checkFamily compares a scraped family with its row of the table: type,
// label names (exactly) and label values (when the table lists them).
func checkFamily(specs []metricSpec, f *dto.MetricFamily) error {
	spec, ok := lookupMetric(specs, f.GetName())
	if !ok {
		return fmt.Errorf("exported metric %s is not in docs/reference/metrics.md's metrics table", f.GetName())
	}
	if spec.Prefix {
		return nil // a family of client-go metrics; the table lists its label only as a hint
	}
	wantType := map[string]dto.MetricType{"counter": dto.MetricType_COUNTER, "gauge": dto.MetricType_GAUGE, "histogram": dto.MetricType_HISTOGRAM}[spec.Type]
	if f.GetType() != wantType {
		return fmt.Errorf("%s is a %s, the table says %s", f.GetName(), f.GetType(), spec.Type)
	}
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		for name, value := range got {
			allowed, known := spec.Labels[name]
			if !known {
				return fmt.Errorf("%s has label %q, not in the table", f.GetName(), name)
			}
			if len(allowed) > 0 && !contains(allowed, value) {
				return fmt.Errorf("%s{%s=%q}: value not among %v", f.GetName(), name, value, allowed)
			}
		}
		for name := range spec.Labels {
			if _, ok := got[name]; !ok {
				return fmt.Errorf("%s lacks label %q", f.GetName(), name)
			}
		}
	}
	return nil
}

// counterSum adds the values of a counter family's series whose labels
// include match.
func counterSum(f *dto.MetricFamily, match map[string]string) float64 {
	if f == nil {
		return 0
	}
	var sum float64
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		ok := true
		for k, v := range match {
			if got[k] != v {
				ok = false
			}
		}
		if ok && m.GetCounter() != nil {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
