//go:build integration

package manifests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// TestRemoveOnSimulatedNodes follows the "Removing" section of docs/operate.md on two
// simulated nodes running the base: apply overlays/uninstall, wait
// for the DaemonSet's rollout (each remover Ready once its node is clean)
// and for the nodes to lose the readiness label and the startup taint (put
// back on both before, as --readd-startup-taint does), then delete the
// overlay. Afterwards no file of ours is left on any node and a new
// non-injected pod, scheduled through the taints, starts on every node.
func TestRemoveOnSimulatedNodes(t *testing.T) {
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	r := testnet.Reserve(t)
	testbin.Project(t, "consul-cni")
	programs := map[string]string{
		"consul-cni-installer": testbin.Project(t, "consul-cni-installer"),
		"consul-cni-verifier":  testbin.Project(t, "consul-cni-verifier"),
		"repair":               testbin.Project(t, "repair"),
	}
	var nodes []*simnode.Node
	for i := 0; i < 2; i++ {
		nodes = append(nodes, simnode.StartForTest(t, c, r, func(cfg *simnode.Config) {
			cfg.Taints = []corev1.Taint{{Key: annotations.TaintCNINotReady, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
			for k, v := range programs {
				cfg.Programs[k] = v
			}
		}))
	}
	applyAll(t, a, buildOverlay(t, "base"), nil)
	t.Cleanup(func() { deleteWorkloads(t, c) })
	for _, n := range nodes {
		poll.Eventually(t, 4*time.Minute, "node "+n.Name()+" labelled and untainted", func() error {
			return nodeCNIReady(ctx, c.Client, n.Name())
		})
	}

	// The controller stops; the startup taint comes back (as with
	// --readd-startup-taint after an outage), so only the removal can lift it.
	scaleController(t, c, 0)
	for _, n := range nodes {
		taintNode(t, c.Client, n.Name())
	}

	// Step 1: apply the uninstall overlay (the controller last, so that it
	// finds removers, not installers, on the nodes).
	removal := build(t, filepath.Join(manifestsDir(t), "overlays", "uninstall"))
	applyAll(t, a, removal, func(k string) bool { return k == "Deployment" })
	for _, n := range nodes {
		poll.Eventually(t, 4*time.Minute, "remover Ready on "+n.Name(), func() error {
			return podsReady(ctx, c, namespace, annotations.LabelInstallerMode+"="+annotations.InstallerModeUninstall, n.Name(), 1)
		})
		assertNothingOfOurs(t, n)
	}
	applyAll(t, a, removal, func(k string) bool { return k != "Deployment" })
	for _, n := range nodes {
		poll.Eventually(t, 3*time.Minute, "node "+n.Name()+" without label and startup taint", func() error {
			return nodeClean(ctx, c.Client, n.Name())
		})
	}

	// Step 2: delete it.
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

	ns := c.Namespace(t)
	for _, n := range nodes {
		assertNothingOfOurs(t, n)
		plainPodRuns(t, c, ns, n.Name())
	}
}

// plainPodRuns creates a pod without any annotation on node and waits
// until it runs with an address (on a simulated node).
func plainPodRuns(t *testing.T, c *cluster.Cluster, ns, node string) {
	t.Helper()
	podRuns(t, c, ns, node, corev1.Container{Name: "app", Image: "registry.example/app:1"})
}

// podRuns creates the pod "plain-<node>" of one container, without any
// annotation, on node and waits until it runs with an address.
func podRuns(t *testing.T, c *cluster.Cluster, ns, node string, container corev1.Container) {
	t.Helper()
	ctx := context.Background()
	name := "plain-" + node
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": node},
			Containers:   []corev1.Container{container},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 2*time.Minute, "pod "+name+" running", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return fmt.Errorf("phase %s, node %q, conditions %v, containers %v", p.Status.Phase, p.Spec.NodeName, p.Status.Conditions, p.Status.ContainerStatuses)
		}
		return nil
	})
}

// applyAll applies the build without the Prometheus Operator kinds and
// the kinds skip selects (nil: none).
func applyAll(t *testing.T, a *applier, objs []*unstructured.Unstructured, skip func(kind string) bool) {
	t.Helper()
	for _, o := range objs {
		if gvkOf(o).Group == monitoringGroup || (skip != nil && skip(o.GetKind())) {
			continue
		}
		if _, err := a.apply(context.Background(), o, false); err != nil {
			t.Fatal(err)
		}
	}
}

func scaleController(t *testing.T, c *cluster.Cluster, replicas int) {
	t.Helper()
	ctx := context.Background()
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := c.Client.AppsV1().Deployments(namespace).Patch(ctx, controllerName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 2*time.Minute, fmt.Sprintf("controller scaled to %d", replicas), func() error {
		l, err := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + controllerName})
		if err != nil {
			return err
		}
		if len(l.Items) != replicas {
			return fmt.Errorf("%d controller pods", len(l.Items))
		}
		return nil
	})
}

func taintNode(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: annotations.TaintCNINotReady, Value: "true", Effect: corev1.TaintEffectNoSchedule})
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func nodeClean(ctx context.Context, cs kubernetes.Interface, name string) error {
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if _, ok := n.Labels[annotations.LabelCNIReady]; ok {
		return fmt.Errorf("labels %v", n.Labels)
	}
	for _, tn := range n.Spec.Taints {
		if tn.Key == annotations.TaintCNINotReady {
			return fmt.Errorf("taints %v", n.Spec.Taints)
		}
	}
	return nil
}

// cniNode is a node's name and CNI directories (simulated or real).
type cniNode interface {
	Name() string
	ConfDir() string
	BinDir() string
}

// assertNothingOfOurs: no file of the installer's on the node, no entry in
// its conflist.
func assertNothingOfOurs(t *testing.T, n cniNode) {
	t.Helper()
	for _, f := range []string{filepath.Join(n.ConfDir(), cniconf.KubeconfigFileName), filepath.Join(n.ConfDir(), cniconf.TokenFileName),
		filepath.Join(n.ConfDir(), cniconf.OwnerFileName), filepath.Join(n.BinDir(), cniconf.StagedBinaryName),
		filepath.Join(n.BinDir(), cniconf.PluginType)} {
		if _, err := os.Lstat(f); err == nil {
			t.Errorf("node %s: %s left", n.Name(), f)
		}
	}
	ents, err := os.ReadDir(n.ConfDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(n.ConfDir(), e.Name()))
		if err != nil || e.IsDir() {
			continue
		}
		var list struct {
			Plugins []struct {
				Type string `json:"type"`
			} `json:"plugins"`
		}
		if json.Unmarshal(b, &list) != nil {
			continue
		}
		for _, p := range list.Plugins {
			if p.Type == cniconf.PluginType {
				t.Errorf("node %s: %s still chains %s", n.Name(), e.Name(), p.Type)
			}
		}
	}
}
