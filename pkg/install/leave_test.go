package install

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
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
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "apps", Resource: "daemonsets"}, "consul-cni", errors.New("RBAC"))
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
			if err == nil || ownCredentialsRefused(err) != tc.refused {
				t.Fatalf("err %v, refused %v, want refused %v", err, ownCredentialsRefused(err), tc.refused)
			}
		})
	}
	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ccr", Name: "consul-cni-x"}}
	if _, err := APIDecider(fake.NewClientset(bare), "ccr", "consul-cni-x")(context.Background()); err == nil || !strings.Contains(err.Error(), "not run by a DaemonSet") {
		t.Fatalf("a pod without a DaemonSet: %v", err)
	}
}

// runAndStop runs the installer until its first pass, then cancels it
// (SIGTERM) and waits until Run returned.
func runAndStop(t *testing.T, in *Installer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	passed := make(chan struct{}, 1)
	done := make(chan error)
	go func() {
		done <- in.Run(ctx, func(PassResult, error) {
			select {
			case passed <- struct{}{}:
			default:
			}
		})
	}()
	<-passed
	if left, why := cniconf.ProductLeft(in.cfg.BinDir, time.Now().Add(cniconf.LeftAfter/2)); left {
		t.Errorf("a running installer's node taken for one the product left: %s", why)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// On SIGTERM the installer leaves (removes everything, entries first) only
// when the API says no installer pod will come back; staying and an API
// that cannot say keep everything, and the state file tells the plugin
// whether refused credentials may pass pods through.
func TestStopDecidesFromTheAPI(t *testing.T) {
	later := time.Now().Add(cniconf.LeftAfter + time.Second)
	for _, tc := range []struct {
		name     string
		decision Decision
		err      error
		removed  bool
		leftLate bool // ProductLeft once the heartbeat is LeftAfter old
	}{
		{"leaving", Decision{Leaving: true, Why: "DaemonSet ccr/consul-cni is gone"}, nil, true, false},
		{"staying", Decision{Why: "DaemonSet ccr/consul-cni still targets node n1"}, nil, false, false},
		{"API unavailable", Decision{}, apierrors.NewServiceUnavailable("etcd"), false, false},
		{"own credentials refused", Decision{}, apierrors.NewUnauthorized("token of a deleted ServiceAccount"), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newHostDirs(t)
			conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
			asked := 0
			in := n.installer(t, func(c *Config) {
				c.Decide = func(ctx context.Context) (Decision, error) {
					asked++
					if _, ok := ctx.Deadline(); !ok || ctx.Err() != nil {
						t.Errorf("decision without a live, bounded context: %v", ctx.Err())
					}
					return tc.decision, tc.err
				}
			})
			runAndStop(t, in)
			if asked != 1 {
				t.Fatalf("asked the API %d times", asked)
			}
			left, err := in.Leftovers()
			if err != nil {
				t.Fatal(err)
			}
			if tc.removed {
				if len(left) != 0 {
					t.Fatalf("left the node but kept %v", left)
				}
				return
			}
			if err := in.VerifyInstalled(); err != nil {
				t.Fatalf("kept the installation but it is broken: %v", err)
			}
			if got, why := cniconf.ProductLeft(n.bin, later); got != tc.leftLate {
				t.Fatalf("ProductLeft after LeftAfter = %v (%s), want %v", got, why, tc.leftLate)
			}
		})
	}
}
