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

// flapGate is how a flapping test reads the gate: node-label with node
// readiness, which records the node's baseline on the Node, or cni-pod,
// which keeps it in the controller's memory.
type flapGate struct {
	name   string
	mutate func(*repair.ManagerConfig)
	// ready waits until the gate is open for the node and returns its
	// recorded baseline ("" when nothing records it).
	ready func(t *testing.T, c *cluster.Cluster, node string) string
	flap  func(t *testing.T, c *cluster.Cluster, cni *corev1.Pod, node string)
}

var flapGates = []flapGate{
	{name: "node-label",
		mutate: func(m *repair.ManagerConfig) { m.NodeReadiness = true },
		ready: func(t *testing.T, c *cluster.Cluster, node string) string {
			var since string
			poll.Eventually(t, waitTimeout, "node labelled ready with its cni-ready-since", func() (bool, error) {
				var labelled bool
				labelled, since = nodeReadiness(t, c, node)
				return labelled && since != "", nil
			})
			return since
		},
		flap: flapInstaller},
	{name: "cni-pod",
		mutate: func(m *repair.ManagerConfig) { m.Gate = judge.GateCNIPod },
		ready:  func(*testing.T, *cluster.Cluster, string) string { return "" },
		flap: func(t *testing.T, c *cluster.Cluster, cni *corev1.Pod, _ string) {
			setCNIReady(t, c.Client, cni, false)
			time.Sleep(2 * time.Second)
			setCNIReady(t, c.Client, cni, true)
		}},
}

// Proof (d): on a misconfigured node (every pod's init check fails, also the
// replacements') whose installer readiness flaps (not Ready for 2 s, again
// and again), the pods of the race are repaired once, the breaker then
// opens, and the node has had at most the documented number of actions: its
// first readiness's plus --breaker-min-pods. The flaps, shorter than
// judge.FlapBound, never move the node's baseline: under the node-label
// gate its cni-ready-since, under the cni-pod gate the one the controller
// keeps in memory.
func TestIntegrationFlappingInstallerOpensTheBreaker(t *testing.T) {
	for _, g := range flapGates {
		t.Run(g.name, func(t *testing.T) { testFlappingInstaller(t, g) })
	}
}

func testFlappingInstaller(t *testing.T, g flapGate) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, false)
	const replicas, minPods = 3, 2
	f := &flapping{t: t, c: c, ns: ns, app: "flapping", replicas: replicas, marked: map[types.UID]bool{}}
	// The race: sandboxes made before the CNI is ready.
	for _, p := range replicaSet(t, c, ns, f.app, node, replicas) {
		markBroken(t, c.Client, &p)
		f.marked[p.UID] = true
	}
	time.Sleep(1100 * time.Millisecond) // readiness is dated to the second, after them
	cni := cniPodOn(t, c, ns, node, true)
	const slack = time.Second
	r := startController(t, c, ns, func(m *repair.ManagerConfig) {
		m.SandboxSlack, m.BreakerMinPods = slack, minPods
		g.mutate(m)
	})
	since := g.ready(t, c, node)
	f.actions = func() float64 {
		return repairedTotal(r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false")
	}
	poll.Eventually(t, waitTimeout, "the race's pods repaired", func() (bool, error) { return f.actions() == replicas, nil })
	first := f.actions()
	time.Sleep(slack) // the replacements' sandboxes are dated a slack after readiness
	open := func() bool { return len(nodeEvents(t, c.Client, node, repair.EventRepairCircuitOpen)) > 0 }
	for flap := 1; flap <= 6 && !open(); flap++ {
		g.flap(t, c, cni, node)
		f.breakReplacements(open)
		t.Logf("flap %d: %v actions, breaker open %v", flap, f.actions(), open())
		if _, s := nodeReadiness(t, c, node); s != since {
			t.Fatalf("flap %d moved cni-ready-since from %q to %q", flap, since, s)
		}
	}
	if !open() {
		t.Fatalf("breaker not open after 6 flaps: %v actions", f.actions())
	}
	// Open, it stays so through another flap.
	g.flap(t, c, cni, node)
	time.Sleep(3 * time.Second)
	n := f.actions()
	t.Logf("actions: %v under the first readiness, %v in all; cni-ready-since %q kept", first, n, since)
	if n > first+minPods {
		t.Fatalf("%v actions on the flapping node, want at most %v (the first readiness's %v plus --breaker-min-pods %d)", n, first+minPods, first, minPods)
	}
	// With the baseline kept, the breaker counts the replacements as they
	// break and opens on the --breaker-min-pods-th: one action fewer than
	// the bound above, which the memory of actions alone would give.
	if n > first+minPods-1 {
		t.Fatalf("%v actions: the flaps' replacements were taken as of the race, not counted by the breaker (the baseline moved)", n)
	}
	if got := testutil.ToFloat64(r.m.Metrics.BreakerOpenNodes); got != 1 {
		t.Fatalf("open nodes gauge = %v, want 1", got)
	}
}

// flapping is a ReplicaSet on a misconfigured node: every pod it makes is
// broken, and marked holds the pods marked so.
type flapping struct {
	t        *testing.T
	c        *cluster.Cluster
	ns, app  string
	replicas int
	marked   map[types.UID]bool
	actions  func() float64
}

// breakReplacements waits for the ReplicaSet's replacements, breaks them
// (the misconfigured node breaks every pod) and waits until the breaker is
// open or every broken pod was acted on.
func (f *flapping) breakReplacements(open func() bool) {
	t, c := f.t, f.c
	t.Helper()
	poll.Eventually(t, waitTimeout, "replacements made", func() (bool, error) {
		live := 0
		for _, p := range podsOf(t, c.Client, f.ns, f.app) {
			if p.DeletionTimestamp == nil {
				live++
			}
		}
		return live == f.replicas, nil
	})
	for _, p := range podsOf(t, c.Client, f.ns, f.app) {
		if !f.marked[p.UID] && p.DeletionTimestamp == nil {
			markBroken(t, c.Client, &p)
			f.marked[p.UID] = true
		}
	}
	poll.Eventually(t, waitTimeout, "breaker open or every broken pod acted on", func() (bool, error) {
		if open() {
			return true, nil
		}
		for _, p := range podsOf(t, c.Client, f.ns, f.app) {
			if f.marked[p.UID] && p.DeletionTimestamp == nil {
				return false, nil
			}
		}
		return true, nil
	})
}
