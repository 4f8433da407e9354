package manifests

import (
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// The repair-only overlay: the controller keyed on consul-k8s's CNI pods,
// the node verifier, and nothing of the installer's.
func TestRepairOnlyOverlay(t *testing.T) {
	objs := build(t, filepath.Join(manifestsDir(t), "overlays", "repair-only"))
	for _, o := range objs {
		id := o.GetKind() + "/" + o.GetName()
		switch {
		case o.GetKind() == "DaemonSet" && o.GetName() != verifierName, o.GetName() == admissionPolicyName:
			t.Errorf("%s shipped", id)
		}
		if o.GetName() == installerName {
			t.Errorf("%s of the installer shipped", id)
		}
		if o.GetLabels()["app.kubernetes.io/part-of"] != "consul-cni-repair" {
			t.Errorf("%s: label app.kubernetes.io/part-of missing", id)
		}
	}
	var dep appsv1.Deployment
	decodeStrict(t, find(t, objs, "Deployment", controllerName), &dep)
	args := dep.Spec.Template.Spec.Containers[0].Args
	for _, want := range []string{"--cni-namespace=consul", "--cni-pod-selector=app=consul,component=cni"} {
		if !slices.Contains(args, want) {
			t.Errorf("controller args %v: %s missing", args, want)
		}
	}
	var ns corev1.Namespace
	decodeStrict(t, find(t, objs, "Namespace", namespace), &ns)
	// The verifier needs the privileged level (the node's root file system,
	// capabilities); the controller passes restricted on its own
	// (TestControllerDeployment).
	if l := ns.Labels["pod-security.kubernetes.io/enforce"]; l != "privileged" {
		t.Errorf("namespace enforces %q, want privileged (the verifier)", l)
	}
	find(t, objs, "DaemonSet", verifierName)
	find(t, objs, "ValidatingAdmissionPolicy", verifierPolicyName)
	if d := wantVerifier().diff(rbacOf(t, objs, namespace, verifierName)); d != "" {
		t.Errorf("verifier %s: %s", verifierName, d)
	}
	// The controller's own objects are all there.
	base := buildOverlay(t, "base")
	for _, o := range base {
		if o.GetName() == installerName || o.GetName() == admissionPolicyName || (o.GetKind() == "DaemonSet" && o.GetName() != verifierName) {
			continue
		}
		find(t, objs, o.GetKind(), o.GetName())
	}
}
