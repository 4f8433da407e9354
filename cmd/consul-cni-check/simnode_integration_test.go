//go:build integration

package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

const redirectConfig = `{"ConsulDNSIP":"","ConsulDNSPort":0,"ProxyUserID":"5995","ProxyInboundPort":20000,` +
	`"ProxyOutboundPort":15001,"ExcludeInboundPorts":null,"ExcludeOutboundPorts":null,` +
	`"ExcludeOutboundCIDRs":null,"ExcludeUIDs":["5996"],"NetNS":"","IptablesProvider":null}`

// injectedPod is a pod as consul-k8s's webhook leaves it, with the check as
// its first init container, bound to a node directly.
func injectedPod(name, node string, probe string, timeout time.Duration) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{annotations.KeyInjectStatus: annotations.InjectStatusInjected},
			Annotations: map[string]string{
				annotations.KeyInjectStatus:           annotations.InjectStatusInjected,
				annotations.KeyTransparentProxyStatus: annotations.TProxyStatusEnabled,
				annotations.KeyRedirectTrafficConfig:  redirectConfig,
				annotations.KeyDualStack:              "false",
			}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			InitContainers: []corev1.Container{{
				Name:  annotations.CheckContainerName,
				Image: "ghcr.io/consul-cni-repair/consul-cni-check",
				Args: []string{"--annotations-file=/consul/podinfo/annotations", "--timeout=" + timeout.String(),
					"--interval=500ms", "--probe", "--probe-address=" + probe, "--termination-log=/dev/termination-log"},
				Env: []corev1.EnvVar{
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
					{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
				},
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To(int64(5997)), RunAsGroup: ptr.To(int64(5997))},
				VolumeMounts:    []corev1.VolumeMount{{Name: "consul-podinfo", MountPath: "/consul/podinfo", ReadOnly: true}},
			}},
			Containers: []corev1.Container{{Name: "web", Image: "registry.example/web:1.0"}},
			Volumes: []corev1.Volume{{Name: "consul-podinfo", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
				Items: []corev1.DownwardAPIVolumeFile{{Path: "annotations", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations"}}},
			}}}},
		},
	}
}

// checkState returns the check container's latest termination, if any.
func checkState(p *corev1.Pod) *corev1.ContainerStateTerminated {
	for _, s := range p.Status.InitContainerStatuses {
		if s.Name != annotations.CheckContainerName {
			continue
		}
		if s.State.Terminated != nil {
			return s.State.Terminated
		}
		return s.LastTerminationState.Terminated
	}
	return nil
}

// The check runs for real on simulated nodes, as an init container with a
// downward-API volume, unprivileged: on a node where the installer chained
// consul-cni it passes (status complete, probe redirected) and the pod
// starts; on a node without the plugin it fails with 88 and says why, which
// is what the repair controller's signal B reads.
func TestCheckOnSimulatedNodes(t *testing.T) {
	c := cluster.Shared(t)
	r := testnet.Reserve(t)
	ext := r.NewExternal(t)
	ns := c.Namespace(t)
	ctx := context.Background()
	check := testbin.Project(t, "consul-cni-check")
	plugin := testbin.Project(t, "consul-cni")
	mod := func(cfg *simnode.Config) { cfg.Programs["consul-cni-check"] = check }
	bare := simnode.StartForTest(t, c, r, mod)
	chained := simnode.StartForTest(t, c, r, mod)

	// The plugin's identity: what the installer ClusterRole grants, here in
	// the test namespace.
	if _, err := c.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "consul-cni"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "consul-cni"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "consul-cni"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "consul-cni", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := c.ServiceAccountToken(ctx, ns, "consul-cni", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokFile, []byte(tok), 0o600)
	src, err := credentials.FromREST(&rest.Config{Host: chained.APIServer(), BearerTokenFile: tokFile,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CAData, ServerName: "127.0.0.1"}}) // the node proxies the apiserver, whose certificate names 127.0.0.1
	if err != nil {
		t.Fatal(err)
	}
	in, err := install.New(install.Config{BinDir: chained.BinDir(), NetDir: chained.ConfDir(),
		HostBinDir: chained.BinDir(), HostNetDir: chained.ConfDir(), PluginBinary: plugin, Client: &src})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if err := in.VerifyInstalled(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = in.Uninstall(context.Background()) })

	probe := netip4(ext.V4, 15002)
	for _, p := range []*corev1.Pod{injectedPod("meshed", chained.Name(), probe, 2*time.Minute), injectedPod("bypassed", bare.Name(), probe, 10*time.Second)} {
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	var last string
	deadline := time.Now().Add(4 * time.Minute)
	for {
		meshed, err1 := c.Client.CoreV1().Pods(ns).Get(ctx, "meshed", metav1.GetOptions{})
		bypassed, err2 := c.Client.CoreV1().Pods(ns).Get(ctx, "bypassed", metav1.GetOptions{})
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		m, b := checkState(meshed), checkState(bypassed)
		last = fmt.Sprintf("meshed: phase %s check %+v; bypassed: phase %s check %+v", meshed.Status.Phase, m, bypassed.Status.Phase, b)
		if m != nil && m.ExitCode != 0 {
			t.Fatalf("the check failed on the chained node: %s", last)
		}
		if b != nil && b.ExitCode == 0 {
			t.Fatalf("the check passed on the node without the plugin: %s", last)
		}
		if m != nil && b != nil && meshed.Status.Phase == corev1.PodRunning {
			if meshed.Annotations[annotations.KeyTransparentProxyStatus] != annotations.TProxyStatusComplete {
				t.Errorf("meshed pod status %q", meshed.Annotations[annotations.KeyTransparentProxyStatus])
			}
			if b.ExitCode != annotations.InitCheckExitCode {
				t.Fatalf("check on the node without the plugin exited %d, want %d: %s", b.ExitCode, annotations.InitCheckExitCode, last)
			}
			if !strings.Contains(b.Message, `"enabled"`) || !strings.Contains(b.Message, "without the consul-cni plugin") {
				t.Errorf("termination message %q", b.Message)
			}
			if bypassed.Status.Phase != corev1.PodPending {
				t.Errorf("the bypassed pod is %s, want Pending (its main container must not start)", bypassed.Status.Phase)
			}
			t.Logf("%s", last)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func netip4(a interface{ String() string }, port int) string {
	return fmt.Sprintf("%s:%d", a.String(), port)
}
