package repair

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge/judgetest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
)

// defaultLimits restores the documented rate limits the harness raises.
func defaultLimits(c *Config) {
	c.MaxRepairsPerMinute = defaultMaxRepairsPerMinute
	c.MaxRepairsPerNodePerMinute = defaultMaxRepairsPerNodePerMinute
}

// nodeReadySinceAt is a node labelled ready whose cni-ready-since is T0+d.
func nodeReadySinceAt(name string, d time.Duration) *corev1.Node {
	n := readyNode(name)
	n.Annotations = map[string]string{annotations.AnnotationCNIReadySince: annotations.FormatTime(judgetest.T0.Add(d))}
	return n
}

// brokenWithSandbox is a pod whose sandbox was ready at T0+d and whose
// consul-cni check failed right after (signal B).
func brokenWithSandbox(d time.Duration, opts ...judgetest.PodOpt) *corev1.Pod {
	base := []judgetest.PodOpt{judgetest.SandboxAt(d), judgetest.InitStatus(corev1.ContainerStatus{
		Name: annotations.InitContainerName, State: corev1.ContainerState{Terminated: judgetest.Terminated(88, d, d+time.Second)},
	})}
	return judgetest.Pod(append(base, opts...)...)
}

// Pods whose sandbox predates their node's dated CNI readiness are acted on
// at once, bounded only by the cluster-wide cap, not by the node's pace.
func TestRacePodsAreActedOnAtOnce(t *testing.T) {
	h := newHarness(t, defaultLimits)
	h.addNode(nodeReadySinceAt("n1", -10*time.Second))
	const n = 10 // the per-node bucket alone would allow 1 now
	for i := 0; i < n; i++ {
		if err := h.sync(h.addPod(brokenWithSandbox(-time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(h.mutations()); got != n {
		t.Fatalf("%d race pods on one node: %d acted on at once, want all", n, got)
	}
	if got := skipped(h.metrics, metrics.SkipRateLimited); got != 0 {
		t.Fatalf("rate_limited = %v, want 0", got)
	}
}

// Pods whose sandbox is dated less than the sandbox slack after their
// node's readiness may or may not be the race (the kubelet dates a sandbox
// late): they neither take the race lane nor count for the breaker, so they
// keep the per-node pace and the breaker stays closed.
func TestPodsDatedJustAfterReadinessKeepTheNodePace(t *testing.T) {
	h := newHarness(t, defaultLimits)
	h.addNode(nodeReadySinceAt("n1", -time.Minute))
	const n = 10
	for i := 0; i < n; i++ {
		if err := h.sync(h.addPod(brokenWithSandbox(-time.Minute + 2*time.Second))); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(h.mutations()); got != 1 {
		t.Fatalf("%d pods dated just after readiness: %d acted on at once, want 1 (the node's burst)", n, got)
	}
	if got := skipped(h.metrics, metrics.SkipRateLimited); got != n-1 {
		t.Fatalf("rate_limited = %v, want %d", got, n-1)
	}
	if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 0 {
		t.Fatalf("breaker opened on pods that may be the race: gauge = %v", got)
	}
}

// The cluster-wide cap binds the race lane too: at most N actions in any
// minute, all lanes together (a namespace per node: one namespace alone
// leaves a tenth of the cap to others, TestOneNamespaceLeavesRoomForAnother).
func TestRaceLaneKeepsTheGlobalCap(t *testing.T) {
	h := newHarness(t, defaultLimits)
	var keys []string
	for _, node := range []string{"n1", "n2", "n3", "n4"} {
		h.addNode(nodeReadySinceAt(node, -10*time.Second))
		for i := 0; i < 10; i++ {
			keys = append(keys, h.addPod(brokenWithSandbox(-time.Minute, judgetest.OnNode(node), judgetest.InNamespace("ns-"+node))))
		}
	}
	for _, k := range keys {
		if err := h.sync(k); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(h.mutations()); got != defaultMaxRepairsPerMinute {
		t.Fatalf("40 race pods: %d actions in the first minute, want the cap %d", got, defaultMaxRepairsPerMinute)
	}
	h.now = h.now.Add(time.Minute)
	for _, k := range keys {
		if err := h.sync(k); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(h.mutations()); got != len(keys) {
		t.Fatalf("after a minute: %d actions, want %d", got, len(keys))
	}
}

// Without a dated readiness (a label set by someone else: the gate's
// "since" is when this process saw it) no pod is of the race: the per-node
// pace applies.
func TestUndatedReadinessKeepsTheNodePace(t *testing.T) {
	h := newHarness(t, defaultLimits)
	h.addNode(readyNode("n1"))
	for i := 0; i < 3; i++ {
		if err := h.sync(h.addPod(brokenWithSandbox(-time.Hour))); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(h.mutations()); got != 1 {
		t.Fatalf("undated readiness: %d actions, want the per-node burst 1", got)
	}
}

// A burst of new pods that break on a node whose CNI was ready before their
// sandboxes points to a misconfiguration: they keep the per-node pace, so
// the breaker sees them break and opens after one action, as it always did.
// Acted-on pods leave the cache as an eviction would; the rest are synced
// again every second as the queue's retries would.
func TestBurstAfterReadinessStillOpensTheBreaker(t *testing.T) {
	h := newHarness(t, defaultLimits)
	h.addNode(nodeReadySinceAt("n1", -10*time.Minute))
	var live []*corev1.Pod
	for i := 0; i < 10 && testutil.ToFloat64(h.metrics.BreakerOpenNodes) == 0; i++ {
		live = append(live, brokenWithSandbox(time.Duration(i)*time.Second-5*time.Second))
		h.addPod(live[len(live)-1])
		live = h.syncAllRemovingActed(live)
		h.now = h.now.Add(time.Second)
	}
	if got := testutil.ToFloat64(h.metrics.BreakerOpenNodes); got != 1 {
		t.Fatalf("breaker did not open: gauge = %v, %d actions", got, len(h.mutations()))
	}
	if got := len(h.mutations()); got != 1 {
		t.Fatalf("%d actions before the breaker opened, want 1", got)
	}
}

// syncAllRemovingActed syncs pods and drops from the cache those acted on;
// it returns the others.
func (h *harness) syncAllRemovingActed(pods []*corev1.Pod) []*corev1.Pod {
	h.t.Helper()
	var kept []*corev1.Pod
	for _, p := range pods {
		before := len(h.mutations())
		if err := h.sync(p.Namespace + "/" + p.Name); err != nil {
			h.t.Fatal(err)
		}
		if len(h.mutations()) == before {
			kept = append(kept, p)
			continue
		}
		if err := h.inf.Pods.GetIndexer().Delete(p); err != nil {
			h.t.Fatal(err)
		}
		h.c.podDeleted(p)
	}
	return kept
}
