//go:build integration

package audit

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
)

func TestMain(m *testing.M) { cluster.Main(m) }

// createPod creates p in ns, owned by the ConfigMap owner (nothing manages
// it, and the garbage collector finds its owner), then writes its status.
func createPod(t testing.TB, cs kubernetes.Interface, ns string, owner *corev1.ConfigMap, p *corev1.Pod) {
	t.Helper()
	if err := tryCreatePod(cs, ns, owner, p); err != nil {
		t.Fatal(err)
	}
}

func tryCreatePod(cs kubernetes.Interface, ns string, owner *corev1.ConfigMap, p *corev1.Pod) error {
	ctx := context.Background()
	status := p.Status
	p.Namespace, p.UID = ns, ""
	p.CreationTimestamp = metav1.Time{}
	if p.DeletionTimestamp != nil {
		return fmt.Errorf("pod %s: a deleting pod cannot be created", p.Name)
	}
	if len(p.OwnerReferences) > 0 {
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID, Controller: &yes}}
	}
	p.Spec.Containers = []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}
	p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	created, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", p.Name, err)
	}
	created.Status = status
	if status.PodIP != "" {
		created.Status.PodIPs = []corev1.PodIP{{IP: status.PodIP}}
	}
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("pod %s status: %w", p.Name, err)
	}
	return nil
}

func createNode(t testing.TB, cs kubernetes.Interface, n *corev1.Node) {
	t.Helper()
	if _, err := cs.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), n.Name, metav1.DeleteOptions{}) })
}

// TestAuditOnCluster judges pods shaped like the detector's table cases on a
// real API server, as the read-only ClusterRole's user (impersonated), and
// checks that role allows nothing else.
func TestAuditOnCluster(t *testing.T) {
	c := cluster.Shared(t)
	ctx := context.Background()
	ns := c.Namespace(t)
	owner, err := c.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ready, notReady := readyNode(ns+"-ready"), notReadyNode(ns+"-notready")
	createNode(t, c.Client, ready)
	createNode(t, c.Client, notReady)
	for _, p := range []*corev1.Pod{
		injected("ok", ready.Name),
		injected("stuck", ready.Name, stuck),
		injected("initfail", ready.Name, initFailed),
		injected("recreated", ready.Name, recreated),
		injected("bare", ready.Name, stuck, bare),
		injected("done", ready.Name, succeeded),
		injected("waiting", notReady.Name, stuck),
	} {
		createPod(t, c.Client, ns, owner, p)
	}

	bindAuditRole(t, c.Client, "auditor")
	asAuditor, err := kubernetes.NewForConfig(c.ConfigFor("auditor"))
	if err != nil {
		t.Fatal(err)
	}
	var out, stderr bytes.Buffer
	code := Main(ctx, "repair audit", []string{"-n", ns, "--chunk-size=2", "-o", "json"}, &out, &stderr,
		func(*Options) (kubernetes.Interface, error) { return asAuditor, nil })
	if code != ExitOutside {
		t.Fatalf("exit %d, want %d; stderr %s", code, ExitOutside, stderr.String())
	}
	var r Report
	if err := yaml.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range r.Outside {
		got[p.Name] = string(p.Reason) + " / " + p.Action
		if p.Name != "bare" && p.Owner != "ConfigMap/owner" {
			t.Errorf("pod %s: owner %q", p.Name, p.Owner)
		}
	}
	want := map[string]string{
		"stuck":     "tproxy_status_stuck / evict",
		"initfail":  "init_check_failed / evict",
		"recreated": "sandbox_recreated / evict",
		"bare":      "tproxy_status_stuck / none: bare pod",
		"waiting":   "tproxy_status_stuck / wait: CNI not ready",
	}
	for name, w := range want {
		if !strings.HasPrefix(got[name], w) {
			t.Errorf("pod %s: %q, want %q...", name, got[name], w)
		}
	}
	if len(got) != len(want) || r.Examined != 7 {
		t.Errorf("examined %d, outside %v; want 7 examined and %d outside", r.Examined, got, len(want))
	}
	checkReadOnly(t, asAuditor, ns)

	// The table: a header and one row per pod outside the mesh, then the
	// pods the controller never judges (the Succeeded one).
	out.Reset()
	stderr.Reset()
	code = Main(ctx, "repair audit", []string{"-n", ns}, &out, &stderr,
		func(*Options) (kubernetes.Interface, error) { return asAuditor, nil })
	outside, notJudged, _ := strings.Cut(strings.TrimSpace(out.String()), "\n\n")
	if lines := strings.Split(outside, "\n"); code != ExitOutside || len(lines) != len(want)+1 {
		t.Errorf("table: exit %d, %d lines:\n%s", code, len(lines), out.String())
	}
	if lines := strings.Split(notJudged, "\n"); len(lines) != 3 || !strings.Contains(lines[2], "done") || !strings.Contains(lines[2], "pod succeeded") {
		t.Errorf("not-judged table: %q, want a title, a header and the Succeeded pod", notJudged)
	}
	t.Logf("repair audit -n %s\n%s%s", ns, out.String(), stderr.String())

	// Without the role: an error, exit 1.
	asNobody, err := kubernetes.NewForConfig(c.ConfigFor("nobody"))
	if err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	if code := Main(ctx, "repair audit", []string{"-n", ns}, &out, &stderr,
		func(*Options) (kubernetes.Interface, error) { return asNobody, nil }); code != ExitError || !strings.Contains(stderr.String(), "forbidden") {
		t.Errorf("without the role: exit %d, stderr %s", code, stderr.String())
	}
}

// bindAuditRole applies the shipped ClusterRole and binds user to it.
func bindAuditRole(t *testing.T, cs kubernetes.Interface, user string) {
	t.Helper()
	ctx := context.Background()
	b, err := os.ReadFile(filepath.Join("..", "..", "manifests", "audit-command", "clusterrole.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(b, &role); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "audit-" + user},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	// The authorizer follows RBAC changes within moments.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil || time.Now().After(deadline) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkReadOnly: the audit role may not write pods or nodes, nor read
// secrets.
func checkReadOnly(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	dry := []string{metav1.DryRunAll}
	for name, err := range map[string]error{
		"delete pod": cs.CoreV1().Pods(ns).Delete(ctx, "stuck", metav1.DeleteOptions{DryRun: dry}),
		"watch pods": func() error { _, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{}); return err }(),
		"list secrets": func() error {
			_, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
			return err
		}(),
		"patch node": func() error {
			_, err := cs.CoreV1().Nodes().Patch(ctx, "x", "application/merge-patch+json", []byte(`{}`), metav1.PatchOptions{DryRun: dry})
			return err
		}(),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as the audit role: %v, want Forbidden", name, err)
		}
	}
}
