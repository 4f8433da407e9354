//go:build integration

package manifests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/consulk8s"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// consul-k8s's CNI DaemonSet as its chart makes it for release "consul" in
// namespace "consul" (charts/consul/templates/cni-*.yaml).
const (
	consulK8sNS       = "consul"
	consulK8sDS       = "consul-cni"
	consulK8sSelector = "app=consul,component=cni"
	// consulK8sImage is the control-plane image the DaemonSet runs; a
	// simulated node runs consul-k8s's real install-cni for it
	// (consulK8sPrograms).
	consulK8sImage = "hashicorp/consul-k8s-control-plane:1.9.0"
)

// consulK8sProgram is what a simulated node runs for consul-k8s's image
// (its Programs entry "consul-k8s-control-plane"): consul-k8s's real
// install-cni (consulk8s.ExecInPod), from the binaries of Unpack.
func consulK8sProgram(t *testing.T) string {
	t.Helper()
	return testbin.Package(t, "consulk8spod", "./tests/cmd/consulk8spod")
}

// consulK8sRBAC makes consul-k8s's CNI ServiceAccount with the rights of
// its chart's ClusterRole (its plugin gets the pod and updates it).
func consulK8sRBAC(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: consulK8sNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().ServiceAccounts(consulK8sNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: consulK8sDS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	role := "consul-k8s-cni"
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch", "update"}}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: consulK8sNS, Name: consulK8sDS}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.AppsV1().DaemonSets(consulK8sNS).Delete(context.Background(), consulK8sDS, metav1.DeleteOptions{})
		_ = c.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
		_ = c.Client.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
}

// startConsulK8sCNI creates consul-k8s's CNI DaemonSet as its chart does
// (labels, tolerations, the install-cni container's command, POD_UID,
// hostPath volumes, no readiness probe: its pod is Ready once it runs),
// pinned to node; its container runs consul-k8s's real install-cni.
// KUBERNETES_SERVICE_HOST and _PORT name the kubernetes Service's address,
// as kubelet sets them: consul-k8s's installer writes them into the
// kubeconfig its plugin uses in the node's network namespace, where the
// test's own address of the apiserver is not reachable.
func startConsulK8sCNI(t *testing.T, c *cluster.Cluster, node *simnode.Node, bins consulk8s.Binaries) {
	t.Helper()
	u, err := url.Parse(node.KubernetesService())
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "consul", "chart": "consul-helm", "release": "consul", "component": "cni"}
	env := []corev1.EnvVar{
		{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
		{Name: "KUBERNETES_SERVICE_HOST", Value: u.Hostname()},
		{Name: "KUBERNETES_SERVICE_PORT", Value: u.Port()},
	}
	for k, v := range bins.PodEnv() {
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	dir := corev1.HostPathDirectoryOrCreate
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: consulK8sDS, Namespace: consulK8sNS, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{"consul.hashicorp.com/connect-inject": "false"}},
				Spec: corev1.PodSpec{
					ServiceAccountName:            consulK8sDS,
					NodeSelector:                  map[string]string{"kubernetes.io/hostname": node.Name()},
					Tolerations:                   []corev1.Toleration{{Key: "CriticalAddonsOnly", Operator: corev1.TolerationOpExists}, {Effect: corev1.TaintEffectNoExecute, Operator: corev1.TolerationOpExists}},
					TerminationGracePeriodSeconds: ptr(int64(100)),
					Containers: []corev1.Container{{
						Name: "install-cni", Image: consulK8sImage,
						SecurityContext: &corev1.SecurityContext{Privileged: ptr(true)},
						Env:             env,
						Command: []string{"consul-k8s-control-plane", "install-cni", "-log-level=info",
							"-cni-bin-dir=/opt/cni/bin", "-cni-net-dir=/etc/cni/net.d", "-multus=false", "-installation-id=$(POD_UID)"},
						VolumeMounts: []corev1.VolumeMount{{Name: "cni-bin-dir", MountPath: "/opt/cni/bin"}, {Name: "cni-net-dir", MountPath: "/etc/cni/net.d"}},
					}},
					Volumes: []corev1.Volume{
						{Name: "cni-bin-dir", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/opt/cni/bin", Type: &dir}}},
						{Name: "cni-net-dir", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/cni/net.d", Type: &dir}}},
					},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().DaemonSets(consulK8sNS).Create(context.Background(), ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// consulK8sChained tells whether consul-k8s's installer has chained its
// entry on node: the last plugin of the network is consul-cni naming a
// kubeconfig of consul-k8s's installation, and that file is there.
func consulK8sChained(node *simnode.Node) error {
	var l struct {
		Plugins []struct{ Type, Kubeconfig string }
	}
	b, err := os.ReadFile(filepath.Join(node.ConfDir(), simnode.PrimaryNetworkFile))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &l); err != nil || len(l.Plugins) == 0 {
		return fmt.Errorf("network list: %v", err)
	}
	last := l.Plugins[len(l.Plugins)-1]
	if last.Type != cniconf.PluginType || !strings.HasPrefix(last.Kubeconfig, consulk8s.KubeconfigPrefix) {
		return fmt.Errorf("last plugin %s (kubeconfig %q), not consul-k8s's entry", last.Type, last.Kubeconfig)
	}
	_, err = os.Stat(filepath.Join(node.ConfDir(), last.Kubeconfig))
	return err
}
