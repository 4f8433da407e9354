//go:build integration

package repair_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// setCNIReady plays kubelet turning a running CNI pod's readiness to ready
// (its Ready condition only: the container keeps running since its start,
// a readiness flap, not a restart).
func setCNIReady(t *testing.T, client kubernetes.Interface, pod *corev1.Pod, ready bool) {
	t.Helper()
	p, err := client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st, LastTransitionTime: metav1.Now()}}
	if _, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// nodeReadiness returns whether node is labelled ready and its cni-ready-since.
func nodeReadiness(t *testing.T, c *cluster.Cluster, node string) (bool, string) {
	t.Helper()
	n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels[annotations.LabelCNIReady] == annotations.LabelCNIReadyValue, n.Annotations[annotations.AnnotationCNIReadySince]
}

// flapInstaller makes the node's installer not Ready for about 2 s, waiting
// until node readiness removed the label and put it back.
func flapInstaller(t *testing.T, c *cluster.Cluster, cni *corev1.Pod, node string) {
	t.Helper()
	setCNIReady(t, c.Client, cni, false)
	poll.Eventually(t, waitTimeout, "label removed in the flap", func() (bool, error) {
		labelled, _ := nodeReadiness(t, c, node)
		return !labelled, nil
	})
	time.Sleep(2 * time.Second)
	setCNIReady(t, c.Client, cni, true)
	poll.Eventually(t, waitTimeout, "label back after the flap", func() (bool, error) {
		labelled, _ := nodeReadiness(t, c, node)
		return labelled, nil
	})
}

// Proof (d): on a misconfigured node (every pod's init check fails, also the
// replacements') whose installer readiness flaps (not Ready for 2 s, again
// and again), the pods of the race are repaired once, the breaker then
// opens, and the node has had at most the documented number of actions: its
// first readiness's plus --breaker-min-pods. The flaps, shorter than
// judge.FlapBound, never move the node's cni-ready-since.
func TestIntegrationFlappingInstallerOpensTheBreaker(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, false)
	const replicas, minPods = 3, 3
	marked := map[types.UID]bool{}
	// The race: sandboxes made before the CNI is ready.
	for _, p := range replicaSet(t, c, ns, "flapping", node, replicas) {
		markBroken(t, c.Client, &p)
		marked[p.UID] = true
	}
	time.Sleep(1100 * time.Millisecond) // readiness is dated to the second, after them
	cni := cniPodOn(t, c, ns, node, true)
	const slack = time.Second
	r := startController(t, c, ns, func(m *repair.ManagerConfig) {
		m.NodeReadiness, m.SandboxSlack, m.BreakerMinPods = true, slack, minPods
	})
	var since string
	poll.Eventually(t, waitTimeout, "node labelled ready with its cni-ready-since", func() (bool, error) {
		var labelled bool
		labelled, since = nodeReadiness(t, c, node)
		return labelled && since != "", nil
	})
	actions := func() float64 {
		return repairedTotal(r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false")
	}
	poll.Eventually(t, waitTimeout, "the race's pods repaired", func() (bool, error) { return actions() == replicas, nil })
	first := actions()
	time.Sleep(slack) // the replacements' sandboxes are dated a slack after readiness
	open := func() bool { return len(nodeEvents(t, c.Client, node, repair.EventRepairCircuitOpen)) > 0 }
	for flap := 1; flap <= 6 && !open(); flap++ {
		flapInstaller(t, c, cni, node)
		// The misconfigured node breaks every replacement too (once the
		// ReplicaSet has made them all).
		poll.Eventually(t, waitTimeout, "replacements made", func() (bool, error) {
			live := 0
			for _, p := range podsOf(t, c.Client, ns, "flapping") {
				if p.DeletionTimestamp == nil {
					live++
				}
			}
			return live == replicas, nil
		})
		for _, p := range podsOf(t, c.Client, ns, "flapping") {
			if !marked[p.UID] && p.DeletionTimestamp == nil {
				markBroken(t, c.Client, &p)
				marked[p.UID] = true
			}
		}
		poll.Eventually(t, waitTimeout, "breaker open or every broken pod acted on", func() (bool, error) {
			if open() {
				return true, nil
			}
			for _, p := range podsOf(t, c.Client, ns, "flapping") {
				if marked[p.UID] && p.DeletionTimestamp == nil {
					return false, nil
				}
			}
			return true, nil
		})
		t.Logf("flap %d: %v actions, breaker open %v", flap, actions(), open())
		if _, s := nodeReadiness(t, c, node); s != since {
			t.Fatalf("flap %d moved cni-ready-since from %s to %s", flap, since, s)
		}
	}
	if !open() {
		t.Fatalf("breaker not open after 6 flaps: %v actions", actions())
	}
	// Open, it stays so through another flap.
	flapInstaller(t, c, cni, node)
	time.Sleep(3 * time.Second)
	n := actions()
	t.Logf("actions: %v under the first readiness, %v in all; cni-ready-since %s kept", first, n, since)
	if n > first+minPods {
		t.Fatalf("%v actions on the flapping node, want at most %v (the first readiness's %v plus --breaker-min-pods %d)", n, first+minPods, first, minPods)
	}
	if got := testutil.ToFloat64(r.m.Metrics.BreakerOpenNodes); got != 1 {
		t.Fatalf("open nodes gauge = %v, want 1", got)
	}
}
