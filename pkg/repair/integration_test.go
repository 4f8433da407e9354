//go:build integration

package repair_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/nodeready"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// replicaSet creates a ReplicaSet of injected pods bound to node and waits
// for kube-controller-manager to create its pods.
func replicaSet(t *testing.T, c *cluster.Cluster, ns, app, node string, replicas int32) []corev1.Pod {
	t.Helper()
	_, err := c.Client.AppsV1().ReplicaSets(ns).Create(context.Background(), &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: app},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			Template: injectedPodTemplate(ns, app, node),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	poll.Eventually(t, waitTimeout, "ReplicaSet pods", func() (bool, error) {
		pods = podsOf(t, c.Client, ns, app)
		return len(pods) == int(replicas), nil
	})
	return pods
}

// replaced waits until the pod of uid is gone and the ReplicaSet has
// replicas live pods again, none of them the old one.
func replaced(t *testing.T, client kubernetes.Interface, ns, app string, old types.UID, replicas int) {
	t.Helper()
	poll.Eventually(t, waitTimeout, "pod "+string(old)+" replaced by kube-controller-manager", func() (bool, error) {
		live := 0
		for _, p := range podsOf(t, client, ns, app) {
			if p.UID == old {
				return false, nil
			}
			if p.DeletionTimestamp == nil {
				live++
			}
		}
		return live == replicas, nil
	})
}

func repairedTotal(m *repair.Manager, ns, action, result string, reason judge.Reason, dry string) float64 {
	return m.Metrics.Outcome(ns, action, result, reason, dry)
}

// repairsCounted fails unless the outcome's count comes to want and no
// further. A worker counts an action after its API call returns, so a test
// that has seen the effect (the pod replaced, the Event written) waits for
// the count instead of reading it once.
func repairsCounted(t *testing.T, m *repair.Manager, ns, action, result string, reason judge.Reason, dry string, want float64) {
	t.Helper()
	what := fmt.Sprintf("pod_repairs_total{namespace=%s,action=%s,result=%s,reason=%s,dry_run=%s} = %v", ns, action, result, reason, dry, want)
	poll.Eventually(t, waitTimeout, what, func() (bool, error) {
		return repairedTotal(m, ns, action, result, reason, dry) >= want, nil
	})
	if n := repairedTotal(m, ns, action, result, reason, dry); n != want {
		t.Fatalf("%s: got %v", what, n)
	}
}

// Broken pods of a ReplicaSet are evicted (as the controller's
// ServiceAccount, with the manifests' RBAC) and recreated by
// kube-controller-manager; the healthy pod is untouched.
func TestIntegrationEvictsAndReplicaSetRecreates(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, true)
	pods := replicaSet(t, c, ns, "web", node, 3)
	r := startController(t, c, ns, nil)

	healthy := pods[2]
	if _, err := c.Client.CoreV1().Pods(ns).Patch(context.Background(), healthy.Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+annotations.KeyTransparentProxyStatus+`":"complete"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	markRunningReady(t, c.Client, &healthy)
	for _, p := range pods[:2] {
		markBroken(t, c.Client, &p)
	}
	for _, p := range pods[:2] {
		replaced(t, c.Client, ns, "web", p.UID, 3)
		poll.Eventually(t, waitTimeout, "BypassedCNI event", func() (bool, error) {
			return len(events(t, c.Client, ns, p.UID, repair.EventBypassedCNI)) == 1, nil
		})
	}
	// The healthy pod is still there, unchanged by the controller.
	got, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), healthy.Name, metav1.GetOptions{})
	if err != nil || got.UID != healthy.UID || got.DeletionTimestamp != nil {
		t.Fatalf("healthy pod touched: %v %+v", err, got.ObjectMeta)
	}
	repairsCounted(t, r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false", 2)
	// The replacements (not broken yet: no sandbox) are left alone.
	time.Sleep(2 * time.Second)
	if n := repairedTotal(r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false"); n != 2 {
		t.Fatalf("pod_repairs_total = %v after replacement, want 2", n)
	}
}

// A PodDisruptionBudget without budget blocks the eviction (429, retried
// with back-off); once the budget allows it, the pod is evicted.
func TestIntegrationPDBBlocksUntilAllowed(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, true)
	pods := replicaSet(t, c, ns, "db", node, 2)
	two := intstr.FromInt32(2)
	pdb, err := c.Client.PolicyV1().PodDisruptionBudgets(ns).Create(context.Background(), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &two, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Both pods run and are Ready (so the budget counts them); pod 0 has
	// its status still "enabled" (signal A), pod 1 is meshed.
	if _, err := c.Client.CoreV1().Pods(ns).Patch(context.Background(), pods[1].Name, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"`+annotations.KeyTransparentProxyStatus+`":"complete"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		markRunningReady(t, c.Client, &p)
	}
	poll.Eventually(t, waitTimeout, "disruption controller to count 2 healthy pods", func() (bool, error) {
		p, err := c.Client.PolicyV1().PodDisruptionBudgets(ns).Get(context.Background(), "db", metav1.GetOptions{})
		return err == nil && p.Status.CurrentHealthy == 2 && p.Status.ObservedGeneration == p.Generation, err
	})
	r := startController(t, c, ns, nil)

	poll.Eventually(t, waitTimeout, "eviction blocked by the PDB", func() (bool, error) {
		return repairedTotal(r.m, ns, "evict", metrics.CausePDBBlocked, judge.ReasonTProxyStatusStuck, "false") >= 2, nil
	})
	if len(events(t, c.Client, ns, pods[0].UID, repair.EventEvictionBlocked)) == 0 {
		t.Error("no EvictionBlocked event")
	}
	got, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), pods[0].Name, metav1.GetOptions{})
	if err != nil || got.DeletionTimestamp != nil {
		t.Fatalf("pod evicted despite the PDB: %v %+v", err, got.ObjectMeta)
	}

	// The budget allows one disruption now.
	pdb, _ = c.Client.PolicyV1().PodDisruptionBudgets(ns).Get(context.Background(), "db", metav1.GetOptions{})
	one := intstr.FromInt32(1)
	pdb.Spec.MinAvailable = &one
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets(ns).Update(context.Background(), pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	replaced(t, c.Client, ns, "db", pods[0].UID, 2)
	repairsCounted(t, r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonTProxyStatusStuck, "false", 1)
	if p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), pods[1].Name, metav1.GetOptions{}); err != nil || p.UID != pods[1].UID {
		t.Fatalf("meshed pod touched: %v", err)
	}
}

// A bare pod is reported (Event, metric) and never touched.
func TestIntegrationBarePodUntouched(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, true)
	tmpl := injectedPodTemplate(ns, "bare", node)
	pod, err := c.Client.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: "bare", Labels: tmpl.Labels, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := startController(t, c, ns, func(m *repair.ManagerConfig) { m.Action = judge.ActionDelete })
	pod = markBroken(t, c.Client, pod)
	poll.Eventually(t, waitTimeout, "BarePodNotRepaired event", func() (bool, error) {
		return len(events(t, c.Client, ns, pod.UID, repair.EventBarePodNotRepaired)) == 1, nil
	})
	got, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), "bare", metav1.GetOptions{})
	if err != nil || got.UID != pod.UID || got.ResourceVersion != pod.ResourceVersion || got.DeletionTimestamp != nil {
		t.Fatalf("bare pod touched: %v %+v", err, got.ObjectMeta)
	}
	if n := testutil.ToFloat64(r.m.Metrics.Skipped.WithLabelValues(metrics.SkipBarePod)); n != 1 {
		t.Fatalf("skipped bare_pod = %v", n)
	}
}

// The label action's merge patch against the real API server: it keeps the
// pod's other labels, and its UID and resourceVersion are preconditions (a
// changed or replaced pod is refused, so the controller never labels a pod
// it did not judge).
func TestIntegrationLabelPatchPreconditions(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	pods := c.Client.CoreV1().Pods(ns)
	ctx := context.Background()
	// Bound to a node of its own, so no scheduler or kubelet changes it.
	tmpl := injectedPodTemplate(ns, "lbl", createNode(t, c, true))
	create := func() *corev1.Pod {
		p, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lbl",
			Labels: map[string]string{"app": "lbl", "tier": "web"}, Annotations: tmpl.Annotations}, Spec: tmpl.Spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	patch := func(judged *corev1.Pod) error {
		b, err := repair.LabelPatch(judged)
		if err != nil {
			t.Fatal(err)
		}
		_, err = pods.Patch(ctx, judged.Name, types.MergePatchType, b, metav1.PatchOptions{})
		return err
	}
	judged := create()

	// Changed since judged: refused.
	changed := judged.DeepCopy()
	changed.Annotations["touched"] = "yes"
	if _, err := pods.Update(ctx, changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := patch(judged); !apierrors.IsConflict(err) {
		t.Fatalf("patch of a pod changed since it was judged: %v, want a conflict", err)
	}

	// Replaced (same name, new UID): refused.
	if err := pods.Delete(ctx, "lbl", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, waitTimeout, "the pod to be gone", func() (bool, error) {
		_, err := pods.Get(ctx, "lbl", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	replacement := create()
	if err := patch(judged); err == nil || (!apierrors.IsConflict(err) && !apierrors.IsInvalid(err)) {
		t.Fatalf("patch of a replaced pod: %v, want a conflict or an invalid change", err)
	}

	// Unchanged: labelled, other labels kept.
	if err := patch(replacement); err != nil {
		t.Fatal(err)
	}
	got, err := pods.Get(ctx, "lbl", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels["app"] != "lbl" || got.Labels["tier"] != "web" || got.Labels[annotations.LabelUninitialized] != annotations.LabelUninitializedValue {
		t.Fatalf("labels %v", got.Labels)
	}
}

// Dry run: Normal WouldRepair Events and dry_run_pod_repairs_total counts, nothing else.
func TestIntegrationDryRunMutatesNothing(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, true)
	pods := replicaSet(t, c, ns, "audit", node, 2)
	r := startController(t, c, ns, func(m *repair.ManagerConfig) { m.DryRun = true })
	var after []*corev1.Pod
	for _, p := range pods {
		after = append(after, markBroken(t, c.Client, &p))
	}
	for _, p := range after {
		poll.Eventually(t, waitTimeout, "WouldRepair event", func() (bool, error) {
			evs := events(t, c.Client, ns, p.UID, repair.EventWouldRepair)
			return len(evs) == 1 && evs[0].Type == corev1.EventTypeNormal, nil
		})
	}
	for _, p := range after {
		got, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil || got.UID != p.UID || got.ResourceVersion != p.ResourceVersion || got.DeletionTimestamp != nil {
			t.Fatalf("dry run changed pod %s: %v", p.Name, err)
		}
		if len(events(t, c.Client, ns, p.UID, repair.EventBypassedCNI)) != 0 {
			t.Fatal("dry run reported a real action")
		}
	}
	repairsCounted(t, r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "true", 2)
	if n := repairedTotal(r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false"); n != 0 {
		t.Fatalf("real count = %v", n)
	}
}

// Gate closed: the node is not labelled ready, nothing happens; once the
// label appears the pod is repaired.
func TestIntegrationGateClosedThenOpen(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, false)
	pods := replicaSet(t, c, ns, "gated", node, 1)
	r := startController(t, c, ns, nil)
	p := markBroken(t, c.Client, &pods[0])
	poll.Eventually(t, waitTimeout, "gate_closed skip", func() (bool, error) {
		return testutil.ToFloat64(r.m.Metrics.Skipped.WithLabelValues(metrics.SkipGateClosed)) == 1, nil
	})
	time.Sleep(time.Second)
	if got, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), p.Name, metav1.GetOptions{}); err != nil || got.ResourceVersion != p.ResourceVersion {
		t.Fatalf("pod touched with the gate closed: %v", err)
	}
	if _, err := c.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"`+annotations.LabelCNIReady+`":"ready"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	replaced(t, c.Client, ns, "gated", p.UID, 1)
}

// Two replicas share the lease; only the leader acts. With the label action
// the broken pod stays, so a new leader sees it again: it must not act twice.
func TestIntegrationLeaderFailoverDoesNotDoubleAct(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, true)
	pods := replicaSet(t, c, ns, "ha", node, 2)
	label := func(id string) func(*repair.ManagerConfig) {
		return func(m *repair.ManagerConfig) { m.Action = judge.ActionLabel; m.Identity = id }
	}
	a := startController(t, c, ns, label("replica-a"))
	b := startController(t, c, ns, label("replica-b"))
	leader := func() *running {
		switch {
		case testutil.ToFloat64(a.m.Metrics.Leader) == 1:
			return a
		case testutil.ToFloat64(b.m.Metrics.Leader) == 1:
			return b
		}
		return nil
	}
	poll.Eventually(t, waitTimeout, "a leader", func() (bool, error) { return leader() != nil, nil })
	first := leader()
	other := a
	if first == a {
		other = b
	}
	if testutil.ToFloat64(other.m.Metrics.Leader) != 0 {
		t.Fatal("two leaders")
	}

	p0 := markBroken(t, c.Client, &pods[0])
	poll.Eventually(t, waitTimeout, "pod 0 labelled", func() (bool, error) {
		got, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), p0.Name, metav1.GetOptions{})
		return err == nil && got.Labels[annotations.LabelUninitialized] == "true", err
	})
	if n := repairedTotal(other.m, ns, "label", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false"); n != 0 {
		t.Fatal("the standby acted")
	}
	// Events are sent asynchronously: let the leader's reach the API before
	// it stops (the hand-over is under test, not delivery at shutdown).
	poll.Eventually(t, waitTimeout, "pod 0's BypassedCNI event", func() (bool, error) {
		return len(events(t, c.Client, ns, p0.UID, repair.EventBypassedCNI)) > 0, nil
	})

	// Graceful hand-over: the leader stops, the standby takes the lease.
	first.stop(t)
	poll.Eventually(t, waitTimeout, "the standby to lead", func() (bool, error) { return testutil.ToFloat64(other.m.Metrics.Leader) == 1, nil })
	p1 := markBroken(t, c.Client, &pods[1])
	poll.Eventually(t, waitTimeout, "pod 1 labelled by the new leader", func() (bool, error) {
		return repairedTotal(other.m, ns, "label", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false") == 1, nil
	})
	// Pod 0, still broken and seen by the new leader, was not acted on again.
	time.Sleep(2 * time.Second)
	for _, p := range []*corev1.Pod{p0, p1} {
		if n := eventCount(events(t, c.Client, ns, p.UID, repair.EventBypassedCNI)); n != 1 {
			t.Fatalf("pod %s: %d BypassedCNI events, want exactly 1", p.Name, n)
		}
	}
	total := repairedTotal(first.m, ns, "label", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false") +
		repairedTotal(other.m, ns, "label", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false")
	if total != 2 {
		t.Fatalf("actions across both replicas = %v, want 2", total)
	}
	if n := testutil.ToFloat64(other.m.Metrics.Skipped.WithLabelValues(metrics.SkipAlreadyActed)); n < 1 {
		t.Fatalf("the new leader did not recognise the labelled pod (already_acted = %v)", n)
	}
}

// Node readiness: the CNI pod on a tainted node becomes Ready -> the node is
// labelled and the startup taint removed; the pod is gone -> the label goes,
// the taint stays away.
func TestIntegrationNodeReadiness(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	other := corev1.Taint{Key: "example.com/dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule}
	node := createNode(t, c, false, corev1.Taint{Key: annotations.TaintCNINotReady, Effect: corev1.TaintEffectNoSchedule}, other)
	r := startController(t, c, ns, func(m *repair.ManagerConfig) { m.NodeReadiness = true })

	cni := cniPodOn(t, c, ns, node, false)
	time.Sleep(time.Second)
	n, _ := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if n.Labels[annotations.LabelCNIReady] == "ready" || len(n.Spec.Taints) != 2 {
		t.Fatalf("node marked ready before its CNI pod is Ready: %v %v", n.Labels, n.Spec.Taints)
	}
	markRunningReadyCNI(t, c.Client, cni)
	poll.Eventually(t, waitTimeout, "node labelled and untainted", func() (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		return err == nil && n.Labels[annotations.LabelCNIReady] == "ready" && len(n.Spec.Taints) == 1 && n.Spec.Taints[0].Key == other.Key, err
	})
	poll.Eventually(t, waitTimeout, "CNIReady node event", func() (bool, error) {
		l, err := c.Client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node + ",reason=" + nodeready.EventCNIReady})
		return err == nil && len(l.Items) == 1, err
	})
	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), cni.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, waitTimeout, "label removed", func() (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		_, has := n.Labels[annotations.LabelCNIReady]
		return err == nil && !has, err
	})
	n, _ = c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if len(n.Spec.Taints) != 1 {
		t.Fatalf("taints after the CNI pod left: %v (the startup taint must not come back by default)", n.Spec.Taints)
	}
	if v := testutil.ToFloat64(r.m.Metrics.NodeReadinessChanges.WithLabelValues(metrics.ChangeTaintRemoved, metrics.ResultSuccess)); v != 1 {
		t.Fatalf("taint_removed = %v", v)
	}
	if v := testutil.ToFloat64(r.m.Metrics.NodeReadinessChanges.WithLabelValues(metrics.ChangeLabelRemoved, metrics.ResultSuccess)); v != 1 {
		t.Fatalf("label_removed = %v", v)
	}
}

func markRunningReadyCNI(t *testing.T, client kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	now := metav1.Now()
	p := pod.DeepCopy()
	p.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: "198.18.0.2", StartTime: &now,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "installer", Image: p.Spec.Containers[0].Image, Ready: true,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
	}
	if _, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

var _ = apierrors.IsNotFound
