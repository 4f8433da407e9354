package nodeready

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	appsinformers "k8s.io/client-go/informers/apps/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
)

// cniDaemonSet is a DaemonSet of the CNI namespace whose pods the CNI pod
// selector selects (unless labels says otherwise), placed by nodeSelector
// and tolerations.
func cniDaemonSet(name string, podLabels, nodeSelector map[string]string, tolerations ...corev1.Toleration) *appsv1.DaemonSet {
	if podLabels == nil {
		podLabels = map[string]string{"app.kubernetes.io/name": "consul-cni"}
	}
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: judge.DefaultConfig().CNINamespace, Name: name},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: podLabels},
			Spec:       corev1.PodSpec{NodeSelector: nodeSelector, Tolerations: tolerations, HostNetwork: true},
		}},
	}
}

var (
	linux      = map[string]string{"kubernetes.io/os": "linux"}
	windows    = map[string]string{"kubernetes.io/os": "windows"}
	everything = corev1.Toleration{Operator: corev1.TolerationOpExists}
	// consul-k8s's CNI DaemonSet tolerates only these (its chart's
	// cni-daemonset.yaml).
	consulK8sTolerations = []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}, {Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}}
	notReadyTaint        = corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}
)

// A startup taint that no watched CNI DaemonSet will come to lift (the
// node is not selected, or the taint not tolerated) is lifted, once the
// node is LiftGrace old, with a Warning Event saying why; one a CNI pod
// will come to lift, or with no CNI DaemonSet seen at all, stays.
func TestStartupTaintLiftedWhereNoCNIPodWillCome(t *testing.T) {
	old, young := -time.Hour, -10*time.Second
	for _, tc := range []struct {
		name       string
		labels     map[string]string
		age        time.Duration
		taints     []corev1.Taint
		daemonSets []*appsv1.DaemonSet
		readd      bool
		wantLifted string // "" keeps the taint
	}{
		{"a Windows node our Linux installer never selects", windows, old, nil,
			[]*appsv1.DaemonSet{cniDaemonSet("consul-cni", nil, linux, everything)}, false, "does not select node n1"},
		{"consul-k8s's DaemonSet does not tolerate the startup taint", linux, old, nil,
			[]*appsv1.DaemonSet{cniDaemonSet("consul-consul-cni", nil, linux, consulK8sTolerations...)}, false,
			"does not tolerate the taint " + annotations.TaintCNINotReady},
		{"a node another taint keeps our installer from", linux, old, []corev1.Taint{otherTaint},
			[]*appsv1.DaemonSet{cniDaemonSet("consul-cni", nil, linux, startupToleration())}, false, "does not tolerate the taint example.com/gpu"},
		{"not re-added where no CNI pod would lift it", windows, old, nil,
			[]*appsv1.DaemonSet{cniDaemonSet("consul-cni", nil, linux, everything)}, true, "does not select node n1"},
		{"our installer targets the node", linux, old, nil,
			[]*appsv1.DaemonSet{cniDaemonSet("consul-cni", nil, linux, everything)}, false, ""},
		{"one of two CNI DaemonSets targets the node", windows, old, nil,
			[]*appsv1.DaemonSet{cniDaemonSet("linux", nil, linux, everything), cniDaemonSet("windows", nil, windows, everything)}, false, ""},
		{"a node younger than the grace", windows, young, nil,
			[]*appsv1.DaemonSet{cniDaemonSet("consul-cni", nil, linux, everything)}, false, ""},
		{"no CNI DaemonSet seen: it may be on its way", windows, old, nil, nil, false, ""},
		{"a DaemonSet whose pods the CNI selector does not select", windows, old, nil,
			[]*appsv1.DaemonSet{cniDaemonSet("other", map[string]string{"app": "other"}, linux, everything)}, false, ""},
		{"the not-ready taint goes by itself: the DaemonSet comes then", linux, old, []corev1.Taint{notReadyTaint},
			[]*appsv1.DaemonSet{cniDaemonSet("consul-consul-cni", nil, linux, append(consulK8sTolerations, startupToleration())...)}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := nodeObject(tc.labels, append(tc.taints, startupTaint(corev1.TaintEffectNoSchedule))...)
			node.CreationTimestamp = metav1.NewTime(time.Now().Add(tc.age))
			h := newNRHarness(t, func(c *Config) { c.ReaddStartupTaint = tc.readd }, node, nil)
			h.withDaemonSets(tc.daemonSets...)
			if err := h.n.sync(context.Background(), "n1"); err != nil {
				t.Fatal(err)
			}
			tainted := hasTaint(h.node().Spec.Taints, annotations.TaintCNINotReady)
			if tc.wantLifted == "" {
				if !tainted {
					t.Fatalf("startup taint lifted: %v", h.node().Spec.Taints)
				}
				return
			}
			if tainted {
				t.Fatalf("startup taint kept: %v", h.node().Spec.Taints)
			}
			if len(h.node().Spec.Taints) != len(tc.taints) {
				t.Errorf("taints %v, want the others %v kept", h.node().Spec.Taints, tc.taints)
			}
			e := <-h.recorder.Events
			if !strings.HasPrefix(e, "Warning "+EventStartupTaintLifted) || !strings.Contains(e, tc.wantLifted) || !strings.Contains(e, "removed startup taint") {
				t.Errorf("event %q, want %s saying %q", e, EventStartupTaintLifted, tc.wantLifted)
			}
			if changes(h.metrics, metrics.ChangeTaintRemoved, metrics.ResultSuccess) != 1 {
				t.Error("taint removal not counted")
			}
		})
	}
}

func startupToleration() corev1.Toleration {
	return corev1.Toleration{Key: annotations.TaintCNINotReady, Operator: corev1.TolerationOpExists}
}

// withDaemonSets gives node readiness a DaemonSet informer holding dss.
func (h *nrHarness) withDaemonSets(dss ...*appsv1.DaemonSet) {
	h.t.Helper()
	inf := appsinformers.NewDaemonSetInformer(h.client, judge.DefaultConfig().CNINamespace, 0, cache.Indexers{})
	for _, ds := range dss {
		if err := inf.GetIndexer().Add(ds); err != nil {
			h.t.Fatal(err)
		}
	}
	h.n.daemonSets = inf.GetIndexer()
}
