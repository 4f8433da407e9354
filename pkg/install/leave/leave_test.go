package leave

import (
	"context"
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// leaveWorld is an installer pod of DaemonSet ns/consul-cni on node n1,
// as the API holds them; edits change it before the decision.
func leaveWorld(edits ...func(ns *corev1.Namespace, ds *appsv1.DaemonSet, node *corev1.Node)) []runtime.Object {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ccr"}}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ccr", Name: "consul-cni", UID: "ds-uid"},
		Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			HostNetwork:  true,
			NodeSelector: map[string]string{"kubernetes.io/os": "linux"},
			Tolerations:  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		}}},
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"kubernetes.io/os": "linux", "pool": "a"}}}
	for _, e := range edits {
		e(ns, ds, node)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ccr", Name: "consul-cni-x", OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "consul-cni", UID: "ds-uid", Controller: ptrTo(true)}}},
		Spec: corev1.PodSpec{NodeName: "n1"},
	}
	objs := []runtime.Object{ns, node, pod}
	if ds.Name != "" {
		objs = append(objs, ds)
	}
	return objs
}

func ptrTo[T any](v T) *T { return &v }

func TestAPIDeciderTellsLeavingFromStaying(t *testing.T) {
	now := metav1.Now()
	noTolerations := func(_ *corev1.Namespace, ds *appsv1.DaemonSet, _ *corev1.Node) {
		ds.Spec.Template.Spec.Tolerations = nil
	}
	taint := func(key string, effect corev1.TaintEffect) func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node) {
		return func(_ *corev1.Namespace, _ *appsv1.DaemonSet, n *corev1.Node) {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Value: "x", Effect: effect})
		}
	}
	for _, tc := range []struct {
		name    string
		edits   []func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node)
		leaving bool
		why     string
	}{
		{"rolling update, restart, eviction: the DaemonSet still targets the node", nil, false, "still targets node n1"},
		{"DaemonSet deleted (kubectl delete, helm uninstall --no-hooks, installer switched off)",
			[]func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node){func(_ *corev1.Namespace, ds *appsv1.DaemonSet, _ *corev1.Node) { ds.Name = "" }},
			true, "is gone"},
		{"DaemonSet being deleted (foreground)",
			[]func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node){func(_ *corev1.Namespace, ds *appsv1.DaemonSet, _ *corev1.Node) {
				ds.DeletionTimestamp, ds.Finalizers = &now, []string{"foregroundDeletion"}
			}}, true, "is being deleted"},
		{"namespace being deleted",
			[]func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node){func(ns *corev1.Namespace, _ *appsv1.DaemonSet, _ *corev1.Node) {
				ns.DeletionTimestamp, ns.Finalizers = &now, []string{"kubernetes"}
			}}, true, "namespace ccr is being deleted"},
		{"nodeSelector narrowed",
			[]func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node){func(_ *corev1.Namespace, ds *appsv1.DaemonSet, _ *corev1.Node) {
				ds.Spec.Template.Spec.NodeSelector["pool"] = "b"
			}}, true, "does not select node n1"},
		{"node relabelled",
			[]func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node){func(_ *corev1.Namespace, _ *appsv1.DaemonSet, n *corev1.Node) {
				n.Labels["kubernetes.io/os"] = "windows"
			}}, true, "does not select node n1"},
		{"required node affinity excludes the node",
			[]func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node){func(_ *corev1.Namespace, ds *appsv1.DaemonSet, _ *corev1.Node) {
				ds.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"a"}}}}}}}}
			}}, true, "does not select node n1"},
		{"a NoSchedule taint the DaemonSet does not tolerate",
			[]func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node){noTolerations, taint("example.com/dedicated", corev1.TaintEffectNoSchedule)},
			true, "does not tolerate the taint example.com/dedicated=x:NoSchedule"},
		{"a PreferNoSchedule taint places pods anyway",
			[]func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node){noTolerations, taint("example.com/soft", corev1.TaintEffectPreferNoSchedule)},
			false, "still targets"},
		{"a cordoned node keeps its daemon pods (the controller's own tolerations)",
			[]func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node){noTolerations, taint(corev1.TaintNodeUnschedulable, corev1.TaintEffectNoSchedule),
				taint(corev1.TaintNodeNetworkUnavailable, corev1.TaintEffectNoSchedule)},
			false, "still targets"},
		{"every taint tolerated (the chart's default)",
			[]func(*corev1.Namespace, *appsv1.DaemonSet, *corev1.Node){taint("example.com/evict", corev1.TaintEffectNoExecute)},
			false, "still targets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(leaveWorld(tc.edits...)...)
			d, err := APIDecider(c, "ccr", "consul-cni-x")(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if d.Leaving != tc.leaving || !strings.Contains(d.Why, tc.why) {
				t.Fatalf("decision %+v, want leaving %v because %q", d, tc.leaving, tc.why)
			}
		})
	}
}

// An API that cannot answer decides nothing: the error is returned (the
// installer then keeps everything); refused credentials are told apart.
func TestAPIDeciderErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		react   func(k8stesting.Action) (bool, runtime.Object, error)
		refused bool
	}{
		{"own token refused", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewUnauthorized("the pod the token is bound to is gone")
		}, true},
		{"own RBAC gone", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetResource().Resource != "daemonsets" {
				return false, nil, nil
			}
			return true, nil, apierrors.NewForbidden(appsv1.Resource("daemonsets"), "consul-cni", errors.New("RBAC"))
		}, true},
		{"API unavailable", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetResource().Resource != "nodes" {
				return false, nil, nil
			}
			return true, nil, apierrors.NewServiceUnavailable("etcd")
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(leaveWorld()...)
			c.PrependReactor("get", "*", tc.react)
			_, err := APIDecider(c, "ccr", "consul-cni-x")(context.Background())
			if err == nil || CredentialsRefused(err) != tc.refused {
				t.Fatalf("err %v, refused %v, want refused %v", err, CredentialsRefused(err), tc.refused)
			}
		})
	}
	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ccr", Name: "consul-cni-x"}}
	if _, err := APIDecider(fake.NewClientset(bare), "ccr", "consul-cni-x")(context.Background()); err == nil || !strings.Contains(err.Error(), "not run by a DaemonSet") {
		t.Fatalf("a pod without a DaemonSet: %v", err)
	}
}
