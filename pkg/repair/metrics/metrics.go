// Package metrics is the monitoring contract of the repair Deployment (the
// pod repair and node-readiness controllers): the names of its Prometheus
// metrics, their label names and the values those labels take. The
// controller registers its metrics under these names; the alert rules, the
// Grafana dashboard generator and the tests import them from here, so a
// renamed metric or value breaks them at compile time instead of leaving a
// silent alert or an empty panel.
//
// The reason label of pods_repaired_total and broken_pods takes the values of
// judge.Reason (judge.AllReasons); the action label, those of judge.Action.
package metrics

import "github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"

// Prefix is the prefix of every metric of the controller.
const Prefix = "consul_cni_repair_"

// Values of the metrics' labels.
const (
	ResultSuccess    = "success"
	ResultFailure    = "failure"
	ResultPDBBlocked = "pdb_blocked"

	SkipBarePod      = "bare_pod"
	SkipGateClosed   = "gate_closed"
	SkipRateLimited  = "rate_limited"
	SkipBreakerOpen  = "breaker_open"
	SkipAlreadyActed = "already_acted"

	ChangeLabelAdded   = "label_added"
	ChangeLabelRemoved = "label_removed"
	ChangeTaintRemoved = "taint_removed"
	ChangeTaintAdded   = "taint_added"

	DryRunTrue  = "true"
	DryRunFalse = "false"
	// ChangeReadySinceAdded: the ready-since annotation was added to a node
	// already labelled ready (one labelled before it existed).
	ChangeReadySinceAdded = "ready_since_added"
	// ChangeReadySinceMoved: the node's ready-since annotation was moved
	// forward to the readiness of its CNI pod, which is later (the CNI was
	// not continuously ready since: a node reboot).
	ChangeReadySinceMoved = "ready_since_moved"
)

// Metric names (Prefix included) that alerts and the dashboard use.
const (
	PodsRepaired         = Prefix + "pods_repaired_total"
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
	LabelDryRun    = "dry_run"
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

// RepairResults lists the results pods_repaired_total can count for an
// action: a dry run only decides (success); an eviction may also be blocked
// by a PodDisruptionBudget.
func RepairResults(action judge.Action, dryRun bool) []string {
	switch {
	case dryRun:
		return []string{ResultSuccess}
	case action == judge.ActionEvict:
		return []string{ResultSuccess, ResultFailure, ResultPDBBlocked}
	}
	return []string{ResultSuccess, ResultFailure}
}

// DryRunLabel is the dry_run label value of a configuration.
func DryRunLabel(dryRun bool) string {
	if dryRun {
		return DryRunTrue
	}
	return DryRunFalse
}
