//go:build integration

package plugin

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/cluster"
)

func TestMain(m *testing.M) { cluster.Main(m) }

// TestRESTClientAgainstAPIServer: the plugin's REST client reads a pod and
// merge-patches its status on a real API server; the UID in the patch is a
// precondition, so a patch meant for a pod that was replaced by another of
// the same name is refused.
func TestRESTClientAgainstAPIServer(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cluster.WriteKubeconfig(kc, c.Config, "admin"); err != nil {
		t.Fatal(err)
	}
	rc, err := loadKubeconfig(kc, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	created, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"},
			Annotations: map[string]string{annotations.KeyTransparentProxyStatus: "enabled", "keep": "me"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := rc.GetPod(ctx, ns, "web")
	if err != nil {
		t.Fatal(err)
	}
	if pod.UID != string(created.UID) || pod.Labels["app"] != "web" || pod.Annotations["keep"] != "me" {
		t.Fatalf("%+v", pod)
	}
	if err := rc.PatchPod(ctx, ns, "web", statusPatch(pod.UID, annotations.TProxyStatusComplete)); err != nil {
		t.Fatal(err)
	}
	err = rc.PatchPod(ctx, ns, "web", statusPatch("00000000-0000-0000-0000-000000000000", annotations.TProxyStatusWaiting))
	if err == nil {
		t.Fatal("patch with another pod's UID accepted")
	}
	t.Logf("patch with a wrong UID: %v (retriable %v)", err, retriable(err))
	if retriable(err) {
		t.Fatal("a failed precondition must not be retried")
	}
	got, err := c.Client.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[annotations.KeyTransparentProxyStatus] != annotations.TProxyStatusComplete || got.Annotations["keep"] != "me" {
		t.Fatalf("annotations %v", got.Annotations)
	}
	if _, err := rc.GetPod(ctx, ns, "gone"); !IsNotFound(err) {
		t.Fatalf("missing pod: %v", err)
	}
}
