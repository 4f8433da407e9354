//go:build integration

package cluster

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
)

func TestMain(m *testing.M) { Main(m) }

func TestAdminKubeconfigAndNamespace(t *testing.T) {
	c := Shared(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != "v1.37.2" {
		t.Fatalf("server version %q, want v1.37.2", v.GitVersion)
	}
	ns := c.Namespace(t)
	if !strings.HasPrefix(ns, "testadminkubeconfigandnamespace-") {
		t.Fatalf("namespace %q not named after the test", ns)
	}
	// The root CA is published into every namespace by the controller
	// manager (projected service-account volumes need it).
	ctx := context.Background()
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("kube-root-ca.crt never published in %s: %v", ns, err)
	}
}

func TestRBACWithImpersonationAndServiceAccountTokens(t *testing.T) {
	c := Shared(t)
	ns := c.Namespace(t)
	ctx := context.Background()

	// No rights yet: both an impersonated user and a real SA token are denied.
	alice := kubernetes.NewForConfigOrDie(c.ConfigFor("alice"))
	if _, err := alice.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice list pods: want Forbidden, got %v", err)
	}
	sa := kubernetes.NewForConfigOrDie(c.ServiceAccountConfig(t, ns, "reader"))
	if _, err := sa.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("service account list pods: want Forbidden, got %v", err)
	}

	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader", Namespace: ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}},
	}
	if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pod-reader"},
		Subjects: []rbacv1.Subject{
			{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: "alice"},
			{Kind: "ServiceAccount", Name: "reader", Namespace: ns},
		},
	}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, cs := range map[string]kubernetes.Interface{"alice": alice, "service account": sa} {
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			return err == nil, nil
		}); err != nil {
			t.Fatalf("%s still cannot list pods after the binding", name)
		}
		// Granted list, not delete.
		if err := cs.CoreV1().Pods(ns).Delete(ctx, "x", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Fatalf("%s delete pod: want Forbidden, got %v", name, err)
		}
	}
	// The token is a real bound service-account token, not the admin's.
	ssr, err := sa.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnSelfSubjectReview, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "system:serviceaccount:" + ns + ":reader"; ssr.Status.UserInfo.Username != want {
		t.Fatalf("token user %q, want %q", ssr.Status.UserInfo.Username, want)
	}
}

// TestControllersAndScheduler checks that kube-controller-manager and
// kube-scheduler work: a Deployment gets a ReplicaSet and pods, and the pods
// are scheduled onto a schedulable Node (created here through the API; no
// kubelet runs it, so the pods stay Pending after binding).
func TestControllersAndScheduler(t *testing.T) {
	c := Shared(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	node := &corev1.Node{
		// The node has no hostname label unless we give it one.
		ObjectMeta: metav1.ObjectMeta{Name: "fake-" + ns, Labels: map[string]string{"kubernetes.io/hostname": "fake-" + ns}},
		Status: corev1.NodeStatus{
			Capacity:    corev1.ResourceList{corev1.ResourcePods: resourceQuantity("10"), corev1.ResourceCPU: resourceQuantity("4"), corev1.ResourceMemory: resourceQuantity("8Gi")},
			Allocatable: corev1.ResourceList{corev1.ResourcePods: resourceQuantity("10"), corev1.ResourceCPU: resourceQuantity("4"), corev1.ResourceMemory: resourceQuantity("8Gi")},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		},
	}
	n, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	// kube-controller-manager's node lifecycle controller writes the new
	// Node too (taints, conditions): retry on its conflicts.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		// By name: a failed update leaves n empty.
		cur, err := c.Client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status = node.Status
		updated, err := c.Client.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if err == nil {
			n = updated
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	two := int32(2)
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &two,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/hostname": n.Name},
					Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers:   []corev1.Container{{Name: "app", Image: "example/idle:1"}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last string
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, nil
		}
		bound := 0
		for _, p := range pods.Items {
			if p.Spec.NodeName == n.Name {
				bound++
			}
			if len(p.Spec.Volumes) == 0 {
				return false, nil
			}
		}
		last = ""
		for _, p := range pods.Items {
			last += p.Name + "->" + p.Spec.NodeName + " "
		}
		return len(pods.Items) == 2 && bound == 2, nil
	}); err != nil {
		t.Fatalf("deployment pods not created and bound to %s: %s", n.Name, last)
	}
}

var authnSelfSubjectReview = authenticationv1.SelfSubjectReview{}

func resourceQuantity(s string) resource.Quantity { return resource.MustParse(s) }

// The Prometheus Operator kinds the manifests use can be created once the
// minimal CRDs are installed (twice: it is idempotent).
func TestPrometheusOperatorCRDs(t *testing.T) {
	c := Shared(t)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if err := c.InstallPrometheusOperatorCRDs(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ns := c.Namespace(t)
	dc := dynamic.NewForConfigOrDie(c.Config)
	for kind, resource := range map[string]string{"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"} {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "monitoring.coreos.com/v1", "kind": kind,
			"metadata": map[string]any{"name": "x"},
			"spec":     map[string]any{"anything": []any{"kept"}},
		}}
		gvr := schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: resource}
		if _, err := dc.Resource(gvr).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", kind, err)
		}
		got, err := dc.Resource(gvr).Namespace(ns).Get(ctx, "x", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v, _, _ := unstructured.NestedSlice(got.Object, "spec", "anything"); len(v) != 1 {
			t.Fatalf("%s spec not kept: %v", kind, got.Object["spec"])
		}
	}
}
