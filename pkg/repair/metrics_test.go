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

// repairedSeries lists the pods_repaired_total series of a namespace, one
// per result and reason; results gives the value of the init_check_failed
// series (the others are 0).
func repairedSeries(ns, action, dry string, results map[string]float64) []string {
	var out []string
	for res, v := range results {
		for _, r := range judge.AllReasons {
			val := 0.0
			if r == judge.ReasonInitCheckFailed {
				val = v
			}
			out = append(out, fmt.Sprintf("{action=%s,dry_run=%s,namespace=%s,reason=%s,result=%s}=%v", action, dry, ns, r, res, val))
		}
	}
	sort.Strings(out)
	return out
}

// TestCountersBornAtZero: every counter series exists at 0 before its first
// increment, so that Prometheus' increase() sees the first event: the
// configuration's series from the start, a namespace's pods_repaired_total
// series (the configured action, each result it can count, each reason) as
// soon as an injected transparent-proxy pod of that namespace is seen.
func TestCountersBornAtZero(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mutate  func(*Config)
		action  string
		dry     string
		results []string
	}{
		{"evict", nil, "evict", "false", []string{metrics.ResultSuccess, metrics.ResultFailure, metrics.ResultPDBBlocked}},
		{"delete", func(c *Config) { c.Action = judge.ActionDelete }, "delete", "false", []string{metrics.ResultSuccess, metrics.ResultFailure}},
		{"label", func(c *Config) { c.Action = judge.ActionLabel }, "label", "false", []string{metrics.ResultSuccess, metrics.ResultFailure}},
		{"dry run", func(c *Config) { c.DryRun = true }, "evict", "true", []string{metrics.ResultSuccess}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.mutate, readyNode("n1"))
			h.addNode(readyNode("n1"))
			reg := h.metrics.Registry

			// From the start: skipped_total for every reason, the latency
			// histogram of the action, node readiness changes.
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
			if got := series(t, reg, metrics.PodsRepaired); len(got) != 0 {
				t.Errorf("pods_repaired_total before any pod was seen: %v", got)
			}

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
			zero := map[string]float64{}
			for _, r := range tc.results {
				zero[r] = 0
			}
			if got, want := series(t, reg, metrics.PodsRepaired), repairedSeries("app", tc.action, tc.dry, zero); !equal(got, want) {
				t.Fatalf("pods_repaired_total once a pod of namespace app was seen:\n got %v\nwant %v", got, want)
			}

			// The first action counts 1 on a series that was at 0.
			if err := h.sync(h.addPod(brokenB())); err != nil {
				t.Fatal(err)
			}
			zero[metrics.ResultSuccess] = 1
			if got, want := series(t, reg, metrics.PodsRepaired), repairedSeries("app", tc.action, tc.dry, zero); !equal(got, want) {
				t.Errorf("pods_repaired_total after the first action:\n got %v\nwant %v", got, want)
			}
		})
	}
}

func equal(a, b []string) bool {
	return strings.Join(a, "\n") == strings.Join(b, "\n")
}
