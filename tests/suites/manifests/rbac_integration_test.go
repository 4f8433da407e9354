//go:build integration

package manifests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// The resources and verbs the RBAC matrix asks about: everything our
// identities are granted, and what an attacker on a node would want.
var (
	matrixResources = []struct{ group, resource string }{
		{"", "pods"}, {"", "pods/eviction"}, {"", "pods/status"}, {"", "pods/exec"}, {"", "pods/log"},
		{"", "pods/ephemeralcontainers"}, {"", "pods/binding"},
		{"", "nodes"}, {"", "nodes/status"}, {"", "nodes/proxy"},
		{"", "events"}, {"events.k8s.io", "events"},
		{"coordination.k8s.io", "leases"},
		{"", "secrets"}, {"", "configmaps"}, {"", "serviceaccounts"}, {"", "serviceaccounts/token"},
		{"", "services"}, {"", "endpoints"}, {"", "namespaces"},
		{"apps", "deployments"}, {"apps", "daemonsets"}, {"apps", "replicasets"},
		{"policy", "poddisruptionbudgets"},
		{"rbac.authorization.k8s.io", "clusterroles"}, {"rbac.authorization.k8s.io", "clusterrolebindings"},
		{"rbac.authorization.k8s.io", "roles"}, {"rbac.authorization.k8s.io", "rolebindings"},
		{"admissionregistration.k8s.io", "mutatingwebhookconfigurations"},
	}
	matrixVerbs = []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "impersonate", "escalate", "bind"}
	// Scopes: "" = all namespaces (or cluster-scoped), the controller's own
	// namespace, and an unrelated one.
	matrixScopes = []string{"", namespace, "default"}
)

// allowedMatrix asks the API server, as the identity itself (impersonated,
// SelfSubjectAccessReview), about every resource x verb x scope, and
// returns the permissions found in the form of permSet (a permission
// granted cluster-wide appears once with Namespace "").
func allowedMatrix(ctx context.Context, cs kubernetes.Interface) (permSet, error) {
	got := permSet{}
	for _, r := range matrixResources {
		resource, sub, _ := cutSlash(r.resource)
		for _, verb := range matrixVerbs {
			allowedIn := map[string]bool{}
			for _, scope := range matrixScopes {
				ssar := &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
					ResourceAttributes: &authzv1.ResourceAttributes{
						Namespace: scope, Verb: verb, Group: r.group, Resource: resource, Subresource: sub,
					},
				}}
				out, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, ssar, metav1.CreateOptions{})
				if err != nil {
					return nil, err
				}
				allowedIn[scope] = out.Status.Allowed
			}
			switch {
			case allowedIn[""]:
				got[perm{r.group, r.resource, verb, ""}] = true
				if !allowedIn[namespace] || !allowedIn["default"] {
					return nil, fmt.Errorf("%s %s allowed cluster-wide but not in every namespace", verb, r.resource)
				}
			default:
				for _, scope := range matrixScopes[1:] {
					if allowedIn[scope] {
						got[perm{r.group, r.resource, verb, scope}] = true
					}
				}
			}
		}
	}
	return got, nil
}

func cutSlash(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// TestRBACImpersonated applies each overlay's RBAC to the real API server and
// proves, as each ServiceAccount (impersonated), that it holds exactly the
// permissions docs/design/deployment.md lists for that overlay, then makes the calls
// that matter for real (server-side dry run where they would destroy).
func TestRBACImpersonated(t *testing.T) {
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()

	ctrlUser, ctrlGroups := serviceAccountUser(namespace, controllerName)
	instUser, instGroups := serviceAccountUser(namespace, installerName)
	asController, err := kubernetes.NewForConfig(c.ConfigFor(ctrlUser, ctrlGroups...))
	if err != nil {
		t.Fatal(err)
	}
	asInstaller, err := kubernetes.NewForConfig(c.ConfigFor(instUser, instGroups...))
	if err != nil {
		t.Fatal(err)
	}

	// A pod and a node to act on.
	podNS := c.Namespace(t)
	pod, err := c.Client.CoreV1().Pods(podNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "victim"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.example/app:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node, err := c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "rbac-" + podNS},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client.CoreV1().Nodes().Delete(context.Background(), node.Name, metav1.DeleteOptions{}) })

	for _, ov := range []string{"base", "audit", "delete", "label"} {
		t.Run(ov, func(t *testing.T) {
			applyRBAC(t, a, buildOverlay(t, ov))
			// The authorizer's caches follow RBAC changes within moments.
			poll.Eventually(t, 60*time.Second, "controller permissions", func() error {
				got, err := allowedMatrix(ctx, asController)
				if err != nil {
					return err
				}
				if d := wantController(ov).diff(got); d != "" {
					return fmt.Errorf("controller %s: %s", controllerName, d)
				}
				return nil
			})
			poll.Eventually(t, 60*time.Second, "installer permissions", func() error {
				got, err := allowedMatrix(ctx, asInstaller)
				if err != nil {
					return err
				}
				if d := wantInstaller().diff(got); d != "" {
					return fmt.Errorf("installer %s: %s", installerName, d)
				}
				return nil
			})

			// The real calls. Destructive ones are server-side dry runs:
			// authorization happens before the dry run, so a 403 or a
			// success is the real answer.
			dry := []string{metav1.DryRunAll}
			evict := func(cs kubernetes.Interface) error {
				return cs.PolicyV1().Evictions(podNS).Evict(ctx, &policyv1.Eviction{
					ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: podNS},
					DeleteOptions: &metav1.DeleteOptions{DryRun: dry},
				})
			}
			del := func(cs kubernetes.Interface) error {
				return cs.CoreV1().Pods(podNS).Delete(ctx, pod.Name, metav1.DeleteOptions{DryRun: dry})
			}
			labelPod := func(cs kubernetes.Interface) error {
				_, err := cs.CoreV1().Pods(podNS).Patch(ctx, pod.Name, types.MergePatchType,
					[]byte(`{"metadata":{"labels":{"consul.hashicorp.com/cni-uninitialized":"true"}}}`),
					metav1.PatchOptions{DryRun: dry})
				return err
			}
			annotatePod := func(cs kubernetes.Interface) error {
				_, err := cs.CoreV1().Pods(podNS).Patch(ctx, pod.Name, types.MergePatchType,
					[]byte(`{"metadata":{"annotations":{"consul.hashicorp.com/transparent-proxy-status":"complete"}}}`),
					metav1.PatchOptions{DryRun: dry})
				return err
			}
			getPod := func(cs kubernetes.Interface) error {
				_, err := cs.CoreV1().Pods(podNS).Get(ctx, pod.Name, metav1.GetOptions{})
				return err
			}
			listPods := func(cs kubernetes.Interface) error {
				_, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1})
				return err
			}
			patchNode := func(cs kubernetes.Interface) error {
				_, err := cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType,
					[]byte(`{"metadata":{"labels":{"consul.hashicorp.com/cni":"ready"}}}`), metav1.PatchOptions{DryRun: dry})
				return err
			}
			readSecret := func(cs kubernetes.Interface) error {
				_, err := cs.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{})
				return err
			}
			type call struct {
				name    string
				do      func(kubernetes.Interface) error
				allowed bool
			}
			checkCalls := func(who string, cs kubernetes.Interface, calls []call) {
				for _, cl := range calls {
					err := cl.do(cs)
					switch {
					case cl.allowed && err != nil:
						t.Errorf("%s: %s: %v", who, cl.name, err)
					case !cl.allowed && !apierrors.IsForbidden(err):
						t.Errorf("%s: %s: got %v, want Forbidden", who, cl.name, err)
					}
				}
			}
			checkCalls("installer", asInstaller, []call{
				{"get pod", getPod, true},
				{"patch the status annotation", annotatePod, true},
				{"delete pod", del, false},
				{"evict pod", evict, false},
				{"list pods", listPods, false},
				{"patch node", patchNode, false},
				{"read secrets", readSecret, false},
			})
			checkCalls("controller", asController, []call{
				{"get pod", getPod, true},
				{"list pods", listPods, true},
				{"patch node", patchNode, ov != "audit"},
				{"evict pod", evict, ov == "base"},
				{"delete pod", del, ov == "delete"},
				{"label pod", labelPod, ov == "label"},
				{"read secrets", readSecret, false},
			})
		})
	}
}
