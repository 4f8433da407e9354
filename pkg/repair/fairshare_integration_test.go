//go:build integration

package repair_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/metrics"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// floodPods is how many pods of one namespace are made to look broken.
const floodPods = 200

// 200 pods of one namespace made to look broken (signal B, sandboxes older
// than the node's dated CNI readiness: the race lane, bound only by the
// cluster-wide cap) hold the cap, then a race pod of another namespace
// breaks: it is acted on within 10 s, not after the cap's minute. The pods
// need no node: a real API server and kube-controller-manager, the test
// playing the kubelet's part.
func TestIntegrationFloodedNamespaceDoesNotDelayAnother(t *testing.T) {
	c := cluster.Shared(t)
	ns, other := c.Namespace(t), c.Namespace(t)
	node := createNode(t, c, true)
	flood := replicaSet(t, c, ns, "flood", node, floodPods)
	sandbox := metav1.Now()
	for i := range flood {
		markBrokenSince(t, c.Client, &flood[i], sandbox)
	}
	victim := otherNamespacePod(t, c, ns, other, node)
	time.Sleep(1500 * time.Millisecond) // the node's readiness a second after the sandboxes
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, annotations.AnnotationCNIReadySince, annotations.FormatTime(time.Now()))
	if _, err := c.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r := startController(t, c, ns, nil)
	poll.Eventually(t, waitTimeout, "the flood holds the cap", func() (bool, error) {
		return repairedTotal(r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false") >= 27, nil
	})
	time.Sleep(time.Second) // every worker has met the cap
	floodActs := repairedTotal(r.m, ns, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false")
	broke := time.Now()
	markBrokenSince(t, c.Client, victim, sandbox)
	poll.Eventually(t, waitTimeout, "the other namespace's race pod acted on", func() (bool, error) {
		return repairedTotal(r.m, other, "evict", metrics.ResultSuccess, judge.ReasonInitCheckFailed, "false") == 1, nil
	})
	delay := time.Since(broke)
	t.Logf("flood: %v of %d pods acted on in the cap's minute before; the other namespace's race pod acted on %.1f s after it broke",
		floodActs, floodPods, delay.Seconds())
	if delay >= 10*time.Second {
		t.Fatalf("the race pod of namespace %s waited %s behind %d broken pods of %s, want < 10 s", other, delay, floodPods, ns)
	}
}

// otherNamespacePod creates a ReplicaSet of one injected pod in other, labelled
// for the controller of watched's test, and returns its pod.
func otherNamespacePod(t *testing.T, c *cluster.Cluster, watched, other, node string) *corev1.Pod {
	t.Helper()
	one := int32(1)
	tmpl := injectedPodTemplate(watched, "victim", node)
	_, err := c.Client.AppsV1().ReplicaSets(other).Create(context.Background(), &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "victim"},
		Spec:       appsv1.ReplicaSetSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "victim"}}, Template: tmpl},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	poll.Eventually(t, waitTimeout, "the other namespace's pod", func() (bool, error) {
		pods = podsOf(t, c.Client, other, "victim")
		return len(pods) == 1, nil
	})
	return &pods[0]
}
