//go:build integration

package scenario_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/scenario"
)

// runLabel is the label the scenario puts on its node (the installer
// DaemonSet is pinned to it).
const runLabel = "scenario.consul-cni-repair.test/run"

// readinessWitness watches the API while a prevention run goes and checks
// the order of what happens, each check made when the event arrives:
//   - the run's node registers with the startup taint;
//   - when the node gets the consul.hashicorp.com/cni=ready label or loses the
//     taint, the installer pod on it is Ready;
//   - when an injected pod is bound to the node, the node has lost the taint.
type readinessWitness struct {
	cs kubernetes.Interface

	mu         sync.Mutex
	node       string
	tainted    bool // seen with the taint
	labelled   time.Time
	untainted  time.Time
	scheduled  map[string]time.Time
	violations []string
	events     int
}

func (w *readinessWitness) violate(format string, a ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, fmt.Sprintf(format, a...))
}

func hasTaint(n *corev1.Node) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == annotations.TaintCNINotReady {
			return true
		}
	}
	return false
}

func (w *readinessWitness) installerReady(ctx context.Context, node string) (bool, string) {
	l, err := w.cs.CoreV1().Pods(judge.DefaultConfig().CNINamespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=consul-cni", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return false, err.Error()
	}
	var states []string
	for _, p := range l.Items {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				if c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					return true, ""
				}
				states = append(states, p.Name+" Ready="+string(c.Status))
			}
		}
	}
	return false, fmt.Sprintf("installer pods on %s: %d %v", node, len(l.Items), states)
}

func (w *readinessWitness) onNode(ctx context.Context, n *corev1.Node) {
	if !strings.HasPrefix(n.Labels[runLabel], string(scenario.Prevention)) {
		return
	}
	w.mu.Lock()
	w.events++
	if w.node == "" {
		w.node = n.Name
		w.tainted = hasTaint(n)
	}
	first := w.node == n.Name
	labelled := first && n.Labels[annotations.LabelCNIReady] == annotations.LabelCNIReadyValue && w.labelled.IsZero()
	untainted := first && !hasTaint(n) && w.tainted && w.untainted.IsZero()
	if labelled {
		w.labelled = time.Now()
	}
	if untainted {
		w.untainted = time.Now()
	}
	w.mu.Unlock()
	if !labelled && !untainted {
		return
	}
	if ok, why := w.installerReady(ctx, n.Name); !ok {
		w.violate("node %s labelled=%v untainted=%v while its installer was not Ready (%s)", n.Name, labelled, untainted, why)
	}
}

func (w *readinessWitness) onPod(ctx context.Context, p *corev1.Pod) {
	if p.Spec.NodeName == "" || !strings.HasPrefix(p.Namespace, "race-"+string(scenario.Prevention)) {
		return
	}
	w.mu.Lock()
	// Only the run's node: pods of an earlier run on the same control
	// plane may still be listed while their namespace goes away.
	if w.node == "" || p.Spec.NodeName != w.node {
		w.mu.Unlock()
		return
	}
	_, seen := w.scheduled[p.Name]
	if !seen {
		w.scheduled[p.Name] = time.Now()
	}
	w.mu.Unlock()
	if seen {
		return
	}
	n, err := w.cs.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		w.violate("pod %s bound to %s: %v", p.Name, p.Spec.NodeName, err)
		return
	}
	if hasTaint(n) {
		w.violate("pod %s bound to %s while the node still had the startup taint", p.Name, n.Name)
	}
	if n.Labels[annotations.LabelCNIReady] != annotations.LabelCNIReadyValue {
		w.violate("pod %s bound to %s before the node had %s=%s", p.Name, n.Name, annotations.LabelCNIReady, annotations.LabelCNIReadyValue)
	}
}

// start runs informers on the run's nodes and injected pods.
func (w *readinessWitness) start(ctx context.Context, t *testing.T) {
	nodes := informers.NewSharedInformerFactoryWithOptions(w.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = runLabel
	}))
	pods := informers.NewSharedInformerFactoryWithOptions(w.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = "app=" + scenario.Deployment
	}))
	nodes.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onNode(ctx, o.(*corev1.Node)) },
		UpdateFunc: func(_, o any) { w.onNode(ctx, o.(*corev1.Node)) },
	})
	pods.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { w.onPod(ctx, o.(*corev1.Pod)) },
		UpdateFunc: func(_, o any) { w.onPod(ctx, o.(*corev1.Pod)) },
	})
	nodes.Start(ctx.Done())
	pods.Start(ctx.Done())
	for typ, ok := range nodes.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("cache of %v never synced", typ)
		}
	}
	for typ, ok := range pods.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("cache of %v never synced", typ)
		}
	}
}
