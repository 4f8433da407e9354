package manifests

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	batchv1 "k8s.io/api/batch/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/uninstallall"
)

// The pre-delete hook's patch of the installer DaemonSet is the uninstall
// overlay's change: applied to the base's DaemonSet (and to the chart's),
// it gives the overlay's DaemonSet field for field.
func TestUninstallHookPatchMatchesOverlay(t *testing.T) {
	ops, err := uninstallall.Patch("/etc/cni/net.d")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(b)
	if err != nil {
		t.Fatal(err)
	}
	// Both sides through JSON, so numbers compare alike.
	var want map[string]any
	wb, err := json.Marshal(find(t, build(t, filepath.Join(manifestsDir(t), "overlays", "uninstall")), "DaemonSet", installerName).Object)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(wb, &want); err != nil {
		t.Fatal(err)
	}
	for name, objs := range map[string][]*unstructured.Unstructured{
		"kustomize base": buildOverlay(t, "base"),
		"chart":          withoutHelmLabels(renderChart(t, chartValues(t, nil))),
	} {
		src, err := json.Marshal(find(t, objs, "DaemonSet", installerName).Object)
		if err != nil {
			t.Fatal(err)
		}
		out, err := patch.Apply(src)
		if err != nil {
			t.Fatalf("%s: applying the hook's patch: %v", name, err)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		for _, d := range diffValues("", got, want) {
			t.Errorf("%s + hook patch: %s (!= overlays/uninstall)", name, d)
		}
	}
}

// The hook objects: pre-delete, deleted once they succeeded; the Job runs
// uninstall-all on the release's installer DaemonSet with the node's CNI
// directory; the Role grants get/patch of that DaemonSet and list of pods.
func TestUninstallHookObjects(t *testing.T) {
	hooks, err := helmHooks(chartDir(t), chartValues(t, []string{"gke.yaml"}))
	if err != nil {
		t.Fatal(err)
	}
	hooks = withoutTestHooks(hooks)
	kinds := map[string]bool{}
	for _, h := range hooks {
		kinds[h.GetKind()] = true
		a := h.GetAnnotations()
		if a[hookAnnotation] != "pre-delete" || a["helm.sh/hook-delete-policy"] != "before-hook-creation,hook-succeeded" {
			t.Errorf("%s: annotations %v", objectID(h), a)
		}
		if h.GetNamespace() != namespace {
			t.Errorf("%s: not in the release namespace %s", objectID(h), namespace)
		}
	}
	for _, k := range []string{"ServiceAccount", "Role", "RoleBinding", "Job"} {
		if !kinds[k] {
			t.Errorf("no %s hook (%v)", k, kinds)
		}
	}
	var job batchv1.Job
	decodeStrict(t, find(t, hooks, "Job", "consul-cni-uninstall"), &job)
	c := job.Spec.Template.Spec.Containers[0]
	wantArgs := []string{"uninstall-all", "--namespace=" + namespace, "--daemonset=" + installerName, "--host-cni-net-dir=/etc/cni/net.d", "--timeout=4m"}
	if !slices.Equal(c.Args, wantArgs) || !slices.Equal(c.Command, []string{"consul-cni-installer"}) {
		t.Errorf("job command %v args %v, want %v", c.Command, c.Args, wantArgs)
	}
	var ds struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct{ Image string }
				}
			}
		}
	}
	b, _ := json.Marshal(find(t, renderChart(t, chartValues(t, nil)), "DaemonSet", installerName).Object)
	if err := json.Unmarshal(b, &ds); err != nil || c.Image != ds.Spec.Template.Spec.Containers[0].Image {
		t.Errorf("job image %s, want the installer's (%v)", c.Image, err)
	}
	if job.Spec.Template.Spec.ServiceAccountName != "consul-cni-uninstall" {
		t.Errorf("service account %q", job.Spec.Template.Spec.ServiceAccountName)
	}
	var role rbacv1.Role
	decodeStrict(t, find(t, hooks, "Role", "consul-cni-uninstall"), &role)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, ResourceNames: []string{installerName}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
	}
	if gb, _ := json.Marshal(role.Rules); string(gb) != mustJSON(t, want) {
		t.Errorf("role rules %s, want %s", gb, mustJSON(t, want))
	}

	for _, set := range []string{"uninstallHook.enabled=false", "installer.enabled=false"} {
		hooks, err := helmHooks(chartDir(t), chartValues(t, nil, set))
		if hooks = withoutTestHooks(hooks); err != nil || len(hooks) != 0 {
			t.Errorf("%s: %d hooks (%v), want none", set, len(hooks), err)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
