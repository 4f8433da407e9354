//go:build integration

package manifests

import (
	"context"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestServerSideDryRun applies every overlay's build to the real API server
// as a server-side dry run with strict field validation: schema, defaulting,
// validation and admission (Pod Security included) run, nothing is stored.
// The ServiceMonitor, PodMonitor and PrometheusRule, whose CRDs this API server does not
// have, are checked by the unit tests (Prometheus Operator types, rule-file
// parser) instead.
func TestServerSideDryRun(t *testing.T) {
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	// Namespaced objects can be dry-run only into an existing namespace.
	ns := find(t, buildOverlay(t, "base"), "Namespace", namespace)
	if _, err := a.apply(ctx, ns, false); err != nil {
		t.Fatal(err)
	}
	for _, ov := range overlayNames() {
		t.Run(ov, func(t *testing.T) {
			applied, skipped := 0, 0
			for _, o := range buildOverlay(t, ov) {
				if gvkOf(o).Group == monitoringGroup {
					skipped++
					continue
				}
				out, err := a.apply(ctx, o, true)
				if err != nil {
					t.Errorf("server-side dry run: %v", err)
					continue
				}
				applied++
				if out.GetName() != o.GetName() {
					t.Errorf("%s %s came back as %s", o.GetKind(), o.GetName(), out.GetName())
				}
			}
			if w := a.takeWarnings(); len(w) > 0 {
				t.Errorf("the API server warned:\n  %s", joinLines(w))
			}
			if skipped != 3 { // ServiceMonitor, PodMonitor, PrometheusRule
				t.Errorf("skipped %d Prometheus Operator objects, want 3", skipped)
			}
			t.Logf("%d objects accepted, %d Prometheus Operator objects left to the unit tests", applied, skipped)
		})
	}
}

// TestControllerPassesRestrictedPodSecurity dry-runs the controller
// Deployment into a namespace that warns at the restricted Pod Security
// level: the API server's own Pod Security admission must find nothing.
// The installer DaemonSet, which needs hostPath, must be refused in a
// namespace that enforces baseline (so the check can fail).
func TestControllerPassesRestrictedPodSecurity(t *testing.T) {
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	objs := buildOverlay(t, "base")

	nsName := c.Namespace(t)
	nsObj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": nsName, "labels": map[string]any{
			"pod-security.kubernetes.io/warn":    "restricted",
			"pod-security.kubernetes.io/enforce": "baseline",
		}},
	}}
	if _, err := a.apply(ctx, nsObj, false); err != nil {
		t.Fatal(err)
	}
	a.takeWarnings()

	d := find(t, objs, "Deployment", controllerName).DeepCopy()
	d.SetNamespace(nsName)
	if _, err := a.apply(ctx, d, true); err != nil {
		t.Fatal(err)
	}
	if w := a.takeWarnings(); len(w) > 0 {
		t.Errorf("restricted Pod Security warnings for the controller:\n  %s", joinLines(w))
	}

	// Pod Security admission warns (it never rejects) for workload
	// templates; the pods themselves would be rejected. A warning here
	// proves the check above is live.
	ds := find(t, objs, "DaemonSet", installerName).DeepCopy()
	ds.SetNamespace(nsName)
	if _, err := a.apply(ctx, ds, true); err != nil {
		t.Fatal(err)
	}
	if w := a.takeWarnings(); len(w) == 0 {
		t.Error("the installer DaemonSet (hostPath) raised no Pod Security warning in a baseline namespace")
	}
}
