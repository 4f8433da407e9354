//go:build integration

package repair_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair/judge"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// TestMain registers klog's flags (go test ... -args -v=4) and runs the
// tests on the shared local control plane.
func TestMain(m *testing.M) {
	klog.InitFlags(nil)
	cluster.Main(m)
}

const waitTimeout = 2 * time.Minute

// manifestsDir is the kustomize tree the project ships.
func manifestsDir() string { return filepath.Join(testbin.RepoRoot(), "manifests") }

// rbacDocs returns the controller's RBAC exactly as manifests/base ships it:
// controller/rbac.yaml (ServiceAccount, read/Events/nodes ClusterRole, lease
// Role) and controller/action.yaml (the action's ClusterRole, evict).
func rbacDocs(t testing.TB) []byte {
	t.Helper()
	var out []byte
	for _, f := range []string{"rbac.yaml", "action.yaml"} {
		b, err := os.ReadFile(filepath.Join(manifestsDir(), "base", "controller", f))
		if err != nil {
			t.Fatal(err)
		}
		out = append(append(out, b...), []byte("\n---\n")...)
	}
	return out
}

// overlayActionRules reads the rules that manifests/overlays/<overlay>
// puts into the ClusterRole consul-cni-repair-action (a JSON patch
// replacing /rules).
func overlayActionRules(t testing.TB, overlay string) []rbacv1.PolicyRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(manifestsDir(), "overlays", overlay, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Patches []struct {
			Target struct{ Kind, Name string }
			Patch  string
		}
	}
	mustUnmarshal(t, b, &k)
	for _, p := range k.Patches {
		if p.Target.Kind != "ClusterRole" || p.Target.Name != "consul-cni-repair-action" {
			continue
		}
		var ops []struct {
			Op, Path string
			Value    []rbacv1.PolicyRule
		}
		mustUnmarshal(t, []byte(p.Patch), &ops)
		for _, op := range ops {
			if op.Op == "replace" && op.Path == "/rules" {
				return op.Value
			}
		}
	}
	t.Fatalf("overlay %s does not set the action's rules", overlay)
	return nil
}

// controllerConfig installs the controller's RBAC from the manifests (the
// action's rules from the overlay of that name) with its ServiceAccount in ns
// (cluster-scoped names get a suffix) and returns a client configuration
// holding that ServiceAccount's real token: the controller runs with exactly
// these permissions and nothing else.
func controllerConfig(t testing.TB, c *cluster.Cluster, ns string, action judge.Action) *rest.Config {
	t.Helper()
	ctx := context.Background()
	data := rbacDocs(t)
	suffix := "-" + ns
	dec := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var saName string
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil || meta.Kind == "" {
			continue
		}
		switch meta.Kind {
		case "ServiceAccount":
			var o corev1.ServiceAccount
			mustUnmarshal(t, doc, &o)
			o.Namespace = ns
			saName = o.Name
			_, err = c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &o, metav1.CreateOptions{})
		case "ClusterRole":
			var o rbacv1.ClusterRole
			mustUnmarshal(t, doc, &o)
			if o.Name == "consul-cni-repair-action" && action != judge.ActionEvict {
				o.Rules = overlayActionRules(t, string(action))
			}
			o.Name += suffix
			_, err = c.Client.RbacV1().ClusterRoles().Create(ctx, &o, metav1.CreateOptions{})
			name := o.Name
			t.Cleanup(func() {
				_ = c.Client.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
			})
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			mustUnmarshal(t, doc, &o)
			o.Name += suffix
			o.RoleRef.Name += suffix
			for i := range o.Subjects {
				o.Subjects[i].Namespace = ns
			}
			_, err = c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
			name := o.Name
			t.Cleanup(func() {
				_ = c.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
			})
		case "Role":
			var o rbacv1.Role
			mustUnmarshal(t, doc, &o)
			o.Namespace = ns
			_, err = c.Client.RbacV1().Roles(ns).Create(ctx, &o, metav1.CreateOptions{})
		case "RoleBinding":
			var o rbacv1.RoleBinding
			mustUnmarshal(t, doc, &o)
			o.Namespace = ns
			for i := range o.Subjects {
				o.Subjects[i].Namespace = ns
			}
			_, err = c.Client.RbacV1().RoleBindings(ns).Create(ctx, &o, metav1.CreateOptions{})
		default:
			continue
		}
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("install %s: %v", meta.Kind, err)
		}
	}
	if saName == "" {
		t.Fatal("RBAC has no ServiceAccount")
	}
	cfg := rest.CopyConfig(c.ServiceAccountConfig(t, ns, saName))
	cfg.QPS, cfg.Burst = 200, 400
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	return cfg
}

func mustUnmarshal(t testing.TB, doc []byte, into interface{}) {
	t.Helper()
	if err := yaml.Unmarshal(doc, into); err != nil {
		t.Fatal(err)
	}
}

// running is a controller manager run in this process for one test.
type running struct {
	m      *repair.Manager
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// stop cancels the manager and waits for Run to return (once).
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("controller: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("controller did not stop within a minute of its shutdown")
		}
	})
}

// startController runs a manager as the ServiceAccount of ns (its lease and
// CNI namespace), with settings made for tests (short ages and back-off).
func startController(t testing.TB, c *cluster.Cluster, ns string, mutate func(*repair.ManagerConfig)) *running {
	t.Helper()
	return startControllerWrapped(t, c, ns, mutate, nil)
}

// startControllerWrapped is startController with wrap (when not nil) around
// the controller's API transport, to see every request it makes.
func startControllerWrapped(t testing.TB, c *cluster.Cluster, ns string, mutate func(*repair.ManagerConfig), wrap transport.WrapperFunc) *running {
	t.Helper()
	cfg := repair.DefaultManagerConfig()
	cfg.LeaseNamespace = ns
	cfg.CNINamespace = ns
	// Tests share one control plane: each controller watches only its own
	// test's injected pods.
	cfg.InjectedPodSelector += "," + testLabel + "=" + ns
	cfg.NodeReadiness = false
	cfg.MinPodAge = time.Second
	cfg.BackoffBase, cfg.BackoffMax = 200*time.Millisecond, 2*time.Second
	cfg.MetricsAddr, cfg.HealthAddr = "0", "0"
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	if mutate != nil {
		mutate(&cfg)
	}
	rc := controllerConfig(t, c, ns, cfg.Action)
	if wrap != nil {
		rc.Wrap(wrap)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	m, err := repair.NewManager(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{m: m, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- m.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	poll.Eventually(t, waitTimeout, "controller caches synced", func() (bool, error) { return m.Informers.HasSynced(), nil })
	return r
}

// createNode creates a Node object in the API server (no kubelet: the tests play its part).
func createNode(t testing.TB, c *cluster.Cluster, ready bool, taints ...corev1.Taint) string {
	t.Helper()
	name := fmt.Sprintf("node-%d", time.Now().UnixNano())
	labels := map[string]string{"kubernetes.io/hostname": name}
	if ready {
		labels[annotations.LabelCNIReady] = annotations.LabelCNIReadyValue
	}
	_, err := c.Client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: taints},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return name
}

// testLabel marks the pods of one test (its namespace).
const testLabel = "repair-test"

// injectedPodTemplate is what the consul-k8s webhook leaves on a pod, bound to node.
func injectedPodTemplate(ns, app, node string) corev1.PodTemplateSpec {
	zero := int64(0)
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{
			Labels: map[string]string{"app": app, testLabel: ns, annotations.KeyInjectStatus: annotations.InjectStatusInjected},
			Annotations: map[string]string{
				annotations.KeyInjectStatus:           annotations.InjectStatusInjected,
				annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
			},
		},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: &zero,
			// The node has no kubelet: once kube-controller-manager finds it
			// unreachable, its NoExecute taint must not evict test pods.
			Tolerations:    []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			InitContainers: []corev1.Container{{Name: annotations.InitContainerName, Image: "registry.invalid/consul-k8s-control-plane:1"}},
			Containers:     []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}},
		},
	}
}

// markBroken plays kubelet: the sandbox exists (IP, PodReadyToStartContainers)
// and the check init container exited with 88 (signal B).
func markBroken(t testing.TB, client kubernetes.Interface, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	return markBrokenSince(t, client, pod, metav1.Now())
}

// markBrokenSince is markBroken with the sandbox dated sandbox (the kubelet's
// PodReadyToStartContainers transition), in the same write, so the
// controller never sees the pod broken with another date.
func markBrokenSince(t testing.TB, client kubernetes.Interface, pod *corev1.Pod, sandbox metav1.Time) *corev1.Pod {
	t.Helper()
	now := metav1.Now()
	p, err := client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{
		Phase:     corev1.PodPending,
		PodIP:     "198.18.0.10",
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: sandbox},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		InitContainerStatuses: []corev1.ContainerStatus{{
			Name: annotations.InitContainerName, Image: p.Spec.InitContainers[0].Image, RestartCount: 1,
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 88, StartedAt: now, FinishedAt: now, Reason: "Error"}},
		}},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "app", Image: p.Spec.Containers[0].Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}},
		}},
	}
	out, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("mark %s broken: %v", p.Name, err)
	}
	return out
}

// markRunningReady plays kubelet for a pod that runs and is Ready; with its
// status still "enabled" it is broken by signal A once --min-pod-age passed.
func markRunningReady(t testing.TB, client kubernetes.Interface, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	now := metav1.Now()
	p, err := client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		PodIP:     "198.18.0.11",
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		InitContainerStatuses: []corev1.ContainerStatus{{
			Name: annotations.InitContainerName, Image: p.Spec.InitContainers[0].Image, Ready: true,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, StartedAt: now, FinishedAt: now, Reason: "Completed"}},
		}},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "app", Image: p.Spec.Containers[0].Image, Ready: true, Started: ptr(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	out, err := client.CoreV1().Pods(p.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("mark %s running: %v", p.Name, err)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// events returns the Events of reason about the object with uid.
func events(t testing.TB, client kubernetes.Interface, ns string, uid types.UID, reason string) []corev1.Event {
	t.Helper()
	sel := fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.uid", string(uid)), fields.OneTermEqualSelector("reason", reason))
	l, err := client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: sel.String()})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func eventCount(evs []corev1.Event) int32 {
	var n int32
	for _, e := range evs {
		n += max(e.Count, 1)
	}
	return n
}

func podsOf(t testing.TB, client kubernetes.Interface, ns, app string) []corev1.Pod {
	t.Helper()
	l, err := client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}
