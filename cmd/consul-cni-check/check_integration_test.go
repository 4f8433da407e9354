//go:build integration

package main_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

func TestMain(m *testing.M) { cluster.Main(m) }

// checkPod creates an injected pod object (nothing runs it) whose service
// account token the check authenticates with.
func checkPod(t *testing.T, c *cluster.Cluster, ns string, canGetPods bool) (*corev1.Pod, string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if canGetPods {
		if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "get-pods"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "get-pods"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "get-pods"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "web", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Annotations: map[string]string{
			annotations.KeyInjectStatus:           annotations.InjectStatusInjected,
			annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
		}},
		Spec: corev1.PodSpec{ServiceAccountName: "web", NodeName: "no-such-node",
			Containers: []corev1.Container{{Name: "web", Image: "web"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := c.ServiceAccountToken(ctx, ns, "web", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokFile := filepath.Join(dir, "token")
	os.WriteFile(tokFile, []byte(tok), 0o600)
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerTokenFile = tokFile
	kc := filepath.Join(dir, "kubeconfig")
	if err := cluster.WriteKubeconfig(kc, cfg, "web"); err != nil {
		t.Fatal(err)
	}
	return p, kc
}

func runCheck(t *testing.T, kc string, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(testbin.Project(t, "consul-cni-check"), args...)
	cmd.Env = append(os.Environ(), append([]string{"KUBECONFIG=" + kc}, env...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String()
	case err != nil:
		t.Fatal(err)
	}
	return 0, out.String()
}

func patchStatus(t *testing.T, c *cluster.Cluster, ns, status string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, annotations.KeyTransparentProxyStatus, status)
	if _, err := c.Client.CoreV1().Pods(ns).Patch(context.Background(), "web-0", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// API mode with a real token of the pod's service account: the check sees
// the plugin's patch as soon as it is made.
func TestCheckAPIMode(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	_, kc := checkPod(t, c, ns, true)
	env := []string{"POD_NAME=web-0", "POD_NAMESPACE=" + ns}
	tl := filepath.Join(t.TempDir(), "termination-log")

	// Still enabled: exit 88.
	code, out := runCheck(t, kc, env, "--annotations-file=", "--api=true", "--timeout=2s", "--interval=200ms", "--termination-log", tl)
	if code != annotations.InitCheckExitCode {
		t.Fatalf("exit %d, want %d\n%s", code, annotations.InitCheckExitCode, out)
	}
	if b, _ := os.ReadFile(tl); !strings.Contains(string(b), `"enabled"`) {
		t.Errorf("termination message %q", b)
	}

	// The plugin marks the pod while the check waits.
	go func() {
		time.Sleep(2 * time.Second)
		patchStatus(t, c, ns, annotations.TProxyStatusComplete)
	}()
	code, out = runCheck(t, kc, env, "--annotations-file=", "--api=true", "--timeout=2m", "--interval=200ms", "--termination-log", tl)
	if code != 0 {
		t.Fatalf("exit %d after the status became complete\n%s", code, out)
	}
}

// A service account that may not get pods: API mode turns itself off, the
// downward-API file decides; without the file the check cannot judge (exit
// 1, never 88).
func TestCheckAPIForbidden(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	_, kc := checkPod(t, c, ns, false)
	env := []string{"POD_NAME=web-0", "POD_NAMESPACE=" + ns}
	dir := t.TempDir()
	ann := filepath.Join(dir, "annotations")
	write := func(status string) {
		tmp := ann + ".tmp"
		os.WriteFile(tmp, []byte(fmt.Sprintf("%s=%q", annotations.KeyTransparentProxyStatus, status)), 0o644)
		os.Rename(tmp, ann)
	}
	write("enabled")
	go func() { time.Sleep(2 * time.Second); write("complete") }()

	code, out := runCheck(t, kc, env, "--annotations-file", ann, "--timeout=60s", "--interval=200ms", "--termination-log", filepath.Join(dir, "tl"))
	if code != 0 {
		t.Fatalf("exit %d with a complete file and a forbidden API\n%s", code, out)
	}
	if !strings.Contains(out, "forbidden") {
		t.Errorf("the check did not report the API refusal:\n%s", out)
	}
	code, out = runCheck(t, kc, env, "--annotations-file=", "--api=true", "--timeout=30s", "--termination-log", filepath.Join(dir, "tl"))
	if code != 1 {
		t.Fatalf("exit %d with only a forbidden API, want 1\n%s", code, out)
	}
}
