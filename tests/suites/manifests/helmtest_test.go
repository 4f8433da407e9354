package manifests

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// withoutTestHooks drops the `helm test` hooks.
func withoutTestHooks(hooks []*unstructured.Unstructured) []*unstructured.Unstructured {
	return slices.DeleteFunc(slices.Clone(hooks), func(h *unstructured.Unstructured) bool {
		return h.GetAnnotations()[hookAnnotation] == "test"
	})
}

// testHook renders the chart with set and returns its `helm test` Pod, nil
// when there is none.
func testHook(t *testing.T, set ...string) *corev1.Pod {
	t.Helper()
	hooks, err := helmHooks(chartDir(t), chartValues(t, nil, set...))
	if err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	for _, h := range hooks {
		if h.GetAnnotations()[hookAnnotation] != "test" {
			continue
		}
		var p corev1.Pod
		decodeStrict(t, h, &p)
		pods = append(pods, &p)
	}
	switch len(pods) {
	case 0:
		return nil
	case 1:
		return pods[0]
	}
	t.Fatalf("%d test hooks, want one", len(pods))
	return nil
}

// TestHelmTestHook: `helm test` runs repair audit in a Pod of the
// controller's image and service account: it checks the controller's Lease
// always and node readiness only where the controller labels nodes (it
// acts, with node readiness), judges with the controller's CNI pods and
// action, and does not fail for pods outside the mesh. tests.enabled=false
// renders none.
func TestHelmTestHook(t *testing.T) {
	controller := find(t, renderChart(t, chartValues(t, nil)), "Deployment", controllerName)
	image, _, _ := unstructured.NestedSlice(controller.Object, "spec", "template", "spec", "containers")
	wantImage := image[0].(map[string]any)["image"]
	for _, tc := range []struct {
		set  []string
		want []string
	}{
		{nil, []string{"audit", "--controller-lease=" + namespace + "/" + controllerName, "--checks-timeout=2m", "--fail-outside=false",
			"--cni-namespace=" + namespace, "--cni-pod-selector=app.kubernetes.io/name=consul-cni"}},
		{[]string{"controller.dryRun=false", "tests.checksTimeout=30s"}, []string{"audit", "--controller-lease=" + namespace + "/" + controllerName,
			"--check-node-readiness", "--checks-timeout=30s", "--fail-outside=false", "--cni-namespace=" + namespace, "--cni-pod-selector=app.kubernetes.io/name=consul-cni"}},
		{[]string{"controller.dryRun=false", "controller.nodeReadiness=false", "controller.cniReadyGate=cni-pod", "controller.action=label"},
			[]string{"audit", "--controller-lease=" + namespace + "/" + controllerName, "--checks-timeout=2m", "--fail-outside=false",
				"--cni-namespace=" + namespace, "--cni-pod-selector=app.kubernetes.io/name=consul-cni", "--action=label", "--cni-ready-gate=cni-pod"}},
		{[]string{"installer.enabled=false", "cni.namespace=consul", "cni.podSelector=app=consul\\,component=cni", "controller.dryRun=false"},
			[]string{"audit", "--controller-lease=" + namespace + "/" + controllerName, "--check-node-readiness", "--checks-timeout=2m", "--fail-outside=false",
				"--cni-namespace=consul", "--cni-pod-selector=app=consul,component=cni"}},
	} {
		p := testHook(t, tc.set...)
		if p == nil {
			t.Errorf("%v: no test hook", tc.set)
			continue
		}
		c := p.Spec.Containers[0]
		if !slices.Equal(c.Args, tc.want) {
			t.Errorf("%v: args %q, want %q", tc.set, c.Args, tc.want)
		}
		if c.Image != wantImage || p.Spec.ServiceAccountName != controllerName || p.Spec.RestartPolicy != corev1.RestartPolicyNever {
			t.Errorf("%v: image %s, service account %s, restart %s; want the controller's image %s and service account, Never",
				tc.set, c.Image, p.Spec.ServiceAccountName, p.Spec.RestartPolicy, wantImage)
		}
		if p.Namespace != namespace || p.Annotations["helm.sh/hook-delete-policy"] != "before-hook-creation" {
			t.Errorf("%v: namespace %s, annotations %v", tc.set, p.Namespace, p.Annotations)
		}
	}
	if p := testHook(t, "tests.enabled=false"); p != nil {
		t.Errorf("tests.enabled=false: test hook %s rendered", p.Name)
	}
}
