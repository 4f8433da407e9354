//go:build integration

package verify

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
)

// injectedDaemonSet runs an injected pod on the node from a DaemonSet that
// tolerates every taint (as node agents do), so no startup taint keeps it
// off a fresh node.
func (n *node) injectedDaemonSet(t *testing.T, ns, name string) {
	t.Helper()
	labels := map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected, "app": name}
	_, err := n.c.Client.AppsV1().DaemonSets(ns).Create(context.Background(), &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected,
					annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
					annotations.KeyRedirectTrafficConfig:  redirectConfig, annotations.KeyDualStack: "false"}},
				Spec: corev1.PodSpec{NodeSelector: map[string]string{"kubernetes.io/hostname": n.Name}, TerminationGracePeriodSeconds: ptr.To(int64(1)),
					Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{Name: "consul-dataplane", Image: n.img.Ref, ImagePullPolicy: corev1.PullNever,
						Args:            []string{"proxy", "--outbound=15001", "--inbound=20000"},
						SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(annotations.ProxyUID))}}}},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// TestDaemonSetPodOnAFreshNodeIsFoundAndReplaced: an injected DaemonSet pod
// that tolerates every taint lands on a fresh node before consul-cni is
// chained there. The verifier finds it without rules at once; the
// controller waits while the node's CNI is not ready (gate), and once the
// chain is in and the node ready it evicts the pod as
// verified_unredirected; the DaemonSet's new pod is verified with its
// rules.
func TestDaemonSetPodOnAFreshNodeIsFoundAndReplaced(t *testing.T) {
	n := startNode(t)
	ns := n.c.Namespace(t)
	n.injectedDaemonSet(t, ns, "agent")
	pod := n.runningPod(t, ns, "agent", "")
	n.startVerifier(t)
	n.startController(t)
	got := n.waitCondition(t, ns, pod.Name, corev1.ConditionFalse, annotations.ReasonRulesMissing, time.Minute)
	t.Logf("before the chain: %s %s", got.Reason, got.Message)
	time.Sleep(3 * time.Second) // the controller sees it, and the gate holds it
	if p, err := n.c.Client.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("acted on before the node's CNI was ready: %v", err)
	}

	n.chain(t)
	n.markReady(t)
	ready := time.Now()
	poll.Eventually(t, time.Minute, "pod "+pod.Name+" evicted", func() (bool, error) {
		p, err := n.c.Client.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
		return err != nil || p.UID != pod.UID || p.DeletionTimestamp != nil, nil
	})
	acted := time.Since(ready)
	next := n.runningPod(t, ns, "agent", pod.UID)
	n.waitCondition(t, ns, next.Name, corev1.ConditionTrue, annotations.ReasonRulesInPlace, time.Minute)
	verified := time.Since(ready)
	n.waitVerifierEvent(t, ns, pod.UID)
	t.Logf("DaemonSet pod outside the mesh on a fresh node: evicted %s after the node was chained and marked ready, its replacement verified with its rules after %s",
		acted.Round(10*time.Millisecond), verified.Round(10*time.Millisecond))
}
