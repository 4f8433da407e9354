package install

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

// MetricsPrefix starts the name of every installer metric.
const MetricsPrefix = "consul_cni_installer_"

// Metrics are the installer's Prometheus metrics (prefix MetricsPrefix).
type Metrics struct {
	Reconciles *prometheus.CounterVec
	Writes     *prometheus.CounterVec
	Chained    prometheus.Gauge
	BuildInfo  *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricsPrefix + "reconciles_total",
			Help: "Passes over the node's CNI configuration, by result (chained, waiting: no primary network yet, error).",
		}, []string{"result"}),
		Writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricsPrefix + "writes_total",
			Help: "Files the installer wrote, by what (binary, kubeconfig, token, chain, convert).",
		}, []string{"what"}),
		Chained: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: MetricsPrefix + "chained",
			Help: "1 when consul-cni is the last plugin of the network the runtime reads and its binary is installed.",
		}),
		BuildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricsPrefix + "build_info",
			Help: "Build information; always 1.",
		}, []string{"version", "go_version"}),
	}
	m.BuildInfo.WithLabelValues(version.Version, runtime.Version()).Set(1)
	reg.MustRegister(m.Reconciles, m.Writes, m.Chained, m.BuildInfo)
	return m
}

func (m *Metrics) wrote(what string) {
	if m != nil {
		m.Writes.WithLabelValues(what).Inc()
	}
}

func (m *Metrics) reconciled(result string, chained bool) {
	if m == nil {
		return
	}
	m.Reconciles.WithLabelValues(result).Inc()
	if chained {
		m.Chained.Set(1)
	} else {
		m.Chained.Set(0)
	}
}
