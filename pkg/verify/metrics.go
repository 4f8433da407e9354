package verify

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names of the node verifier.
const (
	// MetricPods is a gauge of the judged pods on the node by verdict
	// (LabelVerdict): their current sandbox verified with the rules, without
	// them, or not verifiable.
	MetricPods = "consul_cni_verifier_pods"
	// MetricVerdicts counts published verdict changes by verdict.
	MetricVerdicts = "consul_cni_verifier_verdicts_total"
	// MetricLastPass is the time of the last completed pass (Unix seconds):
	// alert when it stops moving.
	MetricLastPass = "consul_cni_verifier_last_pass_timestamp_seconds"
	// LabelNode and LabelVerdict label MetricPods.
	LabelNode    = "node"
	LabelVerdict = "verdict"
)

// Metrics are the verifier's Prometheus collectors.
type Metrics struct {
	pods     *prometheus.GaugeVec
	verdicts *prometheus.CounterVec
	lastPass prometheus.Gauge
	node     string
}

// NewMetrics registers the verifier's metrics for node with reg; every
// series exists from the start.
func NewMetrics(reg prometheus.Registerer, node string) *Metrics {
	m := &Metrics{
		node: node,
		pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricPods,
			Help: "Injected pods on the node whose current sandbox was verified with their redirect rules (verdict=redirected), without them (unredirected), or could not be verified (unknown)."},
			[]string{LabelNode, LabelVerdict}),
		verdicts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricVerdicts,
			Help: "Verdicts published on pods (each change of a pod's verdict), by verdict."}, []string{LabelVerdict}),
		lastPass: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricLastPass,
			Help: "Unix time of the verifier's last completed pass over the node's sandboxes."}),
	}
	for _, v := range []Verdict{Redirected, Unredirected, Unknown} {
		m.pods.WithLabelValues(node, v.String())
		m.verdicts.WithLabelValues(v.String())
	}
	if reg != nil {
		reg.MustRegister(m.pods, m.verdicts, m.lastPass)
	}
	return m
}

// Inspected counts a published verdict.
func (m *Metrics) Inspected(v Verdict) {
	if m != nil {
		m.verdicts.WithLabelValues(v.String()).Inc()
	}
}

// Summary sets the gauges after a pass.
func (m *Metrics) Summary(s Summary) {
	if m == nil {
		return
	}
	m.pods.WithLabelValues(m.node, Redirected.String()).Set(float64(s.Redirected))
	m.pods.WithLabelValues(m.node, Unredirected.String()).Set(float64(s.Unredirected))
	m.pods.WithLabelValues(m.node, Unknown.String()).Set(float64(s.Unknown))
	m.lastPass.SetToCurrentTime()
}
