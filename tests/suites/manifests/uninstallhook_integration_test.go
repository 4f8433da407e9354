//go:build integration

package manifests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// TestUninstallHookRBACImpersonated applies the pre-delete hook's RBAC and
// proves, as its ServiceAccount (impersonated), that it may list the pods
// of the release namespace and nothing else without a name, get and patch
// the installer DaemonSet, and neither touch another DaemonSet nor delete
// that one.
func TestUninstallHookRBACImpersonated(t *testing.T) {
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	hooks, err := helmHooks(chartDir(t), chartValues(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	// The release namespace, as the base creates it.
	for _, o := range buildOverlay(t, "base") {
		if o.GetKind() == "Namespace" {
			if _, err := a.apply(ctx, o, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	applyRBAC(t, a, hooks)
	t.Cleanup(func() {
		for _, o := range hooks {
			if o.GetKind() == "Job" {
				continue
			}
			ri, err := a.resource(o)
			if err == nil {
				err = ri.Delete(context.Background(), o.GetName(), metav1.DeleteOptions{})
			}
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s: %v", objectID(o), err)
			}
		}
	})
	user, groups := serviceAccountUser(namespace, "consul-cni-uninstall")
	as, err := kubernetes.NewForConfig(c.ConfigFor(user, groups...))
	if err != nil {
		t.Fatal(err)
	}
	// Rules restricted to resourceNames grant nothing without a name.
	want := perms("", []string{"pods"}, []string{"list"}, namespace)
	poll.Eventually(t, 60*time.Second, "hook permissions", func() error {
		got, err := allowedMatrix(ctx, as)
		if err != nil {
			return err
		}
		if d := want.diff(got); d != "" {
			return fmt.Errorf("consul-cni-uninstall: %s", d)
		}
		return nil
	})

	dry := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	patch := []byte(`{"metadata":{"labels":{"x":"y"}}}`)
	// NotFound is allowed too: authorization comes first.
	allowed := func(err error) bool { return err == nil || apierrors.IsNotFound(err) }
	for _, tc := range []struct {
		name  string
		do    func() error
		allow bool
	}{
		{"get the installer DaemonSet", func() error {
			_, err := as.AppsV1().DaemonSets(namespace).Get(ctx, installerName, metav1.GetOptions{})
			return err
		}, true},
		{"patch the installer DaemonSet", func() error {
			_, err := as.AppsV1().DaemonSets(namespace).Patch(ctx, installerName, types.MergePatchType, patch, dry)
			return err
		}, true},
		{"list pods of the namespace", func() error {
			_, err := as.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{Limit: 1})
			return err
		}, true},
		{"patch another DaemonSet", func() error {
			_, err := as.AppsV1().DaemonSets(namespace).Patch(ctx, "other", types.MergePatchType, patch, dry)
			return err
		}, false},
		{"get the DaemonSet of another namespace", func() error {
			_, err := as.AppsV1().DaemonSets("default").Get(ctx, installerName, metav1.GetOptions{})
			return err
		}, false},
		{"delete the installer DaemonSet", func() error {
			return as.AppsV1().DaemonSets(namespace).Delete(ctx, installerName, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		}, false},
		{"list pods everywhere", func() error {
			_, err := as.CoreV1().Pods("").List(ctx, metav1.ListOptions{Limit: 1})
			return err
		}, false},
	} {
		err := tc.do()
		switch {
		case tc.allow && !allowed(err):
			t.Errorf("%s: %v, want allowed", tc.name, err)
		case !tc.allow && !apierrors.IsForbidden(err):
			t.Errorf("%s: %v, want forbidden", tc.name, err)
		}
	}
}
