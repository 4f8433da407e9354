package repair

import (
	"runtime"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"k8s.io/client-go/util/workqueue"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/version"
)

// Metrics are the controller's metrics, all on one registry, under the
// names of package metrics.
type Metrics struct {
	Registry *prometheus.Registry

	Repairs              *prometheus.CounterVec
	RepairFailures       *prometheus.CounterVec
	DryRunRepairs        *prometheus.CounterVec
	DryRun               prometheus.Gauge
	Skipped              *prometheus.CounterVec
	Latency              *prometheus.HistogramVec
	BreakerOpenNodes     prometheus.GaugeFunc
	NodeReadinessChanges *prometheus.CounterVec
	Leader               prometheus.Gauge
	MissingRights        *prometheus.GaugeVec
	BuildInfo            *prometheus.GaugeVec

	// Workqueue is handed to the controllers' workqueues.
	Workqueue workqueue.MetricsProvider

	stateCollector *stateCollector

	// Counters are created at 0 as soon as their label set is known, so
	// that their first increment is an increase Prometheus can see.
	mu         sync.Mutex
	action     judge.Action
	dryRun     bool
	namespaces map[string]bool
}

// newMetrics creates and registers every metric on a new registry, together
// with the Go runtime and process collectors.
func newMetrics() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		Repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.PodRepairs,
			Help: "Pods that bypassed the CNI plugin and were acted on: the API server carried out the action (evict, delete, label).",
		}, []string{metrics.LabelNamespace, metrics.LabelAction, metrics.LabelReason}),
		RepairFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.PodRepairFailures,
			Help: "Actions on pods that bypassed the CNI plugin that did not happen, by cause (error: refused or failed; pdb_blocked: an eviction a PodDisruptionBudget forbade, retried).",
		}, []string{metrics.LabelNamespace, metrics.LabelAction, metrics.LabelReason, metrics.LabelCause}),
		DryRunRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.DryRunPodRepairs,
			Help: "Pods that bypassed the CNI plugin and would have been acted on: audit mode (--dry-run) decided and changed nothing.",
		}, []string{metrics.LabelNamespace, metrics.LabelAction, metrics.LabelReason}),
		DryRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: metrics.DryRun,
			Help: "1 while this controller runs in audit mode (--dry-run): it reports broken pods and acts on none.",
		}),
		Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.Skipped,
			Help: "Broken pods left alone, counted once per pod and reason.",
		}, []string{metrics.LabelReason}),
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metrics.Latency,
			Help:    "Time from a pod first seen broken by this controller to its successful action.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900},
		}, []string{metrics.LabelAction}),
		NodeReadinessChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NodeReadinessChanges,
			Help: "Node readiness label and startup taint changes made.",
		}, []string{metrics.LabelChange, metrics.LabelResult}),
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: metrics.Leader,
			Help: "1 while this replica holds the leader lease.",
		}),
		MissingRights: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metrics.MissingRights,
			Help: "1 while a right this controller's configuration needs is denied to it (SelfSubjectAccessReview), 0 once granted; one series per needed right.",
		}, []string{metrics.LabelVerb, metrics.LabelResource}),
		BuildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metrics.BuildInfo,
			Help: "Build information; always 1.",
		}, []string{"version", "go_version"}),
		stateCollector: &stateCollector{
			broken: prometheus.NewDesc(metrics.BrokenPods,
				"Injected pods currently detected as bypassing the CNI plugin, by namespace and reason; 0 for every namespace "+
					"holding injected transparent-proxy pods, so the namespace label is bounded by the number of such namespaces.",
				[]string{metrics.LabelNamespace, metrics.LabelReason}, nil),
			nodes: prometheus.NewDesc(metrics.Nodes, "Nodes by CNI readiness as the configured gate sees it.", []string{metrics.LabelCNIReady}, nil),
		},
		namespaces: map[string]bool{},
	}
	m.BuildInfo.WithLabelValues(version.Version, runtime.Version()).Set(1)
	m.Workqueue = newWorkqueueMetrics(reg)
	reg.MustRegister(m.Repairs, m.RepairFailures, m.DryRunRepairs, m.DryRun, m.Skipped, m.Latency, m.NodeReadinessChanges, m.Leader, m.MissingRights, m.BuildInfo, m.stateCollector,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// initCounters creates at 0 the series whose label sets the configuration
// alone determines: skipped_total for every reason, the latency histogram of
// the action and, with node readiness, every change and result.
func (m *Metrics) initCounters(cfg Config) {
	m.mu.Lock()
	m.action, m.dryRun = cfg.Action, cfg.DryRun
	m.mu.Unlock()
	if cfg.DryRun {
		m.DryRun.Set(1)
	} else {
		m.DryRun.Set(0)
	}
	for _, r := range metrics.AllSkipReasons {
		m.Skipped.WithLabelValues(r)
	}
	m.Latency.WithLabelValues(string(cfg.Action))
	if cfg.NodeReadiness {
		for _, c := range metrics.AllChanges {
			for _, r := range metrics.AllResults {
				m.NodeReadinessChanges.WithLabelValues(c, r)
			}
		}
	}
}

// knowNamespace creates at 0 the series of namespace ns that count actions
// of the configured kind and dry run: with dry run dry_run_pod_repairs_total,
// otherwise pod_repairs_total and pod_repair_failures_total (every cause the
// action can meet), each for every reason. It is called when an injected transparent-proxy pod of ns is first
// seen, before any pod of ns can be acted on.
func (m *Metrics) knowNamespace(ns string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.namespaces[ns] {
		return
	}
	m.namespaces[ns] = true
	action := string(m.action)
	for _, r := range judge.AllReasons {
		if m.dryRun {
			m.DryRunRepairs.WithLabelValues(ns, action, string(r))
			continue
		}
		m.Repairs.WithLabelValues(ns, action, string(r))
		for _, cause := range metrics.FailureCauses(m.action) {
			m.RepairFailures.WithLabelValues(ns, action, string(r), cause)
		}
	}
}

// registerBreaker exposes the breaker's open-node count.
func (m *Metrics) registerBreaker(b *judge.Breaker) {
	m.BreakerOpenNodes = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: metrics.BreakerOpenNodes,
		Help: "Nodes on which the circuit breaker currently stops repairs.",
	}, func() float64 { return float64(b.OpenNodes()) })
	m.Registry.MustRegister(m.BreakerOpenNodes)
}

// stateCollector computes the gauges that describe current state at scrape
// time from the informer caches, so they are never stale.
type stateCollector struct {
	broken, nodes *prometheus.Desc
	// brokenCounts and nodeCounts are set once the controller exists.
	brokenCounts func() map[string]map[judge.Reason]int
	nodeCounts   func() (ready, notReady int)
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.broken
	ch <- c.nodes
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	if c.brokenCounts != nil {
		for ns, counts := range c.brokenCounts() {
			for _, r := range judge.AllReasons {
				ch <- prometheus.MustNewConstMetric(c.broken, prometheus.GaugeValue, float64(counts[r]), ns, string(r))
			}
		}
	}
	if c.nodeCounts != nil {
		ready, notReady := c.nodeCounts()
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(ready), "true")
		ch <- prometheus.MustNewConstMetric(c.nodes, prometheus.GaugeValue, float64(notReady), "false")
	}
}

// workqueueMetrics implements workqueue.MetricsProvider on our registry as
// consul_cni_repair_workqueue_*{name}.
type workqueueMetrics struct {
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, work              *prometheus.HistogramVec
}

func newWorkqueueMetrics(reg prometheus.Registerer) *workqueueMetrics {
	p := metrics.Prefix + "workqueue_"
	buckets := prometheus.ExponentialBuckets(10e-9, 10, 12)
	w := &workqueueMetrics{
		depth:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: p + "depth", Help: "Current depth of the workqueue."}, []string{"name"}),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: p + "unfinished_work_seconds", Help: "Seconds of work in progress not yet observed by work_duration."}, []string{"name"}),
		longest:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: p + "longest_running_processor_seconds", Help: "Seconds the longest running processor has been running."}, []string{"name"}),
		adds:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: p + "adds_total", Help: "Adds handled by the workqueue."}, []string{"name"}),
		retries:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: p + "retries_total", Help: "Retries handled by the workqueue."}, []string{"name"}),
		latency:    prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: p + "queue_duration_seconds", Help: "Seconds an item stays in the workqueue before being processed.", Buckets: buckets}, []string{"name"}),
		work:       prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: p + "work_duration_seconds", Help: "Seconds processing an item takes.", Buckets: buckets}, []string{"name"}),
	}
	reg.MustRegister(w.depth, w.unfinished, w.longest, w.adds, w.retries, w.latency, w.work)
	return w
}

func (w *workqueueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return w.depth.WithLabelValues(name)
}
func (w *workqueueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return w.adds.WithLabelValues(name)
}
func (w *workqueueMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return w.latency.WithLabelValues(name)
}
func (w *workqueueMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return w.work.WithLabelValues(name)
}
func (w *workqueueMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return w.unfinished.WithLabelValues(name)
}
func (w *workqueueMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return w.longest.WithLabelValues(name)
}
func (w *workqueueMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return w.retries.WithLabelValues(name)
}
