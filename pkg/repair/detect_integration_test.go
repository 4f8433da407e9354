//go:build integration

package repair_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/nodeready"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// cniPodOn creates a CNI DaemonSet-like pod on node in ns and, when ready,
// plays kubelet reporting it Ready.
func cniPodOn(t *testing.T, c *cluster.Cluster, ns, node string, ready bool) *corev1.Pod {
	t.Helper()
	zero := int64(0)
	p, err := c.Client.CoreV1().Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "consul-cni-", Labels: map[string]string{"app.kubernetes.io/name": "consul-cni"}},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: &zero,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:  []corev1.Container{{Name: "installer", Image: "registry.invalid/consul-cni:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ready {
		markRunningReadyCNI(t, c.Client, p)
	}
	return p
}

func nodeEvents(t *testing.T, client kubernetes.Interface, node, reason string) []corev1.Event {
	t.Helper()
	l, err := client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node + ",reason=" + reason})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// With --dry-run, node readiness changes no node, although the controller's
// identity may patch nodes: it sends no write request for nodes at all (its
// API transport is watched), a node it would mark ready (tainted, its CNI
// pod Ready) and one it would mark not ready (labelled, no CNI pod) keep
// their labels and taints and get no ready-since annotation, and each gets
// one Normal Event saying what would change.
func TestIntegrationDryRunNodeReadinessMutatesNothing(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	wouldReady := createNode(t, c, false, corev1.Taint{Key: annotations.TaintCNINotReady, Effect: corev1.TaintEffectNoSchedule})
	wouldNotReady := createNode(t, c, true)
	cniPodOn(t, c, ns, wouldReady, true)
	before := map[string]*corev1.Node{}
	for _, name := range []string{wouldReady, wouldNotReady} {
		n, err := c.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before[name] = n
	}
	writes := &requestLog{}
	startControllerWrapped(t, c, ns, func(m *repair.ManagerConfig) {
		m.DryRun, m.NodeReadiness, m.ReaddStartupTaint = true, true, true
	}, writes.wrap)
	for node, reason := range map[string]string{wouldReady: nodeready.EventWouldMarkCNIReady, wouldNotReady: nodeready.EventWouldMarkCNINotReady} {
		poll.Eventually(t, waitTimeout, reason+" event on "+node, func() (bool, error) {
			evs := nodeEvents(t, c.Client, node, reason)
			return len(evs) == 1 && evs[0].Type == corev1.EventTypeNormal, nil
		})
	}
	// The Events are written after the decision; a patch would have come
	// before them.
	if w, all := writes.nodeWrites(); len(w) != 0 || all == 0 {
		t.Fatalf("dry run wrote nodes: %v (node requests seen: %d)", w, all)
	}
	for name, b := range before {
		n, err := c.Client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// kube-controller-manager and admission change new nodes'
		// taints and annotations too: compare what readiness would touch.
		_, since := n.Annotations[annotations.AnnotationCNIReadySince]
		if n.Labels[annotations.LabelCNIReady] != b.Labels[annotations.LabelCNIReady] ||
			hasTaint(n, annotations.TaintCNINotReady) != hasTaint(b, annotations.TaintCNINotReady) || since {
			t.Fatalf("dry run changed node %s: labels %v taints %v annotations %v (before: %v %v)", name, n.Labels, n.Spec.Taints, n.Annotations, b.Labels, b.Spec.Taints)
		}
		for _, reason := range []string{nodeready.EventCNIReady, nodeready.EventCNINotReady} {
			if len(nodeEvents(t, c.Client, name, reason)) != 0 {
				t.Fatalf("node %s: a %s event in a dry run", name, reason)
			}
		}
	}
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// requestLog records the method and path of every request through it.
type requestLog struct {
	mu   sync.Mutex
	reqs []string
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		l.mu.Lock()
		l.reqs = append(l.reqs, req.Method+" "+req.URL.Path)
		l.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

// nodeWrites lists the requests that would change a Node, and counts all
// the requests about nodes (the log does see the controller's traffic).
func (l *requestLog) nodeWrites() (writes []string, all int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.reqs {
		method, path, _ := strings.Cut(r, " ")
		if !strings.HasPrefix(path, "/api/v1/nodes") {
			continue
		}
		all++
		if method != http.MethodGet {
			writes = append(writes, r)
		}
	}
	return writes, all
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// The breaker's baseline is the node's cni-ready-since annotation, written
// with the readiness label: the leader that wrote it stops (releasing the
// Lease), pods break on the node, and the next leader (another identity, a
// fresh process state: a restart or a failover) still counts those pods and
// keeps the breaker open, instead of taking its own start as the baseline
// and evicting them.
func TestIntegrationBreakerBaselineSurvivesRestart(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, false)
	cniPodOn(t, c, ns, node, true)
	first := startController(t, c, ns, func(m *repair.ManagerConfig) { m.NodeReadiness = true; m.Identity = "first" })
	var since string
	poll.Eventually(t, waitTimeout, "node labelled ready with its ready-since annotation", func() (bool, error) {
		n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		since = n.Annotations[annotations.AnnotationCNIReadySince]
		return err == nil && n.Labels[annotations.LabelCNIReady] == annotations.LabelCNIReadyValue && since != "", err
	})
	sinceT, err := annotations.ParseTime(annotations.AnnotationCNIReadySince, since)
	if err != nil {
		t.Fatal(err)
	}
	first.stop(t)

	// Pods created and broken after the CNI became ready, dated more than
	// the sandbox slack after it: a misconfigured node, not the race.
	const slack = time.Second
	time.Sleep(time.Until(sinceT.Add(slack)))
	pods := replicaSet(t, c, ns, "misconfigured", node, 3)
	var broken []*corev1.Pod
	for i := range pods {
		broken = append(broken, markBroken(t, c.Client, &pods[i]))
	}
	second := startController(t, c, ns, func(m *repair.ManagerConfig) {
		m.NodeReadiness = true
		m.Identity = "second"
		m.BreakerMinPods = 3
		m.SandboxSlack = slack
	})
	poll.Eventually(t, waitTimeout, "breaker open after the restart", func() (bool, error) {
		return len(nodeEvents(t, c.Client, node, repair.EventRepairCircuitOpen)) == 1, nil
	})
	if got := testutil.ToFloat64(second.m.Metrics.BreakerOpenNodes); got != 1 {
		t.Fatalf("open nodes gauge = %v", got)
	}
	for _, p := range broken {
		got, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil || got.UID != p.UID || got.DeletionTimestamp != nil {
			t.Fatalf("pod %s acted on although the breaker is open: %v", p.Name, err)
		}
	}
	n, err := c.Client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil || n.Annotations[annotations.AnnotationCNIReadySince] != since {
		t.Fatalf("baseline rewritten by the restarted controller: %v -> %v (%v)", since, n.Annotations[annotations.AnnotationCNIReadySince], err)
	}
}

// Signal C against the real API: a complete pod whose sandbox became ready
// long after cni-applied-at is evicted with reason sandbox_recreated and
// its owner replaces it.
func TestIntegrationSandboxRecreatedEvicted(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, true)
	pods := replicaSet(t, c, ns, "rebooted", node, 1)
	r := startController(t, c, ns, nil)
	applied := time.Now().Add(-time.Hour)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, annotations.KeyTransparentProxyStatus, annotations.TProxyStatusComplete,
		annotations.KeyCNIAppliedAt, annotations.FormatTime(applied))
	p, err := c.Client.CoreV1().Pods(ns).Patch(context.Background(), pods[0].Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p = markRecreated(t, c.Client, p)
	replaced(t, c.Client, ns, "rebooted", p.UID, 1)
	repairsCounted(t, r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonSandboxRecreated, "false", 1)
}

// writeStatusAsConsulK8s writes the status annotation the way consul-k8s's
// plugin does in each ADD: GET, then a full Update, with its own field
// manager (client-go names it after the program: consul-cni).
func writeStatusAsConsulK8s(t *testing.T, client kubernetes.Interface, ns, name, status string) *corev1.Pod {
	t.Helper()
	p, err := client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Annotations[annotations.KeyTransparentProxyStatus] = status
	out, err := client.CoreV1().Pods(ns).Update(context.Background(), p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update %s to %s: %v", name, status, err)
	}
	return out
}

// Signal C without cni-applied-at, against the API server's own
// managedFields: consul-k8s's plugin's writes (waiting, then complete) give
// the status annotation to its manager at the time of the write; a write
// that changes nothing leaves that time; a sandbox that became ready more
// than the slack after it is replaced, one ready right after it is not.
func TestIntegrationSandboxRecreatedWithoutAppliedAt(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	node := createNode(t, c, true)
	pods := replicaSet(t, c, ns, "consulk8s", node, 2)
	cfg := rest.CopyConfig(c.Config)
	cfg.UserAgent = "consul-cni/v2.1.0-dev"
	plugin := kubernetes.NewForConfigOrDie(cfg)
	const slack = time.Second

	old, fresh := pods[0].Name, pods[1].Name
	for _, name := range []string{old, fresh} {
		if at, m, ok := judge.StatusWrittenAt(writeStatusAsConsulK8s(t, plugin, ns, name, annotations.TProxyStatusWaiting)); !ok || m != "consul-cni" || time.Since(at) > time.Minute {
			t.Fatalf("%s: waiting written by %q at %s (%v)", name, m, at, ok)
		}
	}
	first := writeStatusAsConsulK8s(t, plugin, ns, old, annotations.TProxyStatusComplete)
	written, _, _ := judge.StatusWrittenAt(first)
	time.Sleep(2 * slack)
	// The same value again (a lost waiting write before it): nothing
	// changes, and neither does the time.
	if at, m, ok := judge.StatusWrittenAt(writeStatusAsConsulK8s(t, plugin, ns, old, annotations.TProxyStatusComplete)); !ok || m != "consul-cni" || !at.Equal(written) {
		t.Fatalf("no-op write moved the time: %s -> %s by %q", written, at, m)
	}
	time.Sleep(slack)
	p := markRecreated(t, c.Client, first)
	f := markRunningReady(t, c.Client, writeStatusAsConsulK8s(t, plugin, ns, fresh, annotations.TProxyStatusComplete))

	r := startController(t, c, ns, func(m *repair.ManagerConfig) { m.SandboxSlack = slack })
	replaced(t, c.Client, ns, "consulk8s", p.UID, 2)
	repairsCounted(t, r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonSandboxRecreated, "false", 1)
	got, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), fresh, metav1.GetOptions{})
	if err != nil || got.UID != f.UID || got.DeletionTimestamp != nil {
		t.Fatalf("pod %s, its sandbox ready right after the status was written, was acted on: %v", fresh, err)
	}
}

// markRecreated marks a pod running in a sandbox that replaced an earlier
// one, as the kubelet reports it: the sandbox ready now, the app container
// restarted, its previous run (in the earlier sandbox) ended a minute ago.
func markRecreated(t testing.TB, client kubernetes.Interface, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	p := markRunningReady(t, client, pod)
	app := &p.Status.ContainerStatuses[0]
	app.RestartCount = 1
	app.LastTerminationState = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: 255, Reason: "Unknown", StartedAt: metav1.NewTime(time.Now().Add(-time.Hour)), FinishedAt: metav1.NewTime(time.Now().Add(-time.Minute)),
	}}
	out, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("mark %s recreated: %v", p.Name, err)
	}
	return out
}
