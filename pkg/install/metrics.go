package install

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

// MetricsPrefix starts the name of every installer metric.
const MetricsPrefix = "consul_cni_installer_"

// Label values of the installer's counters.
const (
	ResultChained = "chained"
	ResultWaiting = "waiting"
	ResultError   = "error"

	WroteBinary     = "binary"
	WroteToken      = "token"
	WroteKubeconfig = "kubeconfig"
	WroteChain      = "chain"
	WroteConvert    = "convert"
)

// AllResults and AllWrites list every value of the reconciles_total result
// and writes_total what labels.
var (
	AllResults = []string{ResultChained, ResultWaiting, ResultError}
	AllWrites  = []string{WroteBinary, WroteToken, WroteKubeconfig, WroteChain, WroteConvert}
)

// Metrics are the installer's Prometheus metrics (prefix MetricsPrefix).
type Metrics struct {
	Reconciles *prometheus.CounterVec
	Writes     *prometheus.CounterVec
	Chained    prometheus.Gauge
	BuildInfo  *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them on reg. Every counter
// series exists at 0 from the start, so that its first increment is an
// increase Prometheus can see.
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
	for _, r := range AllResults {
		m.Reconciles.WithLabelValues(r)
	}
	for _, w := range AllWrites {
		m.Writes.WithLabelValues(w)
	}
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
