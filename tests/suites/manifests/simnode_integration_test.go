//go:build integration

package manifests

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestApplyOnSimulatedNode is `kubectl apply -k manifests` (the base: the
// audit overlay marks no node ready) on
// a cluster with one simulated node that registered with the startup taint:
// the DaemonSet's pod runs the real installer (root, hostPath, its own
// pod-bound token), its exec readiness probe passes once consul-cni is last
// in the node's chain; the Deployment's two replicas run the real controller
// under their ServiceAccount, pass their HTTP probes, elect one leader, which
// labels the node and lifts the taint through its admission policy; an
// injected pod that selects the label is then scheduled there and gets its
// redirection from the plugin, which marks it complete through its
// admission policy. (The audit overlay leaves nodes as they are; the label
// overlay acts on no pod that got its redirection.)
func TestApplyOnSimulatedNode(t *testing.T) {
	for _, cmd := range []string{"repair", "consul-cni-installer", "consul-cni"} {
		if _, err := os.Stat(filepath.Join(testbin.RepoRoot(), "cmd", cmd)); err != nil {
			t.Skipf("cmd/%s is not in this tree", cmd)
		}
	}
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	r := testnet.Reserve(t)
	programs := simnode.ProjectPrograms(t) // what `make cluster` runs for the manifests' images
	node := simnode.StartForTest(t, c, r, func(cfg *simnode.Config) {
		cfg.Taints = []corev1.Taint{{Key: annotations.TaintCNINotReady, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
		for k, v := range programs {
			cfg.Programs[k] = v
		}
	})

	// Apply everything but the Prometheus Operator kinds, for real.
	objs := buildOverlay(t, "base")
	var applied []*unstructured.Unstructured
	for _, o := range objs {
		if gvkOf(o).Group == monitoringGroup {
			continue
		}
		if _, err := a.apply(ctx, o, false); err != nil {
			t.Fatal(err)
		}
		applied = append(applied, o)
	}
	t.Cleanup(func() { deleteWorkloads(t, c) })

	// The installer pod on the node becomes Ready: consul-cni is chained.
	poll.Eventually(t, 4*time.Minute, "installer pod Ready on "+node.Name(), func() error {
		return podsReady(ctx, c, namespace, "app.kubernetes.io/name="+installerName, node.Name(), 1)
	})
	conflist := filepath.Join(node.ConfDir(), "10-ptp.conflist")
	b, err := os.ReadFile(conflist)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatalf("%s: %v", conflist, err)
	}
	if n := len(list.Plugins); n == 0 || list.Plugins[n-1].Type != "consul-cni" {
		t.Fatalf("%s: plugins %+v, want consul-cni last", conflist, list.Plugins)
	}
	if _, err := os.Stat(filepath.Join(node.BinDir(), "consul-cni")); err != nil {
		t.Fatalf("plugin binary not installed: %v", err)
	}
	// The installer serves its metrics on the node's network, at the port
	// of its --metrics-bind-address (the PodMonitor's scrape address).
	var ds appsv1.DaemonSet
	decodeStrict(t, find(t, objs, "DaemonSet", installerName), &ds)
	_, port, err := net.SplitHostPort(oneFlag(t, ds.Spec.Template.Spec.Containers[0].Args, "metrics-bind-address"))
	if err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, time.Minute, "installer metrics on the node's port "+port, func() error {
		fams, err := scrapeVia(node.HTTPClient(), "http://"+net.JoinHostPort("127.0.0.1", port)+"/metrics")
		if err != nil {
			return err
		}
		if f := fams["consul_cni_installer_chained"]; f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetGauge().GetValue() != 1 {
			return fmt.Errorf("consul_cni_installer_chained = %v, want 1", f)
		}
		if fams["consul_cni_installer_build_info"] == nil {
			return fmt.Errorf("no consul_cni_installer_build_info")
		}
		return nil
	})

	// The controller: both replicas Ready, one leader, node ready.
	poll.Eventually(t, 4*time.Minute, "controller replicas Ready", func() error {
		return podsReady(ctx, c, namespace, "app.kubernetes.io/name="+controllerName, node.Name(), 2)
	})
	poll.Eventually(t, 2*time.Minute, "node labelled cni=ready without its startup taint", func() error {
		return nodeCNIReady(ctx, c.Client, node.Name())
	})
	lease, err := c.Client.CoordinationV1().Leases(namespace).Get(ctx, controllerName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("leader Lease: %v", err)
	}
	if h := lease.Spec.HolderIdentity; h == nil || *h == "" {
		t.Errorf("Lease %s has no holder", lease.Name)
	}

	// An injected pod that requires the label (the documented recipe).
	ns := c.Namespace(t)
	meta := injectedMeta(map[string]string{"app": "web"})
	meta.Name = "web"
	meta.Annotations[annotations.KeyRedirectTrafficConfig] = `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeUIDs":["5996"]}`
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: meta,
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{annotations.LabelCNIReady: annotations.LabelCNIReadyValue},
			Containers:   []corev1.Container{{Name: "web", Image: "registry.example/web:1"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 3*time.Minute, "the injected pod redirected and marked complete by the plugin", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName != node.Name() {
			return fmt.Errorf("not scheduled on %s yet (nodeName %q)", node.Name(), p.Spec.NodeName)
		}
		if s := p.Annotations[annotations.KeyTransparentProxyStatus]; !annotations.IsComplete(s) {
			return fmt.Errorf("transparent-proxy-status %q, phase %s", s, p.Status.Phase)
		}
		return nil
	})
	t.Logf("applied %d objects; node %s: installer Ready, consul-cni last in %s, labelled and untainted by the leader %s; injected pod complete",
		len(applied), node.Name(), filepath.Base(conflist), *lease.Spec.HolderIdentity)
}

// podsReady checks that want pods of the selector run on node (any node
// when empty) and are Ready.
func podsReady(ctx context.Context, c *cluster.Cluster, ns, selector, node string, want int) error {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err
	}
	var states []string
	ready := 0
	for _, p := range l.Items {
		ok := (node == "" || p.Spec.NodeName == node) && p.DeletionTimestamp == nil
		isReady := podIsReady(&p)
		if ok && isReady {
			ready++
		}
		var cs []string
		for _, s := range p.Status.ContainerStatuses {
			st := "?"
			switch {
			case s.State.Running != nil:
				st = "running"
			case s.State.Waiting != nil:
				st = "waiting " + s.State.Waiting.Reason + " " + s.State.Waiting.Message
			case s.State.Terminated != nil:
				st = fmt.Sprintf("terminated %d %s", s.State.Terminated.ExitCode, s.State.Terminated.Message)
			}
			cs = append(cs, fmt.Sprintf("%s ready=%v restarts=%d %s", s.Name, s.Ready, s.RestartCount, st))
		}
		states = append(states, fmt.Sprintf("%s on %q ready=%v [%s]", p.Name, p.Spec.NodeName, isReady, strings.Join(cs, "; ")))
	}
	sort.Strings(states)
	if ready != want {
		return fmt.Errorf("%d of %d Ready: %s", ready, want, strings.Join(states, " | "))
	}
	return nil
}

// deleteWorkloads removes what the apply started, so later tests of this
// binary find the namespace as the RBAC tests leave it.
func deleteWorkloads(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	fg := metav1.DeletePropagationForeground
	if err := c.Client.AppsV1().Deployments(namespace).Delete(ctx, controllerName, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil && !apierrors.IsNotFound(err) {
		t.Logf("delete Deployment: %v", err)
	}
	for _, ds := range []string{installerName, verifierName} {
		if err := c.Client.AppsV1().DaemonSets(namespace).Delete(ctx, ds, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("delete DaemonSet %s: %v", ds, err)
		}
	}
	deletePolicies(c)
	// Wait while the nodes still run (cleanups run before the nodes stop):
	// a workload left terminating would swallow the next test's apply of
	// the same name.
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		_, derr := c.Client.AppsV1().Deployments(namespace).Get(ctx, controllerName, metav1.GetOptions{})
		_, serr := c.Client.AppsV1().DaemonSets(namespace).Get(ctx, installerName, metav1.GetOptions{})
		_, verr := c.Client.AppsV1().DaemonSets(namespace).Get(ctx, verifierName, metav1.GetOptions{})
		if apierrors.IsNotFound(derr) && apierrors.IsNotFound(serr) && apierrors.IsNotFound(verr) {
			return
		}
		time.Sleep(time.Second)
	}
	t.Logf("Deployment or DaemonSets of %s still there 2m after deletion", namespace)
}
