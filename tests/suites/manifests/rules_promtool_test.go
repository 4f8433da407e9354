package manifests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/prometheus/model/rulefmt"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
)

// The alert rules' unit tests: the rule file is the PrometheusRule's spec
// taken from the build of manifests/base, the input series are written
// from the controller's own metric and label constants, shaped as the
// Prometheus Operator scrapes them with the ServiceMonitor (target labels
// job, instance, pod, ...; honorLabels: true keeps the exported namespace),
// and promtool (Debian's prometheus package) evaluates them.

// Kinds of cases. Every alert needs a firing case and the not-firing ones
// its metric allows (ruleKinds).
const (
	kindFiring    = "firing"
	kindDryRun    = "dry run"
	kindRecovered = "recovered"
	kindBelow     = "below threshold"
	kindReplicas  = "two replicas, one leads"
	kindBorn      = "series born at its first increment"
	// kindNoHonor shows why the ServiceMonitor's honorLabels: true is
	// required: without it the alerts carry the controller's namespace.
	kindNoHonor = "honorLabels: false"
)

// replica is one controller pod as a scrape target.
type replica struct {
	instance, pod string
	// start is process_start_time_seconds; promtool's clock starts at 0.
	start string
}

var (
	leader  = replica{"10.244.1.7:8080", controllerName + "-6d9f7c5b8-x2k4q", "-86400+0x200"}
	standby = replica{"10.244.2.9:8080", controllerName + "-6d9f7c5b8-p7m3z", "-86400+0x200"}
	// a leader whose process started at 0: it acted before its first scrape
	fresh = replica{"10.244.3.4:8080", controllerName + "-6d9f7c5b8-r8t5w", "0+0x200"}
)

// series is one input series of a promtool test.
type series struct {
	Series string `json:"series"`
	Values string `json:"values"`
}

// sample is a series as the controller exports it on replica r, before the
// scrape adds the target's labels.
type sample struct {
	r        replica
	name     string
	exported map[string]string
	values   string
}

// scraped is a series of replica r.
func scraped(r replica, name string, exported map[string]string, values string) sample {
	return sample{r, name, exported, values}
}

// render gives the series as Prometheus stores it after the ServiceMonitor's
// scrape: the target's labels (job, instance, pod, namespace, ...) and the
// exported ones. With honorLabels the exported labels win; without, an
// exported label that clashes is renamed exported_<name>.
func (s sample) render(honorLabels bool) series {
	ls := map[string]string{
		"job": metricsSvcName, "service": metricsSvcName, "endpoint": "metrics", "container": "repair",
		"namespace": namespace, "instance": s.r.instance, "pod": s.r.pod,
	}
	for k, v := range s.exported {
		if _, clash := ls[k]; clash && !honorLabels {
			k = "exported_" + k
		}
		ls[k] = v
	}
	keys := make([]string, 0, len(ls))
	for k := range ls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%q", k, ls[k])
	}
	return series{Series: s.name + "{" + b.String() + "}", Values: s.values}
}

// processStart is the process collector's start time of r.
func processStart(r replica) sample {
	return scraped(r, "process_start_time_seconds", nil, r.start)
}

const appNS = "web-shop"

// outcome is one of the action-counting families and, for failures, its
// cause.
type outcome struct{ family, cause string }

var (
	done      = outcome{metrics.PodRepairs, ""}
	failed    = outcome{metrics.PodRepairFailures, metrics.CauseError}
	pdbDenied = outcome{metrics.PodRepairFailures, metrics.CausePDBBlocked}
	decided   = outcome{metrics.DryRunPodRepairs, ""}
)

// repairedAll is a namespace's action-counting series, every series the
// controller creates at 0 for its configuration (metrics.RepairFamilies,
// metrics.FailureCauses and judge.AllReasons), with values for the one of
// outcome o and reason, and zero for the others; a values of "" leaves the
// namespace's series out. dryRun also exports the dry_run gauge at 1.
func repairedAll(r replica, action judge.Action, dryRun bool, o outcome, reason judge.Reason, values, zero string) []sample {
	var out []sample
	pick := func(fam, cause string, rs judge.Reason, ls map[string]string) {
		v := zero
		if fam == o.family && cause == o.cause && rs == reason {
			v = values
		}
		if v != "" {
			out = append(out, scraped(r, fam, ls, v))
		}
	}
	for _, fam := range metrics.RepairFamilies(dryRun) {
		for _, rs := range judge.AllReasons {
			ls := map[string]string{metrics.LabelNamespace: appNS, metrics.LabelAction: string(action), metrics.LabelReason: string(rs)}
			if fam != metrics.PodRepairFailures {
				pick(fam, "", rs, ls)
				continue
			}
			for _, c := range metrics.FailureCauses(action) {
				withCause := map[string]string{metrics.LabelCause: c}
				for k, v := range ls {
					withCause[k] = v
				}
				pick(fam, c, rs, withCause)
			}
		}
	}
	out = append(out, scraped(r, metrics.DryRun, nil, fmt.Sprintf("%dx200", map[bool]int{true: 1}[dryRun])))
	return append(out, processStart(r))
}

func readinessAll(r replica, change, result, values, zero string) []sample {
	var out []sample
	for _, c := range metrics.AllChanges {
		for _, res := range metrics.AllResults {
			v := zero
			if c == change && res == result {
				v = values
			}
			if v == "" {
				continue
			}
			out = append(out, scraped(r, metrics.NodeReadinessChanges, map[string]string{metrics.LabelChange: c, metrics.LabelResult: res}, v))
		}
	}
	return append(out, processStart(r))
}

func gauge(r replica, name string, exported map[string]string, values string) []sample {
	return []sample{scraped(r, name, exported, values), processStart(r)}
}

func broken(r replica, ns string, reason judge.Reason, values string) sample {
	return scraped(r, metrics.BrokenPods, map[string]string{metrics.LabelNamespace: ns, metrics.LabelReason: string(reason)}, values)
}

// Installer pods as the PodMonitor scrapes them: node is the target label
// its relabeling sets from the pod's node.
var (
	installerA  = replica{"198.18.0.1:9313", installerName + "-k7x2p", "-86400+0x200"}
	installerA2 = replica{"198.18.0.1:9313", installerName + "-w9q4z", "0+0x200"} // a rolling update's new pod on node-a
	installerB  = replica{"198.18.0.17:9313", installerName + "-m3d8r", "-86400+0x200"}
	freshInstA  = replica{"198.18.0.1:9313", installerName + "-n5t6v", "0+0x200"}
)

func installerSeries(r replica, node, name string, labels map[string]string, values string) sample {
	ls := map[string]string{"node": node}
	for k, v := range labels {
		ls[k] = v
	}
	return scraped(r, name, ls, values)
}

func chained(r replica, node, values string) sample {
	return installerSeries(r, node, "consul_cni_installer_chained", nil, values)
}

func chainWrites(r replica, node, values string) sample {
	return installerSeries(r, node, "consul_cni_installer_writes_total", map[string]string{"what": "chain"}, values)
}

func join(ss ...[]sample) []sample {
	var out []sample
	for _, s := range ss {
		out = append(out, s...)
	}
	return out
}

// ruleCase is one promtool test: input series, one evaluation time, the
// alerts expected then (labels without severity, which comes from the rule).
type ruleCase struct {
	alert, kind, name string
	series            []sample
	at                string
	want              []map[string]string
}

// Values are one sample per scrape interval (30s): "0x20 1x40" is 0 for 10
// minutes, then 1 for 20 more; "_" is no sample.
func ruleCases() []ruleCase {
	evict, ev := judge.ActionEvict, string(judge.ActionEvict)
	stuck, initFailed := judge.ReasonTProxyStatusStuck, judge.ReasonInitCheckFailed
	ok, failedChange := metrics.ResultSuccess, metrics.ResultFailure
	repairedLabels := map[string]string{metrics.LabelNamespace: appNS, metrics.LabelAction: ev, metrics.LabelReason: string(stuck)}
	failingLabels := map[string]string{metrics.LabelNamespace: appNS, metrics.LabelAction: ev}
	readinessLabels := map[string]string{metrics.LabelChange: metrics.ChangeTaintRemoved}
	unmeshedLabels := map[string]string{metrics.LabelNamespace: appNS}
	none := []map[string]string{}
	evictRight := map[string]string{metrics.LabelVerb: "create", metrics.LabelResource: "pods/eviction"}
	listPods := map[string]string{metrics.LabelVerb: "list", metrics.LabelResource: "pods"}
	return []ruleCase{
		// ConsulCNIPodsRepaired: increase over 30m of successful real actions.
		{"ConsulCNIPodsRepaired", kindFiring, "first repair in a namespace, on a series born at 0",
			repairedAll(leader, evict, false, done, stuck, "0x20 1x40", "0x60"), "15m", []map[string]string{repairedLabels}},
		{"ConsulCNIPodsRepaired", kindReplicas, "the standby's series stay at 0: one alert, not two",
			join(repairedAll(leader, evict, false, done, stuck, "0x20 1x40", "0x60"), repairedAll(standby, evict, false, done, stuck, "0x60", "0x60")),
			"15m", []map[string]string{repairedLabels}},
		{"ConsulCNIPodsRepaired", kindDryRun, "audit mode counts would-be repairs in dry_run_pod_repairs_total",
			repairedAll(leader, evict, true, decided, stuck, "0x20 1x40", "0x60"), "15m", none},
		{"ConsulCNIPodsRepaired", kindRecovered, "the repair was 35 minutes ago",
			repairedAll(leader, evict, false, done, stuck, "0x20 1x100", "0x120"), "45m", none},
		{"ConsulCNIPodsRepaired", kindBelow, "no repair, failures only",
			repairedAll(leader, evict, false, failed, stuck, "0x20 1x40", "0x60"), "15m", none},
		{"ConsulCNIPodsRepaired", kindBorn, "a new process acted before its first scrape",
			repairedAll(fresh, evict, false, done, stuck, "_x20 1x40", ""), "15m", []map[string]string{repairedLabels}},
		{"ConsulCNIPodsRepaired", kindBorn, "a long-running process's series first seen at 1 is history Prometheus did not scrape",
			repairedAll(leader, evict, false, done, stuck, "_x20 1x40", ""), "15m", none},
		{"ConsulCNIPodsRepaired", kindBorn, "a new process's series seen 2 repairs ago, then 1 more",
			repairedAll(fresh, evict, false, done, stuck, "_x20 2x10 3x30", ""), "15m", []map[string]string{repairedLabels}},

		{"ConsulCNIPodsRepaired", kindNoHonor, "the pod's namespace arrives as exported_namespace: the alert names the controller's",
			repairedAll(leader, evict, false, done, stuck, "0x20 1x40", "0x60"), "15m",
			[]map[string]string{{metrics.LabelNamespace: namespace, metrics.LabelAction: ev, metrics.LabelReason: string(stuck)}}},

		// ConsulCNIRepairFailing: increase over 15m of failed actions.
		{"ConsulCNIRepairFailing", kindFiring, "first failure in a namespace, on a series born at 0",
			repairedAll(leader, evict, false, failed, initFailed, "0x20 1x40", "0x60"), "15m", []map[string]string{failingLabels}},
		{"ConsulCNIRepairFailing", kindReplicas, "the standby's series stay at 0",
			join(repairedAll(leader, evict, false, failed, initFailed, "0x20 1x40", "0x60"), repairedAll(standby, evict, false, done, stuck, "0x60", "0x60")),
			"15m", []map[string]string{failingLabels}},
		{"ConsulCNIRepairFailing", kindDryRun, "a dry run only decides: no failure series",
			repairedAll(leader, evict, true, decided, stuck, "0x20 1x40", "0x60"), "15m", none},
		{"ConsulCNIRepairFailing", kindRecovered, "the failure was 20 minutes ago, the retry succeeded",
			join(repairedAll(leader, evict, false, failed, stuck, "0x20 1x100", "0x120")), "30m", none},
		{"ConsulCNIRepairFailing", kindBelow, "successes and PDB-blocked evictions only",
			join(repairedAll(leader, evict, false, done, stuck, "0x20 1x40", "0x60"), repairedAll(standby, evict, false, pdbDenied, stuck, "0x20 3x40", "0x60")),
			"15m", none},
		{"ConsulCNIRepairFailing", kindBorn, "a new process failed before its first scrape",
			repairedAll(fresh, evict, false, failed, stuck, "_x20 1x40", ""), "14m", []map[string]string{failingLabels}},

		// ConsulCNIPodsUnmeshed: broken pods, per namespace, for 15m.
		{"ConsulCNIPodsUnmeshed", kindFiring, "one broken pod for 25 minutes, seen by both replicas; a quiet namespace",
			[]sample{broken(leader, appNS, stuck, "0x10 1x60"), broken(leader, appNS, initFailed, "0x70"), broken(leader, "quiet", stuck, "0x70"),
				broken(standby, appNS, stuck, "0x10 1x60"), broken(standby, appNS, initFailed, "0x70"), broken(standby, "quiet", stuck, "0x70")},
			"30m", []map[string]string{unmeshedLabels}},
		{"ConsulCNIPodsUnmeshed", kindReplicas, "only the leader's replica reports the namespace",
			[]sample{broken(leader, appNS, stuck, "0x10 1x60"), broken(standby, "quiet", stuck, "0x70")}, "30m", []map[string]string{unmeshedLabels}},
		{"ConsulCNIPodsUnmeshed", kindDryRun, "audit mode leaves the pod outside the mesh on purpose: no page (ConsulCNIPodsUnmeshedAudit tells)",
			join([]sample{broken(leader, appNS, initFailed, "0x10 1x60")}, gauge(leader, metrics.DryRun, nil, "1x70")), "30m", none},
		{"ConsulCNIPodsUnmeshed", kindDryRun, "the controller switched from audit to acting 20 minutes ago",
			join([]sample{broken(leader, appNS, initFailed, "0x10 1x60")}, gauge(leader, metrics.DryRun, nil, "1x20 0x50")), "30m", []map[string]string{unmeshedLabels}},
		{"ConsulCNIPodsUnmeshed", kindRecovered, "broken for 20 minutes, repaired 15 minutes ago",
			[]sample{broken(leader, appNS, stuck, "0x10 1x40 0x40")}, "40m", none},
		{"ConsulCNIPodsUnmeshed", kindBelow, "broken for 10 minutes only",
			[]sample{broken(leader, appNS, stuck, "0x10 1x60")}, "15m", none},
		{"ConsulCNIPodsUnmeshed", kindBorn, "the namespace's series first seen at 1",
			[]sample{broken(leader, appNS, stuck, "_x10 1x60")}, "30m", []map[string]string{unmeshedLabels}},

		{"ConsulCNIPodsUnmeshed", kindNoHonor, "the pod's namespace arrives as exported_namespace: the alert names the controller's",
			[]sample{broken(leader, appNS, stuck, "0x10 1x60")}, "30m", []map[string]string{{metrics.LabelNamespace: namespace}}},

		// ConsulCNIPodsUnmeshedAudit: broken pods in audit mode, for 15m; info.
		{"ConsulCNIPodsUnmeshedAudit", kindFiring, "audit mode reports a broken pod for 25 minutes",
			join([]sample{broken(leader, appNS, stuck, "0x10 1x60"), broken(leader, "quiet", stuck, "0x70")}, gauge(leader, metrics.DryRun, nil, "1x70")),
			"30m", []map[string]string{unmeshedLabels}},
		{"ConsulCNIPodsUnmeshedAudit", kindReplicas, "both replicas report the pod and audit mode: one alert",
			join([]sample{broken(leader, appNS, stuck, "0x10 1x60"), broken(standby, appNS, stuck, "0x10 1x60")},
				gauge(leader, metrics.DryRun, nil, "1x70"), gauge(standby, metrics.DryRun, nil, "1x70")),
			"30m", []map[string]string{unmeshedLabels}},
		{"ConsulCNIPodsUnmeshedAudit", kindDryRun, "the controller acts: ConsulCNIPodsUnmeshed pages instead",
			join([]sample{broken(leader, appNS, stuck, "0x10 1x60")}, gauge(leader, metrics.DryRun, nil, "0x70")), "30m", none},
		{"ConsulCNIPodsUnmeshedAudit", kindDryRun, "a controller too old to export dry_run: ConsulCNIPodsUnmeshed pages as before",
			[]sample{broken(leader, appNS, stuck, "0x10 1x60")}, "30m", none},
		{"ConsulCNIPodsUnmeshedAudit", kindRecovered, "repaired by hand 15 minutes ago",
			join([]sample{broken(leader, appNS, stuck, "0x10 1x40 0x40")}, gauge(leader, metrics.DryRun, nil, "1x90")), "40m", none},
		{"ConsulCNIPodsUnmeshedAudit", kindBelow, "broken for 10 minutes only",
			join([]sample{broken(leader, appNS, stuck, "0x10 1x60")}, gauge(leader, metrics.DryRun, nil, "1x70")), "15m", none},
		{"ConsulCNIPodsUnmeshedAudit", kindBorn, "the namespace's series first seen at 1",
			join([]sample{broken(fresh, appNS, stuck, "_x10 1x60")}, gauge(fresh, metrics.DryRun, nil, "1x70")), "30m", []map[string]string{unmeshedLabels}},

		// ConsulCNIRepairCircuitBreakerOpen: for 5m.
		{"ConsulCNIRepairCircuitBreakerOpen", kindFiring, "open on the leader for 10 minutes",
			gauge(leader, metrics.BreakerOpenNodes, nil, "0x10 1x60"), "15m", []map[string]string{{}}},
		{"ConsulCNIRepairCircuitBreakerOpen", kindReplicas, "the standby's breaker stays closed",
			join(gauge(leader, metrics.BreakerOpenNodes, nil, "0x10 1x60"), gauge(standby, metrics.BreakerOpenNodes, nil, "0x70")), "15m", []map[string]string{{}}},
		{"ConsulCNIRepairCircuitBreakerOpen", kindRecovered, "closed again 5 minutes ago",
			gauge(leader, metrics.BreakerOpenNodes, nil, "0x10 1x30 0x30"), "25m", none},
		{"ConsulCNIRepairCircuitBreakerOpen", kindBelow, "open for 3 minutes",
			gauge(leader, metrics.BreakerOpenNodes, nil, "0x24 1x60"), "15m", none},
		{"ConsulCNIRepairCircuitBreakerOpen", kindBorn, "first seen at 1",
			gauge(fresh, metrics.BreakerOpenNodes, nil, "_x10 1x60"), "15m", []map[string]string{{}}},

		// ConsulCNINodesNotReady: for 15m.
		{"ConsulCNINodesNotReady", kindFiring, "a node without ready CNI for 20 minutes",
			gauge(leader, metrics.Nodes, map[string]string{metrics.LabelCNIReady: "false"}, "0x10 1x60"), "30m", []map[string]string{{}}},
		{"ConsulCNINodesNotReady", kindReplicas, "both replicas report it: one alert",
			join(gauge(leader, metrics.Nodes, map[string]string{metrics.LabelCNIReady: "false"}, "0x10 1x60"),
				gauge(standby, metrics.Nodes, map[string]string{metrics.LabelCNIReady: "false"}, "0x10 1x60")), "30m", []map[string]string{{}}},
		{"ConsulCNINodesNotReady", kindRecovered, "ready again",
			gauge(leader, metrics.Nodes, map[string]string{metrics.LabelCNIReady: "false"}, "0x10 1x40 0x20"), "35m", none},
		{"ConsulCNINodesNotReady", kindBelow, "ready nodes only",
			gauge(leader, metrics.Nodes, map[string]string{metrics.LabelCNIReady: "true"}, "3x70"), "30m", none},
		{"ConsulCNINodesNotReady", kindBorn, "first seen at 1",
			gauge(leader, metrics.Nodes, map[string]string{metrics.LabelCNIReady: "false"}, "_x10 1x60"), "30m", []map[string]string{{}}},

		// ConsulCNINodeReadinessFailing: increase over 15m of failed changes.
		{"ConsulCNINodeReadinessFailing", kindFiring, "first failed taint removal, on a series born at 0",
			readinessAll(leader, metrics.ChangeTaintRemoved, failedChange, "0x20 1x40", "0x60"), "15m", []map[string]string{readinessLabels}},
		{"ConsulCNINodeReadinessFailing", kindReplicas, "the standby's series stay at 0",
			join(readinessAll(leader, metrics.ChangeTaintRemoved, failedChange, "0x20 1x40", "0x60"), readinessAll(standby, metrics.ChangeTaintRemoved, failedChange, "0x60", "0x60")),
			"15m", []map[string]string{readinessLabels}},
		{"ConsulCNINodeReadinessFailing", kindRecovered, "the failure was 20 minutes ago",
			readinessAll(leader, metrics.ChangeTaintRemoved, failedChange, "0x20 1x100", "0x120"), "30m", none},
		{"ConsulCNINodeReadinessFailing", kindBelow, "successful changes only",
			readinessAll(leader, metrics.ChangeLabelAdded, ok, "0x20 5x40", "0x60"), "15m", none},
		{"ConsulCNINodeReadinessFailing", kindBorn, "a new process failed before its first scrape",
			readinessAll(fresh, metrics.ChangeTaintRemoved, failedChange, "_x20 1x40", ""), "14m", []map[string]string{readinessLabels}},

		// ConsulCNIInstallerNotChained: a node's installer unchained for 15m.
		{"ConsulCNIInstallerNotChained", kindFiring, "node-a unchained for 20 minutes, node-b chained",
			[]sample{chained(installerA, "node-a", "1x10 0x60"), chained(installerB, "node-b", "1x70")}, "30m",
			[]map[string]string{{"node": "node-a"}}},
		{"ConsulCNIInstallerNotChained", kindReplicas, "a rolling update: the new pod not yet chained beside the old one that is",
			[]sample{chained(installerA, "node-a", "1x70"), chained(installerA2, "node-a", "0x70")}, "30m", none},
		{"ConsulCNIInstallerNotChained", kindRecovered, "chained again 5 minutes ago",
			[]sample{chained(installerA, "node-a", "1x10 0x50 1x10")}, "35m", none},
		{"ConsulCNIInstallerNotChained", kindBelow, "unchained for 10 minutes only",
			[]sample{chained(installerA, "node-a", "1x40 0x30")}, "35m", none},
		{"ConsulCNIInstallerNotChained", kindBorn, "a new installer pod that never chains",
			[]sample{chained(freshInstA, "node-a", "_x10 0x60")}, "30m", []map[string]string{{"node": "node-a"}}},

		// ConsulCNIInstallerRestoringChain: more than 3 chain writes in 30m.
		{"ConsulCNIInstallerRestoringChain", kindFiring, "something rewrites node-a's chain every minute",
			[]sample{chainWrites(installerA, "node-a", "1x20 1+0.5x20 11x30"), chainWrites(installerB, "node-b", "1x70")}, "15m",
			[]map[string]string{{"node": "node-a"}}},
		{"ConsulCNIInstallerRestoringChain", kindReplicas, "a rolling update: each pod writes the chain once as it starts",
			[]sample{chainWrites(installerA, "node-a", "1x70"), chainWrites(installerA2, "node-a", "_x20 1x50"), chainWrites(installerB, "node-b", "1x70")}, "15m", none},
		{"ConsulCNIInstallerRestoringChain", kindRecovered, "the rewrites stopped 40 minutes ago",
			[]sample{chainWrites(installerA, "node-a", "1x20 1+0.5x20 11x100")}, "60m", none},
		{"ConsulCNIInstallerRestoringChain", kindBelow, "two restores in 30 minutes (a primary CNI's upgrade)",
			[]sample{chainWrites(installerA, "node-a", "1x20 2x10 3x40")}, "15m", none},
		{"ConsulCNIInstallerRestoringChain", kindBorn, "a new installer pod's first write is no restore",
			[]sample{chainWrites(freshInstA, "node-a", "_x20 1x50")}, "15m", none},

		// ConsulCNIRepairNoLeader: for 10m.
		{"ConsulCNIRepairNoLeader", kindFiring, "both replicas standing by for 20 minutes",
			join(gauge(leader, metrics.Leader, nil, "0x40"), gauge(standby, metrics.Leader, nil, "0x40")), "20m", []map[string]string{{}}},
		{"ConsulCNIRepairNoLeader", kindFiring, "no replica scraped at all",
			gauge(leader, "up", nil, "0x40"), "20m", []map[string]string{{}}},
		{"ConsulCNIRepairNoLeader", kindReplicas, "one replica leads",
			join(gauge(leader, metrics.Leader, nil, "1x40"), gauge(standby, metrics.Leader, nil, "0x40")), "20m", none},
		{"ConsulCNIRepairNoLeader", kindRecovered, "a new leader after 5 minutes",
			join(gauge(leader, metrics.Leader, nil, "0x10 1x30"), gauge(standby, metrics.Leader, nil, "0x40")), "20m", none},
		{"ConsulCNIRepairNoLeader", kindBelow, "leaderless for 5 minutes only",
			join(gauge(leader, metrics.Leader, nil, "1x30 0x10"), gauge(standby, metrics.Leader, nil, "0x40")), "20m", none},
		{"ConsulCNIRepairNoLeader", kindBorn, "the leader's series appears at 1",
			gauge(fresh, metrics.Leader, nil, "_x2 1x40"), "20m", none},

		// ConsulCNIRepairMissingRights: a right denied for 5m, per right.
		{"ConsulCNIRepairMissingRights", kindFiring, "eviction denied for 10 minutes, reads granted",
			join(gauge(leader, metrics.MissingRights, evictRight, "0x10 1x40"), gauge(leader, metrics.MissingRights, listPods, "0x50")), "20m",
			[]map[string]string{evictRight}},
		{"ConsulCNIRepairMissingRights", kindReplicas, "both replicas are denied it: one alert",
			join(gauge(leader, metrics.MissingRights, evictRight, "0x10 1x40"), gauge(standby, metrics.MissingRights, evictRight, "0x10 1x40")), "20m",
			[]map[string]string{evictRight}},
		{"ConsulCNIRepairMissingRights", kindRecovered, "granted again 5 minutes ago",
			gauge(leader, metrics.MissingRights, evictRight, "0x10 1x20 0x20"), "20m", none},
		{"ConsulCNIRepairMissingRights", kindBelow, "denied for 3 minutes only",
			gauge(leader, metrics.MissingRights, evictRight, "0x34 1x10"), "20m", none},
		{"ConsulCNIRepairMissingRights", kindBorn, "a new process denied from its first scrape",
			gauge(fresh, metrics.MissingRights, evictRight, "_x10 1x40"), "20m", []map[string]string{evictRight}},
	}
}

// ruleKinds are the kinds of case every alert must have; dry run where
// audit mode changes what the metric counts.
func ruleKinds(alert string) []string {
	kinds := []string{kindFiring, kindRecovered, kindBelow, kindReplicas, kindBorn}
	switch alert {
	case "ConsulCNIPodsRepaired", "ConsulCNIRepairFailing", "ConsulCNIPodsUnmeshed", "ConsulCNIPodsUnmeshedAudit":
		kinds = append(kinds, kindDryRun)
	}
	return kinds
}

// promtool's test file format.
type promtoolFile struct {
	RuleFiles          []string       `json:"rule_files"`
	EvaluationInterval string         `json:"evaluation_interval"`
	Tests              []promtoolTest `json:"tests"`
}

type promtoolTest struct {
	Name       string          `json:"name"`
	Interval   string          `json:"interval"`
	Input      []series        `json:"input_series"`
	AlertTests []promtoolAlert `json:"alert_rule_test"`
}

type promtoolAlert struct {
	EvalTime  string             `json:"eval_time"`
	AlertName string             `json:"alertname"`
	ExpAlerts []promtoolExpected `json:"exp_alerts"`
}

type promtoolExpected struct {
	ExpLabels map[string]string `json:"exp_labels"`
}

// shippedRules returns the spec of manifests/base's PrometheusRule (a rule
// file) and its parsed groups.
func shippedRules(tb testing.TB) (map[string]any, *rulefmt.RuleGroups) {
	tb.Helper()
	spec, ok := find(tb, buildOverlay(tb, "base"), "PrometheusRule", controllerName).DeepCopy().Object["spec"].(map[string]any)
	if !ok {
		tb.Fatal("PrometheusRule has no spec")
	}
	groups, errs := parseRuleGroups(tb, spec)
	if len(errs) > 0 {
		tb.Fatal(errs)
	}
	return spec, groups
}

// scrapeInterval is the ServiceMonitor's interval, the one the cases'
// values are written for.
func scrapeInterval(tb testing.TB) string {
	tb.Helper()
	var sm monitoringv1.ServiceMonitor
	decodeStrict(tb, find(tb, buildOverlay(tb, "base"), "ServiceMonitor", controllerName), &sm)
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Interval != "30s" {
		tb.Fatalf("ServiceMonitor endpoints %+v: the rule cases are written for one endpoint scraped every 30s", sm.Spec.Endpoints)
	}
	return string(sm.Spec.Endpoints[0].Interval)
}

// TestAlertRulesOnData runs `promtool test rules` on the shipped rules with
// the cases above, and checks that every alert has every kind of case.
func TestAlertRulesOnData(t *testing.T) {
	promtool := os.Getenv("CCR_PROMTOOL")
	if promtool == "" {
		var err error
		if promtool, err = exec.LookPath("promtool"); err != nil {
			t.Skip("promtool not found: `make test-monitoring` installs it (Debian package prometheus)")
		}
	}
	spec, groups := shippedRules(t)
	severity := map[string]string{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				severity[r.Alert] = r.Labels["severity"]
			}
		}
	}
	// Annotations are templates checked by TestAlertRules; promtool would
	// compare their rendering, which these cases do not state.
	for _, g := range spec["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			delete(r.(map[string]any), "annotations")
		}
	}

	cases := ruleCases()
	have := map[string]map[string]int{}
	interval := scrapeInterval(t)
	file := promtoolFile{RuleFiles: []string{"rules.yaml"}, EvaluationInterval: "30s"}
	for _, c := range cases {
		sev, ok := severity[c.alert]
		if !ok {
			t.Errorf("case %q: no alert %s in the shipped rules", c.name, c.alert)
			continue
		}
		if have[c.alert] == nil {
			have[c.alert] = map[string]int{}
		}
		have[c.alert][c.kind]++
		exp := []promtoolExpected{}
		for _, w := range c.want {
			ls := map[string]string{"severity": sev}
			for k, v := range w {
				ls[k] = v
			}
			exp = append(exp, promtoolExpected{ExpLabels: ls})
		}
		var input []series
		for _, smp := range c.series {
			input = append(input, smp.render(c.kind != kindNoHonor))
		}
		file.Tests = append(file.Tests, promtoolTest{
			Name: c.alert + ": " + c.kind + ": " + c.name, Interval: interval, Input: input,
			AlertTests: []promtoolAlert{{EvalTime: c.at, AlertName: c.alert, ExpAlerts: exp}},
		})
	}
	for alert := range severity {
		for _, k := range ruleKinds(alert) {
			if have[alert][k] == 0 {
				t.Errorf("alert %s has no %q case", alert, k)
			}
		}
	}

	dir := t.TempDir()
	rules, err := yaml.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tests.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", "tests.yaml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s\n--- tests.yaml ---\n%s", err, out, tests)
	}
	t.Logf("promtool: %d cases over %d alerts passed", len(cases), len(severity))
	for _, c := range cases {
		t.Logf("  %s / %s: %s (%d alert(s) at %s)", c.alert, c.kind, c.name, len(c.want), c.at)
	}
}
