package manifests

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// startupTaintPolicyName names the MutatingAdmissionPolicy and its binding
// of the component node-startup-taint.
const startupTaintPolicyName = "consul-cni-node-startup-taint"

func buildStartupTaint(tb testing.TB) []*unstructured.Unstructured {
	tb.Helper()
	root := manifestsDir(tb)
	return buildWithComponent(tb, filepath.Join(root, overlays["base"]), filepath.Join(root, "components", "node-startup-taint"))
}

// TestNodeStartupTaintComponent: the component adds the policy and its
// binding to the base and nothing else; the policy matches Node CREATE
// only, and its expressions use the taint and opt-out label this project
// defines.
func TestNodeStartupTaintComponent(t *testing.T) {
	objs := buildStartupTaint(t)
	if want := len(buildOverlay(t, "base")) + 2; len(objs) != want {
		t.Errorf("%d objects, want %d (the base and a policy with its binding)", len(objs), want)
	}
	pol := find(t, objs, "MutatingAdmissionPolicy", startupTaintPolicyName)
	bind := find(t, objs, "MutatingAdmissionPolicyBinding", startupTaintPolicyName)
	for _, o := range []*unstructured.Unstructured{pol, bind} {
		if o.GetAPIVersion() != "admissionregistration.k8s.io/v1" {
			t.Errorf("%s: apiVersion %s", o.GetKind(), o.GetAPIVersion())
		}
		if o.GetLabels()["app.kubernetes.io/part-of"] != "consul-cni-repair" {
			t.Errorf("%s: labels %v", o.GetKind(), o.GetLabels())
		}
	}
	if name, _, _ := unstructured.NestedString(bind.Object, "spec", "policyName"); name != pol.GetName() {
		t.Errorf("binding's policyName %q, want %q", name, pol.GetName())
	}
	rules, _, _ := unstructured.NestedSlice(pol.Object, "spec", "matchConstraints", "resourceRules")
	if len(rules) != 1 {
		t.Fatalf("resourceRules %v, want one", rules)
	}
	r := rules[0].(map[string]any)
	for field, want := range map[string][]string{"operations": {"CREATE"}, "resources": {"nodes"}, "apiGroups": {""}} {
		if got, _, _ := unstructured.NestedStringSlice(r, field); !reflect.DeepEqual(got, want) {
			t.Errorf("resourceRules[0].%s %v, want %v", field, got, want)
		}
	}
	conds, _, _ := unstructured.NestedSlice(pol.Object, "spec", "matchConditions")
	muts, _, _ := unstructured.NestedSlice(pol.Object, "spec", "mutations")
	b, err := json.Marshal([]any{conds, muts})
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), `\"`, `"`)
	for _, s := range []string{
		`"` + annotations.TaintCNINotReady + `"`,
		`"` + annotations.LabelCNIStartupTaint + `"`,
		`== "` + annotations.LabelCNIStartupTaintOptOut + `"`,
	} {
		if !strings.Contains(text, s) {
			t.Errorf("the policy's expressions do not contain %s", s)
		}
	}
	if fp, _, _ := unstructured.NestedString(pol.Object, "spec", "failurePolicy"); fp != "Fail" {
		t.Errorf("failurePolicy %q, want Fail", fp)
	}
}
