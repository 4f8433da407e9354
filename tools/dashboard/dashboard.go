// Package dashboard builds the Grafana dashboard of the repair controller
// with the Grafana Foundation SDK, from the controller's metric and label
// constants. `make dashboard` writes it to
// manifests/base/monitoring/grafana-dashboard.json; a test fails when the
// shipped file differs.
package dashboard

import (
	"encoding/json"
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/variants"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
)

// UID and Title identify the dashboard (stable links, provisioning).
const (
	UID   = "consul-cni-repair"
	Title = "Consul CNI repair"
)

// Path is where the JSON is shipped, relative to the repository root.
const Path = "manifests/base/monitoring/grafana-dashboard.json"

// nsVar is the namespace variable, in label matchers.
const nsVar = `namespace=~"$namespace"`

var datasource = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// JSON returns the dashboard as shipped: indented JSON with a final newline.
func JSON() ([]byte, error) {
	d, err := Build()
	if err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Build assembles the dashboard.
func Build() (dashboard.Dashboard, error) {
	b := dashboard.NewDashboardBuilder(Title).
		Uid(UID).
		Description("Pods that started outside the Consul service mesh because their sandbox was created before consul-cni "+
			"was in the node's CNI chain, what the repair controller did about them, and node CNI readiness.").
		Tags([]string{"consul", "cni", "service-mesh"}).
		Editable().
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Timezone(common.TimeZoneBrowser).
		Refresh("30s").
		Time("now-6h", "now").
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("namespace").
			Label("Namespace").
			Description("Namespaces holding injected transparent-proxy pods").
			Datasource(datasource).
			Definition(fmt.Sprintf("label_values(%s, %s)", metrics.BrokenPods, metrics.LabelNamespace)).
			Query(dashboard.StringOrMap{Map: map[string]any{
				"query": fmt.Sprintf("label_values(%s, %s)", metrics.BrokenPods, metrics.LabelNamespace), "refId": "namespace",
			}}).
			Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
			Sort(dashboard.VariableSortAlphabeticalAsc).
			Multi(true).
			IncludeAll(true).
			AllValue(".*"))
	id := uint32(0)
	next := func() uint32 { id++; return id }
	b.WithRow(dashboard.NewRowBuilder("Overview").Id(next()))
	for _, p := range overview() {
		b.WithPanel(p.Id(next()))
	}
	b.WithRow(dashboard.NewRowBuilder("Repairs").Id(next()))
	for _, p := range repairs() {
		b.WithPanel(p.Id(next()))
	}
	b.WithRow(dashboard.NewRowBuilder("Nodes").Id(next()))
	for _, p := range nodes() {
		b.WithPanel(p.Id(next()))
	}
	b.WithRow(dashboard.NewRowBuilder("Installer").Id(next()))
	for _, p := range installer() {
		b.WithPanel(p.Id(next()))
	}
	b.WithRow(dashboard.NewRowBuilder("Controller").Id(next()))
	for _, p := range controller() {
		b.WithPanel(p.Id(next()))
	}
	return b.Build()
}

// idPanel wraps the SDK's panel builders so rows can number them.
type idPanel struct {
	cog.Builder[dashboard.Panel]
	id func(uint32)
}

func (p idPanel) Id(id uint32) cog.Builder[dashboard.Panel] { p.id(id); return p.Builder }

func query(ref, expr, legend string) cog.Builder[variants.Dataquery] {
	return prometheus.NewDataqueryBuilder().RefId(ref).Expr(expr).LegendFormat(legend).Datasource(datasource)
}

func statPanel(title, desc, expr string) idPanel {
	s := stat.NewPanelBuilder().
		Title(title).Description(desc).Datasource(datasource).
		Height(4).Span(4).Unit("short").
		GraphMode(common.BigValueGraphModeNone).
		ColorMode(common.BigValueColorModeValue).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		WithTarget(query("A", expr, "__auto"))
	return idPanel{s, func(id uint32) { s.Id(id) }}
}

func seriesPanel(title, desc, unit string, w uint32, targets ...cog.Builder[variants.Dataquery]) idPanel {
	t := timeseries.NewPanelBuilder().
		Title(title).Description(desc).Datasource(datasource).
		Height(8).Span(w).Unit(unit).Min(0).
		FillOpacity(10).
		Targets(targets)
	return idPanel{t, func(id uint32) { t.Id(id) }}
}

// inNS selects metric with extra matchers and the namespace variable.
func inNS(metric, matchers string) string {
	if matchers != "" {
		matchers += ", "
	}
	return fmt.Sprintf("%s{%s%s}", metric, matchers, nsVar)
}

func overview() []idPanel {
	return []idPanel{
		statPanel("Pods repaired", "Injected pods found outside the mesh and acted on (evicted, deleted or labelled) in the selected time range.",
			fmt.Sprintf(`sum(increase(%s[$__range]))`, inNS(metrics.PodRepairs, ""))),
		statPanel("Would repair (dry-run)", "Pods the controller would have acted on in audit mode (--dry-run) in the selected time range.",
			fmt.Sprintf(`sum(increase(%s[$__range]))`, inNS(metrics.DryRunPodRepairs, ""))),
		statPanel("Broken pods now", "Injected pods currently detected running without transparent-proxy redirection (both replicas report them: max, not sum).",
			fmt.Sprintf(`sum(max by (namespace, reason) (%s{%s}))`, metrics.BrokenPods, nsVar)),
		statPanel("Nodes CNI ready", "Nodes labelled consul.hashicorp.com/cni=ready (their consul-cni installer pod is Ready).",
			fmt.Sprintf(`max(%s{cni_ready="true"})`, metrics.Nodes)),
		statPanel("Nodes CNI not ready", "Nodes without a Ready consul-cni installer pod: injected pods requiring the label are not scheduled there, and no repair happens there.",
			fmt.Sprintf(`max(%s{cni_ready="false"})`, metrics.Nodes)),
		statPanel("Circuit breaker open", "Nodes on which the circuit breaker stopped repairs (too large a share of broken pods whose sandbox was created after the CNI became ready: a misconfiguration).",
			fmt.Sprintf(`max(%s)`, metrics.BreakerOpenNodes)),
	}
}

func repairs() []idPanel {
	lat := metrics.Latency
	return []idPanel{
		seriesPanel("Repaired pods by action", "Pods acted on per interval (the API server carried the action out), by action (evict, delete, label).", "short", 12,
			query("A", fmt.Sprintf(`sum by (action) (increase(%s[$__rate_interval]))`, inNS(metrics.PodRepairs, "")), "{{action}}")),
		seriesPanel("Failed actions by cause", "Actions that did not happen per interval, by action and cause: error (refused or failed) or pdb_blocked (an eviction a PodDisruptionBudget forbade; retried, so one pod can count several times).", "short", 12,
			query("A", fmt.Sprintf(`sum by (action, cause) (increase(%s[$__rate_interval]))`, inNS(metrics.PodRepairFailures, "")), "{{action}} {{cause}}")),
		seriesPanel("Repaired pods by reason", "Pods acted on per interval by detection signal: tproxy_status_stuck (status annotation never became complete), init_check_failed (the init-container check exited with the watched code), sandbox_recreated (the sandbox was made again after cni-applied-at, without consul-cni) or verified_unredirected (the node verifier found no rules in the sandbox).", "short", 12,
			query("A", fmt.Sprintf(`sum by (reason) (increase(%s[$__rate_interval]))`, inNS(metrics.PodRepairs, "")), "{{reason}}")),
		seriesPanel("Would repair (dry-run) by reason", "Pods audit mode (--dry-run) would have acted on per interval, by detection signal; nothing was changed.", "short", 12,
			query("A", fmt.Sprintf(`sum by (reason) (increase(%s[$__rate_interval]))`, inNS(metrics.DryRunPodRepairs, "")), "{{reason}}")),
		seriesPanel("Repaired pods by namespace", "Pods acted on per interval by their namespace.", "short", 12,
			query("A", fmt.Sprintf(`sum by (namespace) (increase(%s[$__rate_interval]))`, inNS(metrics.PodRepairs, "")), "{{namespace}}")),
		seriesPanel("Currently broken pods by namespace", "Injected pods detected outside the mesh, by namespace and signal. They fall back to zero as the controller repairs them.", "short", 12,
			query("A", fmt.Sprintf(`max by (namespace, reason) (%s{%s})`, metrics.BrokenPods, nsVar), "{{namespace}} {{reason}}")),
		seriesPanel("Detection-to-action latency", "Time from a pod first seen broken by the controller to its successful action.", "s", 12,
			query("A", fmt.Sprintf(`histogram_quantile(0.5, sum by (le, action) (rate(%s_bucket[$__rate_interval])))`, lat), "p50 {{action}}"),
			query("B", fmt.Sprintf(`histogram_quantile(0.99, sum by (le, action) (rate(%s_bucket[$__rate_interval])))`, lat), "p99 {{action}}"),
			query("C", fmt.Sprintf(`sum by (action) (rate(%s_sum[$__rate_interval])) / sum by (action) (rate(%s_count[$__rate_interval]))`, lat, lat), "mean {{action}}")),
		seriesPanel("Skipped pods by reason", "Broken pods the controller deliberately did not act on: bare_pod, gate_closed (node CNI not ready), rate_limited, breaker_open, already_acted.", "short", 12,
			query("A", fmt.Sprintf(`sum by (reason) (increase(%s[$__rate_interval]))`, metrics.Skipped), "{{reason}}")),
	}
}

func nodes() []idPanel {
	return []idPanel{
		seriesPanel("Nodes: CNI ready vs not", "Nodes whose consul-cni installer pod is Ready (labelled consul.hashicorp.com/cni=ready) and the others.", "short", 8,
			query("A", fmt.Sprintf(`max by (cni_ready) (%s)`, metrics.Nodes), "cni_ready={{cni_ready}}")),
		seriesPanel("Circuit breaker state", "Nodes on which the circuit breaker is open (repairs stopped there).", "short", 8,
			query("A", fmt.Sprintf(`max(%s)`, metrics.BreakerOpenNodes), "open nodes")),
		seriesPanel("Node readiness changes", "Label added/removed and startup taint removed/added, by result.", "short", 8,
			query("A", fmt.Sprintf(`sum by (change, result) (increase(%s[$__rate_interval]))`, metrics.NodeReadinessChanges), "{{change}} {{result}}")),
	}
}

// installer is the row of the CNI installer DaemonSet's metrics, one series
// per node (the PodMonitor's node label).
func installer() []idPanel {
	const p = "consul_cni_installer_"
	return []idPanel{
		seriesPanel("Installer chained, by node", "1 while the node's installer has consul-cni last in the chain the runtime reads and its binary installed (the installer pod is Ready); 0 while not. During a rolling update two pods report: max.", "short", 8,
			query("A", fmt.Sprintf(`max by (node) (%schained)`, p), "{{node}}")),
		seriesPanel("Chain restores, by node", "Times the installer put consul-cni back into the chain per interval: once when it starts, then once per rewrite by something else (another CNI agent, consul-k8s's installer). A steady rate means a write war.", "short", 8,
			query("A", fmt.Sprintf(`sum by (node) (increase(%swrites_total{what="chain"}[$__rate_interval]))`, p), "{{node}}")),
		seriesPanel("Installer passes by result", "Passes over the nodes' CNI configuration per interval: chained, waiting (no primary network yet) or error.", "short", 8,
			query("A", fmt.Sprintf(`sum by (result) (increase(%sreconciles_total[$__rate_interval]))`, p), "{{result}}")),
	}
}

func controller() []idPanel {
	versions := table.NewPanelBuilder().
		Title("Versions").Description("Build of each running replica.").Datasource(datasource).
		Height(8).Span(8).
		Footer(common.NewTableFooterOptionsBuilder().Show(false).Reducer([]string{})).
		WithTarget(prometheus.NewDataqueryBuilder().RefId("A").Datasource(datasource).Instant().Format(prometheus.PromQueryFormatTable).
			Expr(fmt.Sprintf(`max by (instance, version, go_version) (%s)`, metrics.BuildInfo)))
	return []idPanel{
		seriesPanel("Leader", "1 on the replica holding the leader Lease; exactly one replica should.", "short", 8,
			query("A", fmt.Sprintf(`max by (instance) (%s)`, metrics.Leader), "{{instance}}")),
		seriesPanel("Work queue", "Keys waiting in the controller's work queues, and retries per second.", "short", 8,
			query("A", fmt.Sprintf(`sum by (name) (%sworkqueue_depth)`, metrics.Prefix), "depth {{name}}"),
			query("B", fmt.Sprintf(`sum by (name) (rate(%sworkqueue_retries_total[$__rate_interval]))`, metrics.Prefix), "retries/s {{name}}")),
		{versions, func(id uint32) { versions.Id(id) }},
	}
}
