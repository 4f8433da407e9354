package repair

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
)

// series lists the series of a family as name{label=value,...}=value,
// sorted.
func series(t *testing.T, reg prometheus.Gatherer, name string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, lp := range m.GetLabel() {
				ls = append(ls, lp.GetName()+"="+lp.GetValue())
			}
			out = append(out, fmt.Sprintf("{%s}=%v", strings.Join(ls, ","), value(m)))
		}
	}
	sort.Strings(out)
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return -1
}

// repairedSeries lists the action-counting series of a namespace, one per
// reason (and, for failures, per cause), sorted by family; done is the value
// of the init_check_failed series of pod_repairs_total (or, with dry run, of
// dry_run_pod_repairs_total), every other series is 0.
func repairedSeries(ns string, action judge.Action, dry bool, done float64) map[string][]string {
	out := map[string][]string{}
	for _, fam := range metrics.RepairFamilies(dry) {
		for _, r := range judge.AllReasons {
			val := 0.0
			if r == judge.ReasonInitCheckFailed {
				val = done
			}
			if fam != metrics.PodRepairFailures {
				out[fam] = append(out[fam], fmt.Sprintf("{action=%s,namespace=%s,reason=%s}=%v", action, ns, r, val))
				continue
			}
			for _, cause := range metrics.FailureCauses(action) {
				out[fam] = append(out[fam], fmt.Sprintf("{action=%s,cause=%s,namespace=%s,reason=%s}=0", action, cause, ns, r))
			}
		}
		sort.Strings(out[fam])
	}
	return out
}

// repairFamilies are the three families that count actions by outcome.
var repairFamilies = []string{metrics.PodRepairs, metrics.PodRepairFailures, metrics.DryRunPodRepairs}

// checkRepairSeries compares each outcome family of the registry with want
// (a family missing from want must have no series).
func checkRepairSeries(t *testing.T, reg prometheus.Gatherer, when string, want map[string][]string) {
	t.Helper()
	for _, fam := range repairFamilies {
		if got := series(t, reg, fam); !equal(got, want[fam]) {
			t.Errorf("%s %s:\n got %v\nwant %v", fam, when, got, want[fam])
		}
	}
}

// TestCountersBornAtZero: every counter series exists at 0 before its first
// increment, so that Prometheus' increase() sees the first event: the
// configuration's series from the start, a namespace's series of the
// outcomes its configuration can count (a real action: done and failed by
// each cause the action can meet; a dry run: decided only) for every reason
// as soon as an injected transparent-proxy pod of that namespace is seen.
// The dry_run gauge tells audit mode from acting.
func TestCountersBornAtZero(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		action judge.Action
		dry    bool
	}{
		{"evict", nil, judge.ActionEvict, false},
		{"delete", func(c *Config) { c.Action = judge.ActionDelete }, judge.ActionDelete, false},
		{"label", func(c *Config) { c.Action = judge.ActionLabel }, judge.ActionLabel, false},
		{"dry run", func(c *Config) { c.DryRun = true }, judge.ActionEvict, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.mutate, readyNode("n1"))
			h.addNode(readyNode("n1"))
			reg := h.metrics.Registry

			// From the start: skipped_total for every reason, the latency
			// histogram of the action, node readiness changes, dry_run.
			var wantSkipped []string
			for _, r := range metrics.AllSkipReasons {
				wantSkipped = append(wantSkipped, fmt.Sprintf("{reason=%s}=0", r))
			}
			sort.Strings(wantSkipped)
			if got := series(t, reg, metrics.Skipped); !equal(got, wantSkipped) {
				t.Errorf("skipped_total at start:\n got %v\nwant %v", got, wantSkipped)
			}
			if got := series(t, reg, metrics.Latency); !equal(got, []string{fmt.Sprintf("{action=%s}=0", tc.action)}) {
				t.Errorf("detection_to_action_seconds at start: %v", got)
			}
			if got := series(t, reg, metrics.NodeReadinessChanges); len(got) != len(metrics.AllChanges)*len(metrics.AllResults) {
				t.Errorf("node_readiness_changes_total at start: %v, want every change and result at 0", got)
			}
			if got, want := series(t, reg, metrics.DryRun), []string{fmt.Sprintf("{}=%v", map[bool]int{true: 1}[tc.dry])}; !equal(got, want) {
				t.Errorf("dry_run = %v, want %v", got, want)
			}
			checkRepairSeries(t, reg, "before any pod was seen", nil)

			// An injected pod that is not transparent-proxy: nothing to
			// repair in its namespace, no series.
			plain := judgetest.Pod(judgetest.InNamespace("plain"), judgetest.WithoutAnnotation(annotations.KeyTransparentProxyStatus))
			h.addPod(plain)
			h.c.enqueuePod(plain)

			// A healthy transparent-proxy pod is seen (informer event):
			// its namespace's series are created at 0.
			healthy := judgetest.Pod(judgetest.WithStatus("complete"), judgetest.SandboxAt(-time.Hour))
			h.addPod(healthy)
			h.c.enqueuePod(healthy)
			checkRepairSeries(t, reg, "once a pod of namespace app was seen", repairedSeries("app", tc.action, tc.dry, 0))
			if t.Failed() {
				t.FailNow()
			}

			// The first action counts 1 on a series that was at 0, in the
			// family of its outcome only.
			if err := h.sync(h.addPod(brokenB())); err != nil {
				t.Fatal(err)
			}
			checkRepairSeries(t, reg, "after the first action", repairedSeries("app", tc.action, tc.dry, 1))
		})
	}
}

func equal(a, b []string) bool {
	return strings.Join(a, "\n") == strings.Join(b, "\n")
}
