//go:build integration

package manifests

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/consulk8s"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// TestRepairOnlyBesideConsulK8sCNI: the repair-only overlay beside
// consul-k8s's CNI DaemonSet (namespace consul, labels app=consul,
// component=cni, its chart's container) running consul-k8s's real
// install-cni, which chains consul-k8s's real consul-cni. Injected pods
// that started before it chained the plugin are all replaced once the
// controller has labelled the node, and their replacements are redirected
// by consul-k8s's plugin (status complete).
func TestRepairOnlyBesideConsulK8sCNI(t *testing.T) {
	repairBin := repairBinary(t)
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	r := testnet.Reserve(t)
	bins, installCNI := consulk8s.Unpack(t), consulK8sProgram(t)
	node := simnode.StartForTest(t, c, r, func(cfg *simnode.Config) {
		cfg.Programs["repair"] = repairBin
		cfg.Programs["consul-cni-verifier"] = testbin.Project(t, "consul-cni-verifier")
		cfg.Programs["consul-k8s-control-plane"] = installCNI
	})

	consulK8sRBAC(t, c)
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

	startConsulK8sCNI(t, c, node, bins)
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
