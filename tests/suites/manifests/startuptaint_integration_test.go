//go:build integration

package manifests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
)

// startupTaints returns the Node's taints with the startup taint's key.
func startupTaints(n *corev1.Node) []corev1.Taint {
	var out []corev1.Taint
	for _, t := range n.Spec.Taints {
		if t.Key == annotations.TaintCNINotReady {
			out = append(out, t)
		}
	}
	return out
}

// probeStartupTaint creates a Node in a server-side dry run and reports
// whether admission gave it the startup taint.
func probeStartupTaint(ctx context.Context, cs kubernetes.Interface) (bool, error) {
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "startup-taint-probe", Labels: map[string]string{"kubernetes.io/os": "linux"}}},
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return false, err
	}
	return len(startupTaints(n)) > 0, nil
}

// installStartupTaintPolicy applies the component's policy and binding and
// waits until the API server enforces them; cleanup removes them and waits
// until new Nodes are left alone again (other tests create Nodes).
func installStartupTaintPolicy(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	ctx := context.Background()
	a := newApplier(t, c)
	objs := buildStartupTaint(t)
	for _, kind := range []string{"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"} {
		if _, err := a.apply(ctx, find(t, objs, kind, startupTaintPolicyName), false); err != nil {
			t.Fatal(err)
		}
	}
	if w := a.takeWarnings(); len(w) > 0 {
		t.Errorf("API server warnings: %v", w)
	}
	t.Cleanup(func() {
		bg := context.Background()
		api := c.Client.AdmissionregistrationV1()
		_ = api.MutatingAdmissionPolicyBindings().Delete(bg, startupTaintPolicyName, metav1.DeleteOptions{})
		_ = api.MutatingAdmissionPolicies().Delete(bg, startupTaintPolicyName, metav1.DeleteOptions{})
		poll.Eventually(t, 2*time.Minute, "the policy no longer applies", func() error {
			if on, err := probeStartupTaint(bg, c.Client); err != nil || on {
				return fmt.Errorf("tainted %v, error %v", on, err)
			}
			return nil
		})
	})
	poll.Eventually(t, 2*time.Minute, "the policy applies", func() error {
		if on, err := probeStartupTaint(ctx, c.Client); err != nil || !on {
			return fmt.Errorf("tainted %v, error %v", on, err)
		}
		return nil
	})
}

// TestNodeStartupTaintPolicy runs the component's MutatingAdmissionPolicy
// in the real API server: Nodes created through the API get exactly one
// startup taint unless opted out, and the repair controller's removal of
// the taint is not undone by later updates.
func TestNodeStartupTaintPolicy(t *testing.T) {
	c := cluster.Shared(t)
	installStartupTaintPolicy(t, c)
	ctx := context.Background()
	nodes := c.Client.CoreV1().Nodes()
	suffix := fmt.Sprint(time.Now().UnixNano())
	other := corev1.Taint{Key: "example.com/other", Value: "x", Effect: corev1.TaintEffectNoExecute}
	want := corev1.Taint{Key: annotations.TaintCNINotReady, Value: "true", Effect: corev1.TaintEffectNoSchedule}
	kubeletTaint := corev1.Taint{Key: annotations.TaintCNINotReady, Effect: corev1.TaintEffectNoSchedule}
	cases := []struct {
		name   string
		labels map[string]string
		taints []corev1.Taint
		want   []corev1.Taint
	}{
		{name: "plain", want: []corev1.Taint{want}},
		// Only where a CNI pod will come: the installer runs on Linux
		// nodes only (kubelet labels the Node it creates with its OS).
		{name: "windows", labels: map[string]string{"kubernetes.io/os": "windows"}},
		{name: "no-os-label", labels: map[string]string{}},
		{name: "other-taint", taints: []corev1.Taint{other}, want: []corev1.Taint{other, want}},
		{name: "opted-out", labels: map[string]string{annotations.LabelCNIStartupTaint: annotations.LabelCNIStartupTaintOptOut}},
		{name: "opt-out-other-value", labels: map[string]string{annotations.LabelCNIStartupTaint: "true"}, want: []corev1.Taint{want}},
		{name: "kubelet-tainted", taints: []corev1.Taint{other, kubeletTaint}, want: []corev1.Taint{other, kubeletTaint}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			labels := map[string]string{"kubernetes.io/os": "linux"}
			if tc.labels != nil {
				labels = tc.labels
				if _, set := labels["kubernetes.io/os"]; !set && tc.name != "no-os-label" {
					labels["kubernetes.io/os"] = "linux"
				}
			}
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "taint-" + tc.name + "-" + suffix, Labels: labels}, Spec: corev1.NodeSpec{Taints: tc.taints}}
			got, err := nodes.Create(ctx, n, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = nodes.Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
			if !sameTaints(got.Spec.Taints, tc.want) {
				t.Errorf("taints %v, want %v", got.Spec.Taints, tc.want)
			}
		})
	}

	t.Run("removal not undone", func(t *testing.T) {
		n, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "taint-lifted-" + suffix, Labels: map[string]string{"kubernetes.io/os": "linux"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nodes.Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
		if len(startupTaints(n)) != 1 {
			t.Fatalf("taints %v, want the startup taint", n.Spec.Taints)
		}
		// The controller's removal (an update at the read resourceVersion),
		// then kubelet's later updates: its status and its labels.
		updateNode(t, nodes, n.Name, func(n *corev1.Node) error {
			var keep []corev1.Taint
			for _, tn := range n.Spec.Taints {
				if tn.Key != annotations.TaintCNINotReady {
					keep = append(keep, tn)
				}
			}
			n.Spec.Taints = keep
			_, err := nodes.Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
		updateNode(t, nodes, n.Name, func(n *corev1.Node) error {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now()}}
			_, err := nodes.UpdateStatus(ctx, n, metav1.UpdateOptions{})
			return err
		})
		updateNode(t, nodes, n.Name, func(n *corev1.Node) error {
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels["example.com/updated"] = "true"
			_, err := nodes.Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
		if n, err = nodes.Get(ctx, n.Name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		if ts := startupTaints(n); len(ts) != 0 || n.Labels["example.com/updated"] != "true" {
			t.Errorf("taints %v, labels %v after the removal and later updates, want no startup taint", n.Spec.Taints, n.Labels)
		}
	})
}

// updateNode reads the Node and calls update with it, again on a conflict
// (the node lifecycle controller updates Nodes too).
func updateNode(t *testing.T, nodes typedcorev1.NodeInterface, name string, update func(*corev1.Node) error) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return update(n)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// sameTaints compares taints by key, value and effect, in order, leaving
// out node.kubernetes.io/not-ready (the API server's NodeTaint admission
// adds it to every new Node).
func sameTaints(got, want []corev1.Taint) bool {
	var g []corev1.Taint
	for _, tn := range got {
		if tn.Key != corev1.TaintNodeNotReady {
			g = append(g, tn)
		}
	}
	if len(g) != len(want) {
		return false
	}
	for i := range g {
		if g[i].Key != want[i].Key || g[i].Value != want[i].Value || g[i].Effect != want[i].Effect {
			return false
		}
	}
	return true
}

// TestNodeStartupTaintWithoutController: with the policy and no repair
// controller, a simulated node that registers with no taint of its own is
// tainted; the installer DaemonSet (it tolerates the taint) still runs
// there and becomes Ready, an ordinary pod is refused by the scheduler for
// the taint (the node's only one), and the taint stays: nothing else lifts
// it.
func TestNodeStartupTaintWithoutController(t *testing.T) {
	if _, err := os.Stat(filepath.Join(testbin.RepoRoot(), "cmd", "consul-cni-installer")); err != nil {
		t.Skip("cmd/consul-cni-installer is not in this tree")
	}
	c := cluster.Shared(t)
	installStartupTaintPolicy(t, c)
	a := newApplier(t, c)
	ctx := context.Background()
	programs := simnode.ProjectPrograms(t)
	node := simnode.StartForTest(t, c, testnet.Reserve(t), func(cfg *simnode.Config) {
		cfg.Taints = nil
		for k, v := range programs {
			cfg.Programs[k] = v
		}
	})
	n, err := c.Client.CoreV1().Nodes().Get(ctx, node.Name(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(startupTaints(n)) != 1 {
		t.Fatalf("node %s registered with taints %v, want the startup taint from the policy", n.Name, n.Spec.Taints)
	}

	// The installer and what it needs; no controller.
	for _, o := range buildOverlay(t, "base") {
		if gvkOf(o).Group == monitoringGroup {
			continue
		}
		if o.GetKind() == "Namespace" || o.GetName() == installerName || o.GetName() == admissionPolicyName {
			if _, err := a.apply(ctx, o, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() { deleteWorkloads(t, c) })
	poll.Eventually(t, 4*time.Minute, "installer pod Ready on "+node.Name(), func() error {
		return podsReady(ctx, c, namespace, "app.kubernetes.io/name="+installerName, node.Name(), 1)
	})
	// Once the node is Ready its only taint is the startup taint.
	poll.Eventually(t, 2*time.Minute, "node "+node.Name()+" tainted with the startup taint only", func() error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, node.Name(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(n.Spec.Taints) != 1 || len(startupTaints(n)) != 1 {
			return fmt.Errorf("taints %v", n.Spec.Taints)
		}
		return nil
	})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "untolerating-" + node.Name(), Namespace: namespace},
		Spec: corev1.PodSpec{
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node.Name()}}}}},
			}}},
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.CoreV1().Pods(namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	})

	poll.Eventually(t, 2*time.Minute, "the scheduler refuses the ordinary pod for the taint", func() error {
		p, err := c.Client.CoreV1().Pods(namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s was bound to %s, a node with the startup taint", p.Name, p.Spec.NodeName)
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Reason == corev1.PodReasonUnschedulable && strings.Contains(cond.Message, "untolerated taint") {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", p.Status.Conditions)
	})
	if n, err = c.Client.CoreV1().Nodes().Get(ctx, node.Name(), metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(n.Spec.Taints) != 1 || len(startupTaints(n)) != 1 || n.Labels[annotations.LabelCNIReady] != "" {
		t.Errorf("node %s without a controller: taints %v, labels %v; want the startup taint and no readiness label", n.Name, n.Spec.Taints, n.Labels)
	}
}
