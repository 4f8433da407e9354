//go:build integration

package manifests

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

func TestMain(m *testing.M) { cluster.Main(m) }

const fieldManager = "consul-cni-repair-manifests-test"

// applier applies built objects to the cluster with server-side apply,
// strict field validation, and records the API server's warnings.
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper

	mu       sync.Mutex
	warnings []string
}

func (a *applier) HandleWarningHeader(code int, agent, text string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.warnings = append(a.warnings, text)
}

func (a *applier) takeWarnings() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.warnings
	a.warnings = nil
	return w
}

func newApplier(tb testing.TB, c *cluster.Cluster) *applier {
	tb.Helper()
	a := &applier{}
	cfg := rest.CopyConfig(c.Config)
	cfg.WarningHandler = a
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	a.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	if a.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		tb.Fatal(err)
	}
	return a
}

// apply server-side-applies one object; dryRun makes it a server-side dry
// run (admission, validation and defaulting happen, nothing is stored).
func (a *applier) apply(ctx context.Context, o *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk, o.GetName(), err)
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = a.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	body, err := json.Marshal(o.Object)
	if err != nil {
		return nil, err
	}
	opts := metav1.PatchOptions{FieldManager: fieldManager, FieldValidation: "Strict", Force: ptr(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	out, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, opts)
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err)
	}
	return out, nil
}

func ptr[T any](v T) *T { return &v }

// applyRBAC applies, for real, what identities need: the namespace, the
// ServiceAccounts and every RBAC object of an overlay's build.
func applyRBAC(tb testing.TB, a *applier, objs []*unstructured.Unstructured) {
	tb.Helper()
	ctx := context.Background()
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if _, err := a.apply(ctx, o, false); err != nil {
				tb.Fatal(err)
			}
		}
	}
}

// nodeCNIReady is nil once the node carries the cni=ready label and no
// startup taint, else it says what is still there.
func nodeCNIReady(ctx context.Context, cs kubernetes.Interface, name string) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if n.Labels[annotations.LabelCNIReady] != annotations.LabelCNIReadyValue {
		return fmt.Errorf("labels %v", n.Labels)
	}
	for _, tn := range n.Spec.Taints {
		if tn.Key == annotations.TaintCNINotReady {
			return fmt.Errorf("taints %v", n.Spec.Taints)
		}
	}
	return nil
}

func serviceAccountUser(ns, name string) (string, []string) {
	return "system:serviceaccount:" + ns + ":" + name,
		[]string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
}

func joinLines(s []string) string { return strings.Join(s, "\n  ") }
