//go:build integration

package manifests

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// TestRepairOnlyBesideConsulK8sCNI: the repair-only overlay with a stand-in
// for consul-k8s's CNI DaemonSet (namespace consul, labels app=consul,
// component=cni, an installer that chains the plugin with consul-k8s's
// entry keys and a kubeconfig with an embedded token). Injected pods that
// started before the stand-in chained the plugin are all replaced once the
// controller has labelled the node, and their replacements are redirected.
func TestRepairOnlyBesideConsulK8sCNI(t *testing.T) {
	repairBin := repairBinary(t)
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	r := testnet.Reserve(t)
	plugin := testbin.Project(t, "consul-cni")
	node := simnode.StartForTest(t, c, r, func(cfg *simnode.Config) { cfg.Programs["repair"] = repairBin })

	standInRBAC(t, c)
	for _, o := range build(t, filepath.Join(manifestsDir(t), "overlays", "repair-only")) {
		if gvkOf(o).Group == monitoringGroup {
			continue
		}
		if o.GetKind() == "Deployment" { // pods count as broken 5 s after their sandbox exists
			addContainerArgs(t, o, "--min-pod-age=5s")
		}
		if _, err := a.apply(ctx, o, false); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { deleteWorkloads(t, c) })

	// Injected pods start while the node's chain lacks the plugin.
	ns := c.Namespace(t)
	const replicas = 2
	createInjectedWeb(t, c, ns, node.Name(), replicas)
	bypassed := map[string]bool{}
	poll.Eventually(t, 3*time.Minute, "injected pods running without the plugin", func() error {
		l, err := webOutsideMesh(ctx, c, ns)
		if err != nil {
			return err
		}
		for _, p := range l {
			bypassed[string(p.UID)] = true
		}
		if len(bypassed) < int(replicas) {
			return fmt.Errorf("%d of %d running outside the mesh", len(bypassed), replicas)
		}
		return nil
	})

	startStandIn(t, c, node, plugin)
	poll.Eventually(t, 3*time.Minute, "node labelled by the controller from consul-k8s's CNI pod", func() error {
		return nodeCNIReady(ctx, c.Client, node.Name())
	})
	poll.Eventually(t, 5*time.Minute, "every bypassing pod replaced by a redirected one", func() error {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		complete := 0
		for _, p := range l.Items {
			if bypassed[string(p.UID)] {
				return fmt.Errorf("pod %s (bypassing) still there", p.Name)
			}
			if p.DeletionTimestamp == nil && annotations.IsComplete(p.Annotations[annotations.KeyTransparentProxyStatus]) {
				complete++
			}
		}
		if complete < int(replicas) {
			return fmt.Errorf("%d of %d replacements redirected", complete, replicas)
		}
		return nil
	})
}

const standInNS, standInName = "consul", "consul-cni"

// standInRBAC: consul-k8s's CNI ServiceAccount, allowed what its plugin does.
func standInRBAC(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: standInNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().ServiceAccounts(standInNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: standInName}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	role := "consul-k8s-cni-stand-in"
	if _, err := c.Client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch"}}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: standInNS, Name: standInName}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Client.AppsV1().DaemonSets(standInNS).Delete(context.Background(), standInName, metav1.DeleteOptions{})
		_ = c.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
		_ = c.Client.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
}

// startStandIn runs the consul-k8s CNI DaemonSet stand-in on node, with the
// labels consul-k8s's chart gives it; Ready once its kubeconfig is written.
func startStandIn(t *testing.T, c *cluster.Cluster, node *simnode.Node, plugin string) {
	t.Helper()
	labels := map[string]string{"app": "consul", "component": "cni"}
	dir := corev1.HostPathDirectoryOrCreate
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: standInName, Namespace: standInNS, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
				ServiceAccountName: standInName,
				HostNetwork:        true,
				NodeSelector:       map[string]string{"kubernetes.io/hostname": node.Name()},
				Tolerations:        []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
				Containers: []corev1.Container{{
					Name: "install-cni", Image: "registry.example/podprog:1",
					Args: []string{"install-cni", "--bin-dir=/host/opt/cni/bin", "--net-dir=/host/etc/cni/net.d", "--plugin=" + plugin},
					ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
						Command: []string{"podprog", "exists", "/host/etc/cni/net.d/" + cniconf.ConsulK8sKubeconfigFileName}}}},
					VolumeMounts: []corev1.VolumeMount{{Name: "bin", MountPath: "/host/opt/cni/bin"}, {Name: "net", MountPath: "/host/etc/cni/net.d"}},
				}},
				Volumes: []corev1.Volume{
					{Name: "bin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/opt/cni/bin", Type: &dir}}},
					{Name: "net", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc/cni/net.d", Type: &dir}}},
				},
			}},
		},
	}
	if _, err := c.Client.AppsV1().DaemonSets(standInNS).Create(context.Background(), ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
