//go:build integration

package manifests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// realDirs is a real node as a cniNode.
type realDirs struct{ n *realnode.Node }

func (r realDirs) Name() string    { return r.n.Name }
func (r realDirs) ConfDir() string { return r.n.ConfDir() }
func (r realDirs) BinDir() string  { return r.n.CNIBinDir() }

// TestManifestsOnRealNodes applies the base as a user would on two real
// nodes (kubelet, containerd, runc) that registered with the startup
// taint, with the project's images (built for this machine, tagged as the
// manifests name them) imported: the installer DaemonSet runs from its
// image on every node and chains consul-cni into the node's conflist
// (through its hostPaths), the controller's replicas run from theirs, one
// leads and labels and untaints every node, and an injected pod on each
// node gets its redirection from the plugin, which marks it complete. Then
// the removal of docs/operate.md: the uninstall overlay's removers clean every node,
// the label and taint go, the overlay is deleted, and every node still
// starts a plain pod.
func TestManifestsOnRealNodes(t *testing.T) {
	requireProjectCommands(t)
	c := cluster.Shared(t)
	a := newApplier(t, c)
	objs := buildOverlay(t, "base")
	nodes, imgs, app := startRealNodes(t, c, 2, manifestImageTag(t, objs))

	applyAll(t, a, objs, nil)
	t.Cleanup(func() { deleteWorkloads(t, c) })
	holder := waitRealNodesReady(t, c, namespace, nodes)
	ns := c.Namespace(t)
	for _, n := range nodes {
		injectedPodComplete(t, c, ns, n.Name, app)
	}
	verifiedOnRealNodes(t, c, ns, nodes)
	t.Logf("node images %v; installers Ready, consul-cni chained, nodes labelled by the leader %s; injected pods complete and verified",
		realnode.Archives(imgs...), holder)

	removeOnRealNodes(t, c, a, nodes)
	for _, n := range nodes {
		servePodRuns(t, c, ns, n.Name, app)
	}
}

// requireProjectCommands skips when a command of the project's images is
// not in this tree.
func requireProjectCommands(t *testing.T) {
	t.Helper()
	for _, cmd := range realnode.ProjectCommands {
		if _, err := os.Stat(filepath.Join(testbin.RepoRoot(), "cmd", cmd)); err != nil {
			t.Skipf("cmd/%s is not in this tree", cmd)
		}
	}
}

// startRealNodes starts count real nodes that register with the startup
// taint and hold the project's images tagged tag and the test program's
// image app.
func startRealNodes(t *testing.T, c *cluster.Cluster, count int, tag string) (nodes []*realnode.Node, imgs []realnode.Image, app realnode.Image) {
	t.Helper()
	r := testnet.Reserve(t)
	imgs = realnode.ProjectImages(t, tag)
	app = realnode.ProgramImage(t, "podprog")
	for i := 0; i < count; i++ {
		nodes = append(nodes, realnode.StartForTest(t, c, r, realnode.Options{
			Taints: []corev1.Taint{{Key: annotations.TaintCNINotReady, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
			Images: realnode.Archives(append(imgs, app)...),
		}))
	}
	return nodes, imgs, app
}

// waitRealNodesReady waits until the installer pod of ns is Ready on every
// node with consul-cni last in the node's conflist, both controller
// replicas are Ready, and the leader labelled every node cni=ready and
// lifted its startup taint; it returns the Lease's holder.
func waitRealNodesReady(t *testing.T, c *cluster.Cluster, ns string, nodes []*realnode.Node) string {
	t.Helper()
	ctx := context.Background()
	for _, n := range nodes {
		poll.Eventually(t, 4*time.Minute, "installer pod Ready on "+n.Name, func() error {
			return podsReady(ctx, c, ns, "app.kubernetes.io/name="+installerName, n.Name, 1)
		})
		if last := lastPlugin(t, n); last != cniconf.PluginType {
			t.Fatalf("node %s: last plugin of its conflist %q, want %s", n.Name, last, cniconf.PluginType)
		}
	}
	poll.Eventually(t, 4*time.Minute, "controller replicas Ready", func() error {
		return podsReady(ctx, c, ns, "app.kubernetes.io/name="+controllerName, "", 2)
	})
	for _, n := range nodes {
		poll.Eventually(t, 2*time.Minute, "node "+n.Name+" labelled cni=ready without its startup taint", func() error {
			return nodeCNIReady(ctx, c.Client, n.Name)
		})
	}
	lease, err := c.Client.CoordinationV1().Leases(ns).Get(ctx, controllerName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Fatalf("leader Lease: %v %+v", err, lease)
	}
	return *lease.Spec.HolderIdentity
}

// removeOnRealNodes follows TestRemoveOnSimulatedNodes: the controller
// stops, the startup taint comes back, the uninstall overlay is applied
// (the controller last), every remover is Ready with nothing of ours left
// on its node, the nodes lose label and taint, and the overlay is deleted.
func removeOnRealNodes(t *testing.T, c *cluster.Cluster, a *applier, nodes []*realnode.Node) {
	t.Helper()
	ctx := context.Background()
	scaleController(t, c, 0)
	for _, n := range nodes {
		taintNode(t, c.Client, n.Name)
	}
	removal := build(t, filepath.Join(manifestsDir(t), "overlays", "uninstall"))
	applyAll(t, a, removal, func(k string) bool { return k == "Deployment" })
	for _, n := range nodes {
		poll.Eventually(t, 4*time.Minute, "remover Ready on "+n.Name, func() error {
			return podsReady(ctx, c, namespace, annotations.LabelInstallerMode+"="+annotations.InstallerModeUninstall, n.Name, 1)
		})
		assertNothingOfOurs(t, realDirs{n})
	}
	applyAll(t, a, removal, func(k string) bool { return k != "Deployment" })
	for _, n := range nodes {
		poll.Eventually(t, 3*time.Minute, "node "+n.Name+" without label and startup taint", func() error {
			return nodeClean(ctx, c.Client, n.Name)
		})
	}
	deleteWorkloads(t, c)
	poll.Eventually(t, 2*time.Minute, "workload pods gone", func() error {
		l, err := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d pods left", len(l.Items))
		}
		return nil
	})
	for _, n := range nodes {
		assertNothingOfOurs(t, realDirs{n})
	}
}

// manifestImageTag is the tag of the installer image the build names.
func manifestImageTag(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	var ds appsv1.DaemonSet
	decodeStrict(t, find(t, objs, "DaemonSet", installerName), &ds)
	img := ds.Spec.Template.Spec.Containers[0].Image
	i := strings.LastIndex(img, ":")
	if i < 0 || strings.Contains(img[i:], "/") {
		t.Fatalf("installer image %q has no tag", img)
	}
	return img[i+1:]
}

// lastPlugin is the type of the last plugin of the node's conflist.
func lastPlugin(t *testing.T, n *realnode.Node) string {
	t.Helper()
	b, err := n.ConfList()
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &list); err != nil || len(list.Plugins) == 0 {
		t.Fatalf("node %s conflist %s: %v", n.Name, b, err)
	}
	return list.Plugins[len(list.Plugins)-1].Type
}

// injectedPodComplete makes an injected pod that requires the readiness
// label on node and waits until it runs and the plugin marked it complete.
func injectedPodComplete(t *testing.T, c *cluster.Cluster, ns, node string, img realnode.Image) {
	t.Helper()
	ctx := context.Background()
	meta := injectedMeta(map[string]string{"app": "web"})
	meta.Name = "web-" + node
	meta.Annotations[annotations.KeyRedirectTrafficConfig] = `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeUIDs":["5996"]}`
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: meta,
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{annotations.LabelCNIReady: annotations.LabelCNIReadyValue, "kubernetes.io/hostname": node},
			Containers: []corev1.Container{{Name: "web", Image: img.Ref, ImagePullPolicy: corev1.PullNever,
				Args: []string{"serve", "--listen", ":8080", "--reply", "web"}}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 3*time.Minute, "injected pod "+meta.Name+" running and marked complete by the plugin", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, meta.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s := p.Annotations[annotations.KeyTransparentProxyStatus]; !annotations.IsComplete(s) || p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("transparent-proxy-status %q, phase %s, node %q", s, p.Status.Phase, p.Spec.NodeName)
		}
		return nil
	})
}

// verifiedOnRealNodes: the verifier pod is Ready on every node, it found
// the injected pod of injectedPodComplete on each node with its rules (pod
// condition RedirectVerified True, RulesInPlace) and wrote the node's
// condition CNIVerified True (chain ends with consul-cni, every injected pod
// verified).
func verifiedOnRealNodes(t *testing.T, c *cluster.Cluster, podNS string, nodes []*realnode.Node) {
	t.Helper()
	ctx := context.Background()
	for _, n := range nodes {
		poll.Eventually(t, 3*time.Minute, "verifier pod Ready on "+n.Name, func() error {
			return podsReady(ctx, c, namespace, "app.kubernetes.io/name="+verifierName, n.Name, 1)
		})
		name := "web-" + n.Name
		poll.Eventually(t, time.Minute, "pod "+name+" verified with its rules", func() error {
			p, err := c.Client.CoreV1().Pods(podNS).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range p.Status.Conditions {
				if string(cond.Type) == annotations.ConditionRedirectVerified {
					if cond.Status != corev1.ConditionTrue || cond.Reason != annotations.ReasonRulesInPlace {
						return fmt.Errorf("condition %s %s: %s", cond.Status, cond.Reason, cond.Message)
					}
					return nil
				}
			}
			return fmt.Errorf("no condition %s", annotations.ConditionRedirectVerified)
		})
		poll.Eventually(t, time.Minute, "node "+n.Name+" condition "+annotations.NodeConditionCNIVerified+" True", func() error {
			node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range node.Status.Conditions {
				if string(cond.Type) == annotations.NodeConditionCNIVerified {
					if cond.Status != corev1.ConditionTrue || cond.Reason != annotations.ReasonNodeVerified {
						return fmt.Errorf("condition %s %s: %s", cond.Status, cond.Reason, cond.Message)
					}
					return nil
				}
			}
			return fmt.Errorf("no condition %s", annotations.NodeConditionCNIVerified)
		})
	}
}

// servePodRuns: a plain pod (no annotation) on a real node, serving with
// the test image, runs with an address.
func servePodRuns(t *testing.T, c *cluster.Cluster, ns, node string, img realnode.Image) {
	t.Helper()
	podRuns(t, c, ns, node, corev1.Container{Name: "app", Image: img.Ref, ImagePullPolicy: corev1.PullNever,
		Args: []string{"serve", "--listen", ":8080", "--reply", "plain"}})
}
