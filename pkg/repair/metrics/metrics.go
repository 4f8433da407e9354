// Package metrics is the monitoring contract of the repair Deployment (the
// pod repair and node-readiness controllers): the names of its Prometheus
// metrics, their label names and the values those labels take. The
// controller registers its metrics under these names; the alert rules, the
// Grafana dashboard generator and the tests import them from here, so a
// renamed metric or value breaks them at compile time instead of leaving a
// silent alert or an empty panel.
//
// What the controller did to pods is counted by outcome, each outcome a
// metric of its own: pod_repairs_total (actions the API server carried out),
// pod_repair_failures_total (actions refused or failed, by cause) and
// dry_run_pod_repairs_total (actions audit mode decided on and did not take).
// A sum over a family never mixes them. The reason label of these and of
// broken_pods takes the values of judge.Reason (judge.AllReasons); the action
// label, those of judge.Action.
package metrics

import "github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"

// Prefix is the prefix of every metric of the controller.
const Prefix = "consul_cni_repair_"

// Values of the metrics' labels.
const (
	ResultSuccess = "success"
	ResultFailure = "failure"

	// CauseError: the API server refused or failed the action.
	CauseError = "error"
	// CausePDBBlocked: a PodDisruptionBudget forbade the eviction now.
	CausePDBBlocked = "pdb_blocked"

	SkipBarePod      = "bare_pod"
	SkipGateClosed   = "gate_closed"
	SkipRateLimited  = "rate_limited"
	SkipBreakerOpen  = "breaker_open"
	SkipAlreadyActed = "already_acted"

	ChangeLabelAdded   = "label_added"
	ChangeLabelRemoved = "label_removed"
	ChangeTaintRemoved = "taint_removed"
	ChangeTaintAdded   = "taint_added"

	// ChangeReadySinceAdded: the ready-since annotation was added to a node
	// already labelled ready (one labelled before it existed).
	ChangeReadySinceAdded = "ready_since_added"
	// ChangeReadySinceMoved: the node's ready-since annotation was moved
	// forward to the readiness of its CNI pod, which is later (the CNI was
	// not continuously ready since: a node reboot).
	ChangeReadySinceMoved = "ready_since_moved"
	// ChangeReadySinceRemoved: the ready-since annotation, kept while the
	// node's CNI pod was not Ready for less than the flap bound, was removed
	// once that spell outlasted it (the label was removed at its start).
	ChangeReadySinceRemoved = "ready_since_removed"
)

// Metric names (Prefix included) that alerts and the dashboard use.
const (
	PodRepairs           = Prefix + "pod_repairs_total"
	PodRepairFailures    = Prefix + "pod_repair_failures_total"
	DryRunPodRepairs     = Prefix + "dry_run_pod_repairs_total"
	DryRun               = Prefix + "dry_run"
	BrokenPods           = Prefix + "broken_pods"
	Skipped              = Prefix + "skipped_total"
	Latency              = Prefix + "detection_to_action_seconds"
	BreakerOpenNodes     = Prefix + "circuit_breaker_open_nodes"
	Nodes                = Prefix + "nodes"
	NodeReadinessChanges = Prefix + "node_readiness_changes_total"
	Leader               = Prefix + "leader"
	MissingRights        = Prefix + "missing_rights"
	BuildInfo            = Prefix + "build_info"
)

// Label names of the controller's metrics.
const (
	LabelNamespace = "namespace"
	LabelAction    = "action"
	LabelResult    = "result"
	LabelReason    = "reason"
	LabelCause     = "cause"
	LabelChange    = "change"
	LabelCNIReady  = "cni_ready"
	LabelVerb      = "verb"
	LabelResource  = "resource"
)

// AllSkipReasons, AllChanges and AllResults list the values of
// skipped_total's reason and node_readiness_changes_total's change and
// result, in a fixed order.
var (
	AllSkipReasons = []string{SkipBarePod, SkipGateClosed, SkipRateLimited, SkipBreakerOpen, SkipAlreadyActed}
	AllChanges     = []string{ChangeLabelAdded, ChangeLabelRemoved, ChangeTaintRemoved, ChangeTaintAdded}
	AllResults     = []string{ResultSuccess, ResultFailure}
)

// FailureCauses lists the causes pod_repair_failures_total can count for
// an action: an eviction may also be blocked by a PodDisruptionBudget.
func FailureCauses(action judge.Action) []string {
	if action == judge.ActionEvict {
		return []string{CauseError, CausePDBBlocked}
	}
	return []string{CauseError}
}

// RepairFamilies lists the action-counting metrics a configuration exports:
// with dry run only dry_run_pod_repairs_total, otherwise pod_repairs_total
// and pod_repair_failures_total.
func RepairFamilies(dryRun bool) []string {
	if dryRun {
		return []string{DryRunPodRepairs}
	}
	return []string{PodRepairs, PodRepairFailures}
}
