package repair

import (
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
)

// LabelPatch is labelPatch for the integration tests of package repair_test.
var LabelPatch = labelPatch

// Outcome reads the counter of one outcome of an action on a pod of ns:
// result "success" from pod_repairs_total, or with dry "true" from
// dry_run_pod_repairs_total; a failure cause (metrics.CauseError,
// metrics.CausePDBBlocked) from pod_repair_failures_total.
func (m *Metrics) Outcome(ns, action, result string, reason judge.Reason, dry string) float64 {
	switch {
	case result == metrics.ResultSuccess && dry == "true":
		return testutil.ToFloat64(m.DryRunRepairs.WithLabelValues(ns, action, string(reason)))
	case result == metrics.ResultSuccess:
		return testutil.ToFloat64(m.Repairs.WithLabelValues(ns, action, string(reason)))
	}
	return testutil.ToFloat64(m.RepairFailures.WithLabelValues(ns, action, string(reason), result))
}
