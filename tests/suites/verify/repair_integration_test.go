//go:build integration

package verify

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/scenario"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// markReady does what node readiness does once the installer is Ready: the
// ready label and its date.
func (n *node) markReady(t *testing.T) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q},"annotations":{%q:%q}}}`, annotations.LabelCNIReady, annotations.LabelCNIReadyValue,
		annotations.AnnotationCNIReadySince, annotations.FormatTime(time.Now()))
	if _, err := n.c.Client.CoreV1().Nodes().Patch(context.Background(), n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// injectedReplicaSet runs one injected pod (as injectedPod) owned by a
// ReplicaSet, so that a repair has an owner to recreate it.
func (n *node) injectedReplicaSet(t *testing.T, ns, name string) {
	t.Helper()
	labels := map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected, "app": name}
	_, err := n.c.Client.AppsV1().ReplicaSets(ns).Create(context.Background(), &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected,
					annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
					annotations.KeyRedirectTrafficConfig:  redirectConfig, annotations.KeyDualStack: "false"}},
				Spec: corev1.PodSpec{NodeName: n.Name, TerminationGracePeriodSeconds: ptr.To(int64(1)),
					Containers: []corev1.Container{{Name: "consul-dataplane", Image: n.img.Ref, ImagePullPolicy: corev1.PullNever,
						Args:            []string{"proxy", "--outbound=15001", "--inbound=20000"},
						SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(annotations.ProxyUID))}}}},
			}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// runningPod waits for the ReplicaSet's one running pod other than not.
func (n *node) runningPod(t *testing.T, ns, app string, not types.UID) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	poll.Eventually(t, 2*time.Minute, "a running pod of "+app, func() (bool, error) {
		l, err := n.c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
		if err != nil {
			return false, err
		}
		for i := range l.Items {
			p := &l.Items[i]
			if p.UID != not && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				got = p
				return true, nil
			}
		}
		return false, fmt.Errorf("%d pods, none running", len(l.Items))
	})
	return got
}

// waitVerifierEvent waits for the controller's BypassedCNI Event on the pod
// uid that names the node verifier's evidence as the reason it acted.
func (n *node) waitVerifierEvent(t *testing.T, ns string, uid types.UID) {
	t.Helper()
	poll.Eventually(t, 30*time.Second, "the controller's BypassedCNI Event naming the verifier's evidence", func() (bool, error) {
		evs, err := n.c.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(uid)).String()})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "BypassedCNI" && strings.Contains(e.Message, "node verifier found no Consul redirect rules") {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events, none BypassedCNI from the verifier's evidence", len(evs.Items))
	})
}

// startController runs the repair controller with the manifests' identity
// (RBAC, the evict action's role, its admission policy) and the extra
// flags, and returns its metrics address.
func (n *node) startController(t *testing.T, extra ...string) string {
	t.Helper()
	err := scenario.ApplyManifests(context.Background(), n.c.Client, filepath.Join(testbin.RepoRoot(), "manifests"),
		"base/controller/rbac.yaml", "base/controller/action.yaml", "base/controller/admission-policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sa := "system:serviceaccount:" + manifestsNamespace + ":consul-cni-repair"
	kc := filepath.Join(t.TempDir(), "repair.kubeconfig")
	cfg := n.c.ConfigFor(sa, "system:serviceaccounts", "system:serviceaccounts:"+manifestsNamespace, "system:authenticated")
	if err := cluster.WriteKubeconfig(kc, cfg, "consul-cni-repair"); err != nil {
		t.Fatal(err)
	}
	free := func() string {
		port, err := testnet.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("127.0.0.1:%d", port)
	}
	logFile := filepath.Join(t.TempDir(), "repair.log")
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	metrics := free()
	args := append([]string{"--kubeconfig=" + kc, "--leader-elect=false", "--node-readiness=false",
		"--metrics-bind-address=" + metrics, "--health-probe-bind-address=" + free(), "-v=2"}, extra...)
	cmd := exec.Command(testbin.Project(t, "repair"), args...)
	cmd.Stdout, cmd.Stderr = f, f
	p, err := proc.Start(cmd, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop(10 * time.Second)
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("--- repair log:\n%s", tail(string(b), 40))
		}
	})
	return metrics
}

// TestRulesRemovedByHandAreFoundAndReplaced: a meshed pod of a ReplicaSet
// on a real node, verified with its rules; its rules removed by hand in
// its network namespace. The verifier finds it (within 10 s) and the
// controller, on that evidence alone (its status, cni-applied-at and
// sandbox times all say meshed), evicts it with reason
// verified_unredirected; its replacement is verified with its rules.
func TestRulesRemovedByHandAreFoundAndReplaced(t *testing.T) {
	n := startNode(t)
	ns := n.c.Namespace(t)
	n.chain(t)
	n.markReady(t)
	n.injectedReplicaSet(t, ns, "web")
	pod := n.runningPod(t, ns, "web", "")
	n.startVerifier(t)
	n.startController(t)
	n.waitCondition(t, ns, pod.Name, corev1.ConditionTrue, annotations.ReasonRulesInPlace, time.Minute)

	path := n.netnsOf(t, string(pod.UID))
	out, err := n.Command("nsenter", "--net="+path, "--", iptables.VariantNFT.Tool(redirect.IPv4), "-t", "nat", "-F", redirect.ChainOutput).CombinedOutput()
	if err != nil {
		t.Fatalf("flushing %s in %s: %v: %s", redirect.ChainOutput, path, err, out)
	}
	removed := time.Now()
	got := n.waitCondition(t, ns, pod.Name, corev1.ConditionFalse, annotations.ReasonRulesDrifted, 10*time.Second)
	found := time.Since(removed)
	poll.Eventually(t, time.Minute, "pod "+pod.Name+" evicted", func() (bool, error) {
		p, err := n.c.Client.CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return true, nil
		}
		return p.UID != pod.UID || p.DeletionTimestamp != nil, nil
	})
	acted := time.Since(removed)
	next := n.runningPod(t, ns, "web", pod.UID)
	replacedIn := time.Since(removed)
	n.waitCondition(t, ns, next.Name, corev1.ConditionTrue, annotations.ReasonRulesInPlace, time.Minute)
	n.waitVerifierEvent(t, ns, pod.UID)
	t.Logf("rules removed by hand: verified without rules after %s (%s), evicted after %s, replacement running after %s",
		found.Round(10*time.Millisecond), got.Reason, acted.Round(10*time.Millisecond), replacedIn.Round(10*time.Millisecond))
}
