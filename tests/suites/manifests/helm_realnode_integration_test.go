//go:build integration

package manifests

import (
	"context"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/chart/v2/loader"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
)

// TestHelmOnRealNodes installs the chart with the helm command, as a user
// would, on two real nodes (kubelet, containerd, runc) that registered
// with the startup taint and hold the project's images: the values name
// those images with pullPolicy Never. The installer runs on every node and
// chains consul-cni last, the controller's replicas run and one leads,
// labels and untaints every node, and an injected pod on each node is
// marked complete by the plugin. Then `helm uninstall`, whose pre-delete
// hook runs `consul-cni-installer uninstall-all`: every node is clean, the
// controller lifted its label and taint before it went, and every node
// still starts a plain pod.
func TestHelmOnRealNodes(t *testing.T) {
	requireProjectCommands(t)
	c := cluster.Shared(t)
	a := newApplier(t, c)
	helm := newHelmCLI(t, c.Kubeconfig)
	ns := privilegedNamespace(t, c)
	nodes, imgs, app := startRealNodes(t, c, 2, manifestImageTag(t, buildOverlay(t, "base")))

	// No Prometheus Operator in the local control plane; the controller
	// acts (the chart's default is audit mode, which labels no node).
	profiles := []string{"without-prometheus-operator.yaml", "evict.yaml"}
	set := imageValues(t, imgs)
	vals := chartValues(t, profiles, set...)
	rendered := renderChartIn(t, ns, vals)
	removeClusterScoped(t, a, rendered) // left by the kustomize tests of this binary
	t.Cleanup(func() { removeClusterScoped(t, a, rendered) })

	args := []string{"install", "ccr", chartDir(t), "-n", ns, "--wait", "--timeout", "8m"}
	for _, p := range profiles {
		args = append(args, "-f", filepath.Join(chartDir(t), "profiles", p))
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	start := time.Now()
	helm.run(t, args...)
	helmDone := time.Since(start)
	holder := waitRealNodesReady(t, c, ns, nodes)
	ready := time.Since(start)
	assertNodeImages(t, c, ns, imgs)
	ch, err := loader.Load(chartDir(t))
	if err != nil {
		t.Fatal(err)
	}
	checkRelease(t, helm.list(t, ns), "1", ch.Metadata.Name+"-"+ch.Metadata.Version, ch.Metadata.AppVersion)
	appNS := c.Namespace(t)
	for _, n := range nodes {
		injectedPodComplete(t, c, appNS, n.Name, app)
	}
	t.Logf("helm install (%v) -> installers Ready with consul-cni last on %d real nodes, nodes labelled and untainted, %s leading: %v (helm install --wait returned after %v); injected pods complete after %v",
		set, len(nodes), holder, ready.Round(100*time.Millisecond), helmDone.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond))

	var dirs []cniNode
	for _, n := range nodes {
		dirs = append(dirs, realDirs{n})
	}
	helmTook, gone := uninstallRelease(t, helm, c, a, ns, vals, dirs...)
	// The controller lifts label and taint from each node whose installer
	// became a remover, before Helm deletes it.
	for _, n := range nodes {
		poll.Eventually(t, time.Minute, "node "+n.Name+" without label and startup taint", func() error {
			return nodeClean(context.Background(), c.Client, n.Name)
		})
	}
	t.Logf("helm uninstall -> every node clean, without label and taint: %v (helm uninstall returned after %v)",
		gone.Round(100*time.Millisecond), helmTook.Round(100*time.Millisecond))
	for _, n := range nodes {
		servePodRuns(t, c, appNS, n.Name, app)
	}
}

// imageValues are --set assignments that point the chart's controller and
// installer images at imgs (which the nodes hold) with pullPolicy Never.
func imageValues(t *testing.T, imgs []realnode.Image) []string {
	t.Helper()
	var set []string
	for _, v := range []struct{ key, name string }{{"controller", "repair"}, {"installer", "consul-cni-installer"}, {"verifier", "consul-cni-installer"}} {
		ref := ""
		for _, img := range imgs {
			if i := strings.LastIndex(img.Ref, ":"); i > 0 && path.Base(img.Ref[:i]) == v.name {
				ref = img.Ref
			}
		}
		i := strings.LastIndex(ref, ":")
		if i <= 0 {
			t.Fatalf("no image %s among %+v", v.name, imgs)
		}
		set = append(set, v.key+".image.repository="+ref[:i], v.key+".image.tag="+ref[i+1:], v.key+".image.pullPolicy=Never")
	}
	return set
}

// assertNodeImages: every container of the release's pods in ns runs one
// of imgs with pullPolicy Never.
func assertNodeImages(t *testing.T, c *cluster.Cluster, ns string, imgs []realnode.Image) {
	t.Helper()
	refs := map[string]bool{}
	for _, img := range imgs {
		refs[img.Ref] = true
	}
	l, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Items {
		for _, ctr := range p.Spec.Containers {
			if !refs[ctr.Image] || ctr.ImagePullPolicy != corev1.PullNever {
				t.Errorf("pod %s container %s: image %s pullPolicy %s, want one of the nodes' images with Never", p.Name, ctr.Name, ctr.Image, ctr.ImagePullPolicy)
			}
		}
	}
	if len(l.Items) == 0 {
		t.Errorf("no pods in %s", ns)
	}
}
