//go:build integration

package manifests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// otherNamespace is where the namespace-override variant installs the
// manifests (kustomize namespace: field).
const otherNamespace = "ccr-mesh-system"

// writeCase is one write an identity attempts (always a server-side dry
// run: authorization and admission decide as for a real write). deny is ""
// when the write must pass, else a fragment of the error it must fail with
// (the policy's message, or RBAC's "cannot patch").
type writeCase struct {
	name string
	do   func(ctx context.Context) error
	deny string
}

// runWrites makes every write and returns one error listing each whose
// outcome is not the expected one, or nil.
func runWrites(ctx context.Context, cases []writeCase) error {
	var bad []string
	for _, wc := range cases {
		err := wc.do(ctx)
		switch {
		case wc.deny == "" && err != nil:
			bad = append(bad, fmt.Sprintf("%s: %v, want it to pass", wc.name, err))
		case wc.deny != "" && !apierrors.IsForbidden(err):
			bad = append(bad, fmt.Sprintf("%s: got %v, want Forbidden (%s)", wc.name, err, wc.deny))
		case wc.deny != "" && !strings.Contains(err.Error(), wc.deny):
			bad = append(bad, fmt.Sprintf("%s: denied with %q, want %q", wc.name, err, wc.deny))
		}
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "\n  "))
	}
	return nil
}

// policyFixture holds the objects the writes act on. Node A carries
// everything the controller manages plus things it must not touch; node B
// carries none of it. Pods run on A and B; one carries the
// cni-uninitialized label already.
type policyFixture struct {
	c                           *cluster.Cluster
	nodeA, nodeB                string
	podNS                       string
	onA, onB, labelled, plain   string
	otherLabel, otherAnnotation string
	startupTaint, otherTaint    corev1.Taint
}

func newPolicyFixture(t *testing.T, c *cluster.Cluster) *policyFixture {
	t.Helper()
	ctx := context.Background()
	suffix := fmt.Sprint(time.Now().UnixNano())
	f := &policyFixture{
		c: c, nodeA: "pol-a-" + suffix, nodeB: "pol-b-" + suffix, podNS: c.Namespace(t),
		onA: "on-a", onB: "on-b", labelled: "labelled", plain: "plain",
		otherLabel: "example.com/keep", otherAnnotation: "example.com/note",
		startupTaint: corev1.Taint{Key: startupTaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule},
		otherTaint:   corev1.Taint{Key: "example.com/dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule},
	}
	nodes := []*corev1.Node{
		{
			ObjectMeta: metav1.ObjectMeta{Name: f.nodeA,
				Labels:      map[string]string{annotations.LabelCNIReady: annotations.LabelCNIReadyValue, f.otherLabel: "x"},
				Annotations: map[string]string{annotations.AnnotationCNIReadySince: "2026-01-01T00:00:00Z", f.otherAnnotation: "y"}},
			Spec: corev1.NodeSpec{Unschedulable: true, Taints: []corev1.Taint{f.startupTaint, f.otherTaint}},
		},
		{ObjectMeta: metav1.ObjectMeta{Name: f.nodeB}},
	}
	for _, n := range nodes {
		if _, err := c.Client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Client.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
	}
	for _, p := range []struct {
		name, node string
		labels     map[string]string
	}{
		{f.onA, f.nodeA, map[string]string{"app": "a"}},
		{f.onB, f.nodeB, map[string]string{"app": "b"}},
		{f.labelled, f.nodeA, map[string]string{"app": "l", annotations.LabelUninitialized: annotations.LabelUninitializedValue}},
	} {
		meta := injectedMeta(p.labels)
		meta.Name = p.name
		if _, err := c.Client.CoreV1().Pods(f.podNS).Create(ctx, &corev1.Pod{
			ObjectMeta: meta,
			Spec:       corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Client.CoreV1().Pods(f.podNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: f.plain, Labels: map[string]string{"app": "plain"}},
		Spec:       corev1.PodSpec{NodeName: f.nodeB, Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return f
}

var dryRun = metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}

// patchPod patches a pod as cs (dry run) with a strategic merge patch, as
// kubectl does: containers merge by name, so only the field named changes.
func (f *policyFixture) patchPod(cs kubernetes.Interface, pod string, body any) func(context.Context) error {
	return func(ctx context.Context) error {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		_, err = cs.CoreV1().Pods(f.podNS).Patch(ctx, pod, types.StrategicMergePatchType, b, dryRun)
		return err
	}
}

// patchNode merge-patches a node as cs (dry run). edit receives the node
// as it is now (the node lifecycle controller taints nodes without a
// kubelet, so taint lists are computed fresh) and returns the patch body.
func (f *policyFixture) patchNode(cs kubernetes.Interface, node string, sub string, edit func(n *corev1.Node) any) func(context.Context) error {
	return func(ctx context.Context) error {
		n, err := f.c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		b, err := json.Marshal(edit(n))
		if err != nil {
			return err
		}
		var subs []string
		if sub != "" {
			subs = []string{sub}
		}
		_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, b, dryRun, subs...)
		return err
	}
}

func labelsPatch(kv ...any) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return map[string]any{"metadata": map[string]any{"labels": m}}
}

func annotationsPatch(k string, v any) map[string]any {
	return map[string]any{"metadata": map[string]any{"annotations": map[string]any{k: v}}}
}

// taints returns a patch that sets the node's taints to its current ones
// without those drop selects, plus add.
func taints(drop func(corev1.Taint) bool, add ...corev1.Taint) func(n *corev1.Node) any {
	return func(n *corev1.Node) any {
		out := []corev1.Taint{}
		for _, t := range n.Spec.Taints {
			if drop == nil || !drop(t) {
				out = append(out, t)
			}
		}
		out = append(out, add...)
		return map[string]any{"spec": map[string]any{"taints": out}}
	}
}

func static(body any) func(*corev1.Node) any { return func(*corev1.Node) any { return body } }

func hasKey(key string) func(corev1.Taint) bool {
	return func(t corev1.Taint) bool { return t.Key == key }
}

// controllerNodeWrites: with node patch granted (every overlay but audit),
// the controller's node-readiness changes pass and every other change is
// denied by its policy; in audit, RBAC denies them all.
func (f *policyFixture) controllerNodeWrites(cs kubernetes.Interface, overlay string) []writeCase {
	need := func(string) string { return "" }
	deny := func(msg string) string { return msg }
	if overlay == "audit" {
		need = func(string) string { return "cannot patch resource" }
		deny = need
	}
	const (
		labelMsg  = "may change only the node label consul.hashicorp.com/cni"
		annMsg    = "may change only the node annotation consul.hashicorp.com/cni-ready-since"
		taintMsg  = "may add or remove only taints with the startup-taint key"
		effectMsg = "may add the startup taint consul.hashicorp.com/cni-not-ready only with the effect NoSchedule"
		specMsg   = "may not cordon, uncordon or otherwise change a node's spec or status"
	)
	A, B := f.nodeA, f.nodeB
	return []writeCase{
		{"node: set cni=ready", f.patchNode(cs, B, "", static(labelsPatch(annotations.LabelCNIReady, annotations.LabelCNIReadyValue))), need("")},
		{"node: remove cni label", f.patchNode(cs, A, "", static(labelsPatch(annotations.LabelCNIReady, nil))), need("")},
		{"node: set cni-ready-since", f.patchNode(cs, B, "", static(annotationsPatch(annotations.AnnotationCNIReadySince, "2026-12-01T00:00:00Z"))), need("")},
		{"node: remove cni-ready-since", f.patchNode(cs, A, "", static(annotationsPatch(annotations.AnnotationCNIReadySince, nil))), need("")},
		{"node: add startup taint", f.patchNode(cs, B, "", taints(nil, f.startupTaint)), need("")},
		{"node: remove startup taint", f.patchNode(cs, A, "", taints(hasKey(startupTaintKey))), need("")},
		{"node: label, annotation and taint at once", f.patchNode(cs, B, "", func(n *corev1.Node) any {
			p := taints(nil, f.startupTaint)(n).(map[string]any)
			p["metadata"] = map[string]any{
				"labels":      map[string]any{annotations.LabelCNIReady: annotations.LabelCNIReadyValue},
				"annotations": map[string]any{annotations.AnnotationCNIReadySince: "2026-12-01T00:00:00Z"},
			}
			return p
		}), need("")},
		{"node: cni=yes", f.patchNode(cs, B, "", static(labelsPatch(annotations.LabelCNIReady, "yes"))), deny(labelMsg)},
		{"node: another label", f.patchNode(cs, B, "", static(labelsPatch("example.com/evil", "x"))), deny(labelMsg)},
		{"node: remove another label", f.patchNode(cs, A, "", static(labelsPatch(f.otherLabel, nil))), deny(labelMsg)},
		{"node: another annotation", f.patchNode(cs, B, "", static(annotationsPatch("example.com/evil", "x"))), deny(annMsg)},
		{"node: remove another annotation", f.patchNode(cs, A, "", static(annotationsPatch(f.otherAnnotation, nil))), deny(annMsg)},
		{"node: add the startup taint NoExecute", f.patchNode(cs, B, "", taints(nil, corev1.Taint{Key: startupTaintKey, Value: "true", Effect: corev1.TaintEffectNoExecute})), deny(effectMsg)},
		{"node: add the startup taint PreferNoSchedule", f.patchNode(cs, B, "", taints(nil, corev1.Taint{Key: startupTaintKey, Value: "true", Effect: corev1.TaintEffectPreferNoSchedule})), deny(effectMsg)},
		{"node: turn the startup taint NoExecute", f.patchNode(cs, A, "", taints(hasKey(startupTaintKey), corev1.Taint{Key: startupTaintKey, Value: "true", Effect: corev1.TaintEffectNoExecute})), deny(effectMsg)},
		{"node: add another taint", f.patchNode(cs, B, "", taints(nil, corev1.Taint{Key: "example.com/evil", Effect: corev1.TaintEffectNoExecute})), deny(taintMsg)},
		{"node: remove another taint", f.patchNode(cs, A, "", taints(hasKey(f.otherTaint.Key))), deny(taintMsg)},
		{"node: uncordon", f.patchNode(cs, A, "", static(map[string]any{"spec": map[string]any{"unschedulable": nil}})), deny(specMsg)},
		{"node: cordon", f.patchNode(cs, B, "", static(map[string]any{"spec": map[string]any{"unschedulable": true}})), deny(specMsg)},
		{"node: providerID", f.patchNode(cs, B, "", static(map[string]any{"spec": map[string]any{"providerID": "evil://x"}})), deny(specMsg)},
		{"node: finalizer", f.patchNode(cs, B, "", static(map[string]any{"metadata": map[string]any{"finalizers": []string{"example.com/keep"}}})), deny("owners or finalizers")},
		{"node: status", f.patchNode(cs, B, "status", static(map[string]any{"status": map[string]any{"capacity": map[string]any{"example.com/gpu": "8"}}})),
			"cannot patch resource"},
	}
}

// controllerPodWrites: with pod patch granted (the label overlay), adding
// cni-uninitialized=true passes and every other change is denied by its
// policy; elsewhere RBAC denies them all.
func (f *policyFixture) controllerPodWrites(cs kubernetes.Interface, overlay string) []writeCase {
	need := func(string) string { return "" }
	deny := func(msg string) string { return msg }
	if overlay != "label" {
		need = func(string) string { return "cannot patch resource" }
		deny = need
	}
	const labelMsg = "may only add the label consul.hashicorp.com/cni-uninitialized=true"
	return []writeCase{
		{"pod: add cni-uninitialized=true", f.patchPod(cs, f.onA, labelsPatch(annotations.LabelUninitialized, annotations.LabelUninitializedValue)), need("")},
		{"pod: add cni-uninitialized=false", f.patchPod(cs, f.onA, labelsPatch(annotations.LabelUninitialized, "false")), deny(labelMsg)},
		{"pod: remove cni-uninitialized", f.patchPod(cs, f.labelled, labelsPatch(annotations.LabelUninitialized, nil)), deny(labelMsg)},
		{"pod: another label", f.patchPod(cs, f.onA, labelsPatch("example.com/evil", "x")), deny(labelMsg)},
		{"pod: change a label", f.patchPod(cs, f.onA, labelsPatch("app", "evil")), deny(labelMsg)},
		{"pod: remove a label", f.patchPod(cs, f.onA, labelsPatch("app", nil)), deny(labelMsg)},
		{"pod: the label and another", f.patchPod(cs, f.onA, labelsPatch(annotations.LabelUninitialized, "true", "app", "evil")), deny(labelMsg)},
		{"pod: the label and an annotation", f.patchPod(cs, f.onA, map[string]any{"metadata": map[string]any{
			"labels":      map[string]any{annotations.LabelUninitialized: "true"},
			"annotations": map[string]any{annotations.KeyTransparentProxyStatus: annotations.TProxyStatusComplete},
		}}), deny("may not change a pod's annotations")},
		{"pod: image", f.patchPod(cs, f.onA, map[string]any{"spec": map[string]any{"containers": []any{
			map[string]any{"name": "app", "image": "registry.example/evil:1"}}}}), deny("may not change a pod's spec")},
		{"pod: finalizer", f.patchPod(cs, f.onA, map[string]any{"metadata": map[string]any{"finalizers": []string{"example.com/keep"}}}),
			deny("owners or finalizers")},
	}
}

// deletePod deletes a pod as cs (dry run), with its UID as a precondition.
func (f *policyFixture) deletePod(cs kubernetes.Interface, pod string) func(context.Context) error {
	return func(ctx context.Context) error {
		p, err := f.c.Client.CoreV1().Pods(f.podNS).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return cs.CoreV1().Pods(f.podNS).Delete(ctx, pod, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll},
			Preconditions: &metav1.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion}})
	}
}

// evictPod evicts a pod as cs (dry run), with UID and resourceVersion
// preconditions as the controller sends them, or without.
func (f *policyFixture) evictPod(cs kubernetes.Interface, pod string, preconditions bool) func(context.Context) error {
	return func(ctx context.Context) error {
		p, err := f.c.Client.CoreV1().Pods(f.podNS).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		opts := &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
		if preconditions {
			opts.Preconditions = &metav1.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion}
		}
		return cs.PolicyV1().Evictions(f.podNS).Evict(ctx, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: f.podNS}, DeleteOptions: opts})
	}
}

// controllerPodDeletes: with pod delete granted (the delete overlay) only
// injected transparent-proxy pods may be deleted; with eviction granted
// (the base, evict) an eviction must carry the UID and resourceVersion
// preconditions. Admission of pods/eviction sees the Eviction, not the pod,
// and the eviction's own deletion of the pod is not admitted as a DELETE,
// so a plain pod's eviction with preconditions passes: the limit the API
// sets on this policy (documented with it).
func (f *policyFixture) controllerPodDeletes(cs kubernetes.Interface, overlay string) []writeCase {
	const (
		deleteMsg = "may delete only injected transparent-proxy pods"
		evictMsg  = "may evict a pod only with its UID and resourceVersion as preconditions"
		noDelete  = "cannot delete resource"
		noEvict   = "cannot create resource \"pods/eviction\""
	)
	del, delPlain := noDelete, noDelete
	if overlay == "delete" {
		del, delPlain = "", deleteMsg
	}
	ev, evBare := noEvict, noEvict
	if overlay == "base" {
		ev, evBare = "", evictMsg
	}
	return []writeCase{
		{"pod: delete an injected pod", f.deletePod(cs, f.onA), del},
		{"pod: delete a plain pod", f.deletePod(cs, f.plain), delPlain},
		{"pod: evict an injected pod", f.evictPod(cs, f.onA, true), ev},
		{"pod: evict without preconditions", f.evictPod(cs, f.onA, false), evBare},
		{"pod: evict a plain pod (the pod is not visible to admission of an eviction)", f.evictPod(cs, f.plain, true), ev},
	}
}

// pluginWrites: the plugin's identity, with the node its token names
// (extra) or none, may set the status annotation of pods on its node only.
func (f *policyFixture) pluginWrites(onA, noNode kubernetes.Interface) []writeCase {
	status := annotationsPatch(annotations.KeyTransparentProxyStatus, annotations.TProxyStatusComplete)
	const nodeMsg = "consul-cni may update only pods on its own node"
	return []writeCase{
		{"plugin: status on its node", f.patchPod(onA, f.onA, status), ""},
		{"plugin: status on another node", f.patchPod(onA, f.onB, status), nodeMsg},
		{"plugin: status with a token naming no node", f.patchPod(noNode, f.onA, status), nodeMsg},
		{"plugin: label", f.patchPod(onA, f.onA, labelsPatch("app", "evil")), "may not change a pod's labels"},
		{"plugin: another annotation", f.patchPod(onA, f.onA, annotationsPatch("example.com/evil", "x")), "may change only the annotation"},
	}
}

// patchStatus strategic-merge-patches the status of a pod (node "" ) or of
// a node (pod "") as cs, dry run: conditions merge by type, as the verifier
// writes them.
func (f *policyFixture) patchStatus(cs kubernetes.Interface, pod, node string, body any) func(context.Context) error {
	return func(ctx context.Context) error {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		if pod != "" {
			_, err = cs.CoreV1().Pods(f.podNS).Patch(ctx, pod, types.StrategicMergePatchType, b, dryRun, "status")
		} else {
			_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, b, dryRun, "status")
		}
		return err
	}
}

func conditionPatch(typ string, status corev1.ConditionStatus) map[string]any {
	return map[string]any{"status": map[string]any{"conditions": []map[string]any{{"type": typ, "status": status, "reason": "Test"}}}}
}

// verifierWrites: the node verifier's two conditions on its own node pass;
// anything else of a status, or elsewhere, is denied.
func (f *policyFixture) verifierWrites(onA, noNode kubernetes.Interface) []writeCase {
	podCond := conditionPatch(annotations.ConditionRedirectVerified, corev1.ConditionFalse)
	nodeCond := conditionPatch(annotations.NodeConditionCNIVerified, corev1.ConditionTrue)
	const nodeMsg = "the verifier may write only the status of its own node"
	return []writeCase{
		{"verifier: pod condition on its node", f.patchStatus(onA, f.onA, "", podCond), ""},
		{"verifier: Node condition of its node", f.patchStatus(onA, "", f.nodeA, nodeCond), ""},
		{"verifier: pod condition on another node", f.patchStatus(onA, f.onB, "", podCond), nodeMsg},
		{"verifier: Node condition of another node", f.patchStatus(onA, "", f.nodeB, nodeCond), nodeMsg},
		{"verifier: pod condition with a token naming no node", f.patchStatus(noNode, f.onA, "", podCond), nodeMsg},
		{"verifier: pod Ready", f.patchStatus(onA, f.onA, "", conditionPatch(string(corev1.PodReady), corev1.ConditionTrue)), "may change only the condition"},
		{"verifier: Node NetworkUnavailable", f.patchStatus(onA, "", f.nodeA, conditionPatch(string(corev1.NodeNetworkUnavailable), corev1.ConditionTrue)), "may change only the condition"},
		{"verifier: pod IP", f.patchStatus(onA, f.onA, "", map[string]any{"status": map[string]any{"podIP": "10.9.9.9", "podIPs": []map[string]string{{"ip": "10.9.9.9"}}}}), "only its condition of a pod's status"},
		{"verifier: Node capacity", f.patchStatus(onA, "", f.nodeA, map[string]any{"status": map[string]any{"capacity": map[string]string{"pods": "1000"}}}), "only its condition of a Node's status"},
		{"verifier: pod annotation", f.patchPod(onA, f.onA, annotationsPatch("example.com/evil", "x")), "cannot patch"},
	}
}

// applyPolicies applies (for real) every admission policy and binding of
// a build.
func applyPolicies(t *testing.T, a *applier, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, name := range admissionPolicyNames {
		for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
			if _, err := a.apply(context.Background(), find(t, objs, kind, name), false); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func deletePolicies(c *cluster.Cluster) {
	ctx := context.Background()
	for _, name := range admissionPolicyNames {
		_ = c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	}
}

// TestAdmissionPoliciesImpersonated installs each overlay (RBAC and
// admission policies, for real), in the default namespace and, through a
// kustomize namespace: override, in another one, and proves as each
// identity (impersonated, with the extras its token carries) that every
// change it needs passes and every other change is denied, by the policy
// where RBAC would allow it. The admin is not affected.
func TestAdmissionPoliciesImpersonated(t *testing.T) {
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	f := newPolicyFixture(t, c)
	t.Cleanup(func() {
		deletePolicies(c)
		_ = c.Client.CoreV1().Namespaces().Delete(context.Background(), otherNamespace, metav1.DeleteOptions{})
	})
	for _, ns := range []string{namespace, otherNamespace} {
		for _, ov := range overlayNames() {
			t.Run(ns+"/"+ov, func(t *testing.T) {
				objs := buildOverlay(t, ov)
				if ns != namespace {
					objs = buildInNamespace(t, ov, ns)
				}
				applyRBAC(t, a, objs)
				applyPolicies(t, a, objs)
				ctrlUser, ctrlGroups := serviceAccountUser(ns, controllerName)
				asController, err := kubernetes.NewForConfig(c.ConfigFor(ctrlUser, ctrlGroups...))
				if err != nil {
					t.Fatal(err)
				}
				instUser, instGroups := serviceAccountUser(ns, installerName)
				onA := c.ConfigFor(instUser, instGroups...)
				onA.Impersonate.Extra = map[string][]string{nodeNameExtra: {f.nodeA}}
				asPluginOnA, err := kubernetes.NewForConfig(onA)
				if err != nil {
					t.Fatal(err)
				}
				asPluginNoNode, err := kubernetes.NewForConfig(c.ConfigFor(instUser, instGroups...))
				if err != nil {
					t.Fatal(err)
				}
				cases := f.controllerNodeWrites(asController, ov)
				cases = append(cases, f.controllerPodWrites(asController, ov)...)
				cases = append(cases, f.controllerPodDeletes(asController, ov)...)
				cases = append(cases, f.pluginWrites(asPluginOnA, asPluginNoNode)...)
				verUser, verGroups := serviceAccountUser(ns, verifierName)
				verOnA := c.ConfigFor(verUser, verGroups...)
				verOnA.Impersonate.Extra = map[string][]string{nodeNameExtra: {f.nodeA}}
				asVerifierOnA, err := kubernetes.NewForConfig(verOnA)
				if err != nil {
					t.Fatal(err)
				}
				asVerifierNoNode, err := kubernetes.NewForConfig(c.ConfigFor(verUser, verGroups...))
				if err != nil {
					t.Fatal(err)
				}
				cases = append(cases, f.verifierWrites(asVerifierOnA, asVerifierNoNode)...)
				cases = append(cases, writeCase{"admin: a label", f.patchPod(c.Client, f.onA, labelsPatch("example.com/x", "y")), ""})
				// RBAC and policy changes take effect within moments.
				poll.Eventually(t, 90*time.Second, "every write decided as expected", func() error { return runWrites(ctx, cases) })
			})
		}
	}
	for _, name := range admissionPolicyNames {
		vap, err := c.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if tc := vap.Status.TypeChecking; tc != nil && len(tc.ExpressionWarnings) > 0 {
			t.Errorf("%s: type-checking warnings: %+v", name, tc.ExpressionWarnings)
		}
	}
}
