//go:build integration

package plugin

import (
	"bytes"
	"context"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables/iptablestest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/nftables/nftablestest"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
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
	if _, err := rc.GetPod(ctx, ns, "gone"); !isNotFound(err) {
		t.Fatalf("missing pod: %v", err)
	}
}

// TestAddStrandedNodeAgainstAPIServer: the plugin is chained with
// credentials the real API server refuses (the installer was deleted
// without uninstall). kube-system pods still start (excluded before any API
// call), an injected pod fails closed with a message saying why, and once
// the kubeconfig is gone altogether (uninstalled) pods pass through.
func TestAddStrandedNodeAgainstAPIServer(t *testing.T) {
	c := cluster.Shared(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected},
			Annotations: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected,
				annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
				annotations.KeyRedirectTrafficConfig:  `{"ProxyUserID":"5995","ProxyInboundPort":20000}`}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca := c.Config.TLSClientConfig.CAData
	if len(ca) == 0 {
		var err error
		if ca, err = os.ReadFile(c.Config.TLSClientConfig.CAFile); err != nil {
			t.Fatal(err)
		}
	}
	// As the installer writes it, with the token of a pod that no longer exists.
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: " + c.Config.Host +
		"\n    certificate-authority-data: " + base64.StdEncoding.EncodeToString(ca) +
		"\n    tls-server-name: \"" + c.Config.TLSClientConfig.ServerName + "\"" +
		"\ncontexts:\n- name: c\n  context: {cluster: local, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user:\n    tokenFile: token\n"
	if err := os.WriteFile(filepath.Join(dir, "kc"), []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("eyJhbGciOiJSUzI1NiJ9.e30.c3RhbGU"), 0o600); err != nil {
		t.Fatal(err)
	}
	fake := &iptablestest.Fake{}
	var stdout, stderr bytes.Buffer
	p := &Plugin{NewClient: NewKubeClient, Stdout: &stdout, Stderr: &stderr, RetryBase: time.Millisecond, Nftables: &nftablestest.Fake{},
		NewExecutor: func(context.Context, *Config, string, *slog.Logger) (iptables.Executor, error) { return fake, nil }}
	stdin := []byte(`{"cniVersion":"1.1.0","name":"n","type":"consul-cni","cni_net_dir":"` + dir + `","kubeconfig":"kc",` +
		`"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0"}],"ips":[{"address":"10.0.0.2/24","interface":0}]}}`)
	add := func(ns, name string) error {
		stdout.Reset()
		return p.Add(&skel.CmdArgs{ContainerID: "c0ffee", Netns: "/var/run/netns/x", IfName: "eth0", StdinData: stdin,
			Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=" + ns + ";K8S_POD_NAME=" + name})
	}
	if err := add("kube-system", "coredns-1"); err != nil || !strings.Contains(stdout.String(), "10.0.0.2/24") {
		t.Fatalf("kube-system pod on a stranded node: %v (stdout %s)", err, stdout.String())
	}
	err := add(ns, "web")
	if err == nil || !strings.Contains(err.Error(), "credentials were refused") || !strings.Contains(err.Error(), "401") {
		t.Fatalf("injected pod with refused credentials: %v", err)
	}
	if len(fake.Calls) != 0 {
		t.Fatalf("iptables touched: %v", fake.Calls)
	}
	if err := os.Remove(filepath.Join(dir, "kc")); err != nil {
		t.Fatal(err)
	}
	if err := add(ns, "web"); err != nil || !strings.Contains(stdout.String(), "10.0.0.2/24") {
		t.Fatalf("pod on a node whose plugin is uninstalled: %v", err)
	}
	got, err := c.Client.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s := got.Annotations[annotations.KeyTransparentProxyStatus]; s != annotations.TProxyStatusEnabled {
		t.Fatalf("status %q changed", s)
	}
}
