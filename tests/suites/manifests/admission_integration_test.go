//go:build integration

package manifests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const nodeNameExtra = "authentication.kubernetes.io/node-name"

// TestInstallerAdmissionPolicyEnforced proves, with the token the plugin
// really uses (the installer ServiceAccount's token bound to the installer
// pod on node A), that the API server lets it change only the
// transparent-proxy-status annotation, and only of pods on node A.
func TestInstallerAdmissionPolicyEnforced(t *testing.T) {
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	objs := buildOverlay(t, "base")
	applyRBAC(t, a, objs)
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if _, err := a.apply(ctx, find(t, objs, kind, admissionPolicyName), false); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		bg := context.Background()
		_ = c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(bg, admissionPolicyName, metav1.DeleteOptions{})
		_ = c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(bg, admissionPolicyName, metav1.DeleteOptions{})
	})

	// Two nodes and, on node A, an installer pod made from the DaemonSet.
	suffix := fmt.Sprint(time.Now().UnixNano())
	nodeA, nodeB := "vap-a-"+suffix, "vap-b-"+suffix
	for _, n := range []string{nodeA, nodeB} {
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Client.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{}) })
	}
	inst := createInstallerPod(t, c, objs, installerName+"-vap-"+suffix, nodeA)

	// The plugin's credentials: a token of the installer's ServiceAccount
	// bound to that pod, as kubelet projects it.
	tr, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, installerName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: ptr(int64(3600)),
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: inst.Name, UID: inst.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerToken = tr.Status.Token
	asPlugin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	who, err := asPlugin.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if who.Status.UserInfo.Username != installerSAUser {
		t.Fatalf("token authenticates as %q, want %q", who.Status.UserInfo.Username, installerSAUser)
	}
	if got := who.Status.UserInfo.Extra[nodeNameExtra]; len(got) != 1 || got[0] != nodeA {
		t.Fatalf("token extra %s = %v, want [%s]: the own-node rule could not apply", nodeNameExtra, got, nodeA)
	}

	// Injected pods on node A and node B.
	ns := c.Namespace(t)
	mk := func(name, node string) *corev1.Pod {
		meta := injectedMeta(map[string]string{"app": name})
		meta.Name = name
		p, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: meta,
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	onA, onB := mk("on-a", nodeA), mk("on-b", nodeB)

	patch := func(pod *corev1.Pod, body string) error {
		// Strategic merge, as kubectl and most clients patch pods: lists
		// merge by key, so only the field named changes.
		_, err := asPlugin.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, []byte(body),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	status := func(v string) string {
		return fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, annotations.KeyTransparentProxyStatus, v)
	}
	complete := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, annotations.KeyTransparentProxyStatus, annotations.TProxyStatusComplete,
		annotations.KeyCNIAppliedAt, annotations.FormatTime(time.Now()))
	// The policy takes effect once the API server has loaded it.
	poll.Eventually(t, 60*time.Second, "the policy refuses a label change", func() error {
		if err := patch(onA, `{"metadata":{"labels":{"app":"evil"}}}`); !apierrors.IsForbidden(err) {
			return fmt.Errorf("label change: %v", err)
		}
		return nil
	})
	for _, tc := range []struct {
		name    string
		pod     *corev1.Pod
		body    string
		allowed bool
	}{
		{"status waiting on own node", onA, status(annotations.TProxyStatusWaiting), true},
		{"status complete on own node", onA, status(annotations.TProxyStatusComplete), true},
		{"status complete on another node", onB, status(annotations.TProxyStatusComplete), false},
		{"status complete with cni-applied-at on own node", onA, complete, true},
		{"status complete with cni-applied-at on another node", onB, complete, false},
		{"another annotation", onA, `{"metadata":{"annotations":{"example.com/x":"y"}}}`, false},
		{"remove an annotation", onA, fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, annotations.KeyInjectStatus), false},
		{"label", onA, `{"metadata":{"labels":{"app":"evil"}}}`, false},
		{"image", onA, `{"spec":{"containers":[{"name":"app","image":"registry.example/evil:1"}]}}`, false},
		{"finalizer", onA, `{"metadata":{"finalizers":["example.com/keep"]}}`, false},
	} {
		err := patch(tc.pod, tc.body)
		switch {
		case tc.allowed && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !tc.allowed && !apierrors.IsForbidden(err):
			t.Errorf("%s: got %v, want Forbidden", tc.name, err)
		}
	}
	// The admin is not affected.
	if _, err := c.Client.CoreV1().Pods(ns).Patch(ctx, onB.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`),
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("admin label change: %v", err)
	}
	// The API server found no type errors in the policy's expressions.
	vap, err := c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, admissionPolicyName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tc := vap.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
		t.Errorf("type-checking warnings: %+v", tc.ExpressionWarnings)
	}
}
