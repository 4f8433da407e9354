//go:build integration

package manifests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/consulk8s"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// migrationTrials is how often consul-k8s's installer is stopped (its
// cleanup run) beside ours. Each trial but the first waits for a new pod of
// consul-k8s's to chain its entry, which it does only 100 s after it starts
// where a plugin binary is installed already (its binary watcher's grace
// period); the restore gap's percentiles come from the installer's own
// test (TestMigrationFromConsulK8sInstaller, 50 trials).
const migrationTrials = 3

// TestMigrationFromConsulK8sOnSimulatedNode follows the switch of docs/install.md
// from consul-k8s's CNI: our installer DaemonSet and the controller (base
// overlay) run beside consul-k8s's CNI DaemonSet running its real
// install-cni (startConsulK8sCNI), which is then stopped with that page's
// patch; its pod's cleanup removes the entry, the binary and the
// kubeconfig, and ours restores them. Meanwhile
// a loop creates sandboxes for an injected pod through the node's real
// conflist as fast as it can, and counts those created without consul-cni
// in their chain. Then the case the controller must handle is forced:
// consul-k8s's cleanup runs while our installer is stopped, an injected pod
// of a Deployment gets its sandbox from a chain without the plugin, our
// installer starts again, and the controller replaces that pod with one
// whose sandbox has the plugin (status complete).
func TestMigrationFromConsulK8sOnSimulatedNode(t *testing.T) {
	requireProjectCommands(t)
	bins := consulk8s.Unpack(t)
	c := cluster.Shared(t)
	a := newApplier(t, c)
	ctx := context.Background()
	programs := simnode.ProjectPrograms(t)
	programs["consul-k8s-control-plane"] = consulK8sProgram(t)
	node := simnode.StartForTest(t, c, testnet.Reserve(t), func(cfg *simnode.Config) {
		for k, v := range programs {
			cfg.Programs[k] = v
		}
	})
	consulK8sRBAC(t, c)
	startConsulK8sCNI(t, c, node, bins)
	consulK8sReady := func() error {
		if err := podsReady(ctx, c, consulK8sNS, consulK8sSelector, node.Name(), 1); err != nil {
			return err
		}
		return consulK8sChained(node)
	}
	poll.Eventually(t, 3*time.Minute, "consul-k8s's CNI pod Ready and its entry chained", consulK8sReady)

	for _, o := range buildOverlay(t, "base") {
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
	oursReady := func() error {
		return podsReady(ctx, c, namespace, "app.kubernetes.io/name="+installerName, node.Name(), 1)
	}
	poll.Eventually(t, 4*time.Minute, "our installer Ready beside consul-k8s's", oursReady)
	poll.Eventually(t, 3*time.Minute, "node labelled cni=ready", func() error { return nodeCNIReady(ctx, c.Client, node.Name()) })

	ns := c.Namespace(t)
	probe := gapProbePod(t, c, ns, node.Name())
	var gaps []time.Duration
	var total gapSandboxes
	for i := 0; i < migrationTrials; i++ {
		if i > 0 {
			pauseDaemonSet(t, c, consulK8sNS, consulK8sDS, false)
			poll.Eventually(t, 4*time.Minute, "consul-k8s's CNI pod Ready again and its entry chained", consulK8sReady)
		}
		gap, sb := stopConsulK8sDuringSandboxes(t, c, node, probe)
		poll.Eventually(t, 2*time.Minute, "our installer Ready after the cleanup", oursReady)
		t.Logf("trial %d: restore gap %v; sandboxes: %v", i, gap, sb)
		gaps = append(gaps, gap)
		total.add(sb)
	}
	slices.Sort(gaps)
	t.Logf("restore gap on a simulated node over %d trials: min %v, median %v, max %v; sandboxes created meanwhile by %d loops: %v",
		len(gaps), gaps[0], gaps[len(gaps)/2], gaps[len(gaps)-1], sandboxLoops, total)
	t.Logf("sandboxes that would run outside the mesh (created without consul-cni, or with it but not redirected): %d of %d (target 0)",
		total.unchained+total.notRedirected, total.chained+total.notRedirected+total.unchained+total.failed)
	if b, err := os.ReadFile(node.CNILog()); err == nil {
		t.Logf("CNI calls (ADD or DEL) in which the plugin found no kubeconfig and took the node for uninstalled (node's CNI log): %d",
			strings.Count(string(b), "consul-cni is uninstalled from this node"))
	}
	if total.chained == 0 {
		t.Errorf("no sandbox was created with consul-cni in its chain during the %d trials: the loop did not run", migrationTrials)
	}
	// A sandbox whose chain has the plugin is redirected whatever the
	// timing: the plugin's kubeconfig has a name of its own, so
	// consul-k8s's cleanup never makes the plugin take the node for
	// uninstalled. (Sandboxes created without the plugin in the gap are
	// the controller's, checked below.)
	if total.notRedirected != 0 {
		t.Errorf("%d sandboxes had %s in their chain but were not redirected (want 0)", total.notRedirected, cniconf.PluginType)
	}

	bypassReplaced(t, c, node, ns, oursReady)
}

// addContainerArgs appends args to the first container of a workload.
func addContainerArgs(t *testing.T, o *unstructured.Unstructured, args ...string) {
	t.Helper()
	cs, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if err != nil || len(cs) == 0 {
		t.Fatalf("%s %s: containers: %v", o.GetKind(), o.GetName(), err)
	}
	ct := cs[0].(map[string]any)
	for _, a := range args {
		ct["args"] = append(ct["args"].([]any), a)
	}
	if err := unstructured.SetNestedSlice(o.Object, cs, "spec", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
}

// pausedLabel is a node label no node has: a DaemonSet selecting it runs
// nowhere (the docs' way of stopping consul-k8s's CNI DaemonSet).
const pausedLabel = "consul-cni-repair.io/no-node"

// pauseDaemonSet stops (paused) or restarts a DaemonSet's pods with a
// nodeSelector no node matches, and waits, when pausing, until none of its
// pods is left.
func pauseDaemonSet(t *testing.T, c *cluster.Cluster, ns, name string, paused bool) {
	t.Helper()
	ctx := context.Background()
	value := `null`
	if paused {
		value = `"true"`
	}
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"nodeSelector":{%q:%s}}}}}`, pausedLabel, value)
	ds, err := c.Client.AppsV1().DaemonSets(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !paused {
		return
	}
	sel := metav1.FormatLabelSelector(ds.Spec.Selector)
	poll.Eventually(t, 2*time.Minute, "pods of DaemonSet "+ns+"/"+name+" gone", func() error {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d pods left", len(l.Items))
		}
		return nil
	})
}

// gapProbePod is a bare injected pod on node, meshed (its sandbox made
// while the chain is complete): the identity the sandbox loop creates
// sandboxes for.
func gapProbePod(t *testing.T, c *cluster.Cluster, ns, node string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	meta := injectedMeta(map[string]string{"app": "gap-probe"})
	meta.Name = "gap-probe"
	meta.Annotations[annotations.KeyRedirectTrafficConfig] = `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeUIDs":["5996"]}`
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{
		NodeSelector: map[string]string{"kubernetes.io/hostname": node},
		Containers:   []corev1.Container{{Name: "app", Image: "registry.example/app:1"}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pod *corev1.Pod
	poll.Eventually(t, 3*time.Minute, "gap-probe pod meshed", func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, "gap-probe", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if s := p.Annotations[annotations.KeyTransparentProxyStatus]; !annotations.IsComplete(s) || p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s, status %q", p.Status.Phase, s)
		}
		pod = p
		return nil
	})
	return pod
}

// sandboxLoops is how many loops create sandboxes at once.
const sandboxLoops = 4

// gapSandboxes counts the loops' sandboxes by the chain they got:
// redirected (consul-cni last in the chain and the CONSUL chains in the
// sandbox's nat table), chained but not redirected (the plugin ran and let
// the pod pass, as it does on a node without its kubeconfig), unchained
// (no consul-cni in the chain), failed (ADD failed: the runtime retries,
// the pod never runs on that sandbox).
type gapSandboxes struct {
	chained, notRedirected, unchained, failed int
	// busy is the time the loops spent creating and removing sandboxes.
	busy time.Duration
	// firstErr is the first ADD error.
	firstErr string
}

func (g *gapSandboxes) add(o gapSandboxes) {
	g.chained += o.chained
	g.notRedirected += o.notRedirected
	g.unchained += o.unchained
	g.failed += o.failed
	g.busy += o.busy
	if g.firstErr == "" {
		g.firstErr = o.firstErr
	}
}

func (g gapSandboxes) String() string {
	n := g.chained + g.notRedirected + g.unchained + g.failed
	s := fmt.Sprintf("%d redirected by consul-cni, %d with consul-cni but not redirected, %d without consul-cni, %d failed",
		g.chained, g.notRedirected, g.unchained, g.failed)
	if n > 0 {
		s += fmt.Sprintf(" (%v per sandbox and loop)", (g.busy / time.Duration(n)).Round(time.Millisecond))
	}
	if g.firstErr != "" {
		s += "; first ADD error: " + g.firstErr
	}
	return s
}

// redirected tells whether the plugin's redirection is in a network
// namespace: the inbound chain in its nat table, with either iptables
// backend (the plugin uses the node's).
func redirected(netns string) error {
	var outs []string
	for _, save := range []string{"iptables-save", "iptables-legacy-save"} {
		out, err := exec.Command("nsenter", "--net="+netns, save, "-t", "nat").CombinedOutput()
		if err == nil && strings.Contains(string(out), ":"+redirect.ChainInbound+" ") {
			return nil
		}
		outs = append(outs, fmt.Sprintf("%s: %v %d bytes", save, err, len(out)))
	}
	return fmt.Errorf("no %s chain in the nat table (%s)", redirect.ChainInbound, strings.Join(outs, "; "))
}

// sandboxLoop creates sandboxes for probe until stop is closed and counts
// them into sb.
func sandboxLoop(t *testing.T, node *simnode.Node, probe *corev1.Pod, stop <-chan struct{}, mu *sync.Mutex, sb *gapSandboxes) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		start := time.Now()
		try := node.TrySandbox(context.Background(), probe, redirected)
		mu.Lock()
		sb.busy += time.Since(start)
		switch {
		case try.Err != nil:
			sb.failed++
			if sb.firstErr == "" {
				sb.firstErr = try.Err.Error()
			}
		case try.Chained(cniconf.PluginType) && try.InspectErr == nil:
			sb.chained++
		case try.Chained(cniconf.PluginType):
			sb.notRedirected++
			t.Logf("sandbox created with %s but not redirected: %v", cniconf.PluginType, try.InspectErr)
		default:
			sb.unchained++
			t.Logf("sandbox created without %s: chain %v", cniconf.PluginType, try.Plugins)
		}
		mu.Unlock()
	}
}

// chainComplete tells whether a sandbox created now would get the plugin:
// consul-cni last in the network the node reads, its binary and its
// kubeconfig in place.
func chainComplete(node *simnode.Node) bool {
	plugins, err := node.NetworkPlugins()
	if err != nil || len(plugins) == 0 || plugins[len(plugins)-1] != cniconf.PluginType {
		return false
	}
	for _, f := range []string{filepath.Join(node.BinDir(), cniconf.PluginType), filepath.Join(node.ConfDir(), cniconf.KubeconfigFileName)} {
		if _, err := os.Stat(f); err != nil {
			return false
		}
	}
	return true
}

// stopConsulK8sDuringSandboxes stops consul-k8s's DaemonSet (step 2 of docs/install.md) while a
// loop creates sandboxes for probe as fast as it can and another polls the
// chain; it returns the gap between the first incomplete and the next
// complete chain, and the loop's sandboxes, once consul-k8s's pod is gone
// and the chain complete again.
func stopConsulK8sDuringSandboxes(t *testing.T, c *cluster.Cluster, node *simnode.Node, probe *corev1.Pod) (time.Duration, gapSandboxes) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var sb gapSandboxes
	var broke, restored time.Time
	for range sandboxLoops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sandboxLoop(t, node, probe, stop, &mu, &sb)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			complete := chainComplete(node)
			now := time.Now()
			if !complete && broke.IsZero() {
				broke = now
			}
			if complete && !broke.IsZero() && restored.IsZero() {
				restored = now
			}
			time.Sleep(time.Millisecond)
		}
	}()
	pauseDaemonSet(t, c, consulK8sNS, consulK8sDS, true)
	poll.Eventually(t, time.Minute, "chain complete after consul-k8s's cleanup", func() error {
		if !chainComplete(node) {
			return fmt.Errorf("chain incomplete")
		}
		return nil
	})
	close(stop)
	wg.Wait()
	switch {
	case broke.IsZero():
		// The cleanup and our restore both fell between two polls.
		return 0, sb
	case restored.IsZero():
		t.Fatalf("the chain broke at %v and the poller saw no restore", broke)
	}
	return restored.Sub(broke), sb
}

// bypassReplaced forces the case the controller must handle: consul-k8s's
// cleanup with our installer stopped, an injected pod of a
// Deployment whose sandbox gets a chain without the plugin, then our
// installer again; the controller evicts that pod and its replacement is
// meshed.
func bypassReplaced(t *testing.T, c *cluster.Cluster, node *simnode.Node, ns string, oursReady func() error) {
	t.Helper()
	ctx := context.Background()
	pauseDaemonSet(t, c, namespace, installerName, true)
	pauseDaemonSet(t, c, consulK8sNS, consulK8sDS, false)
	poll.Eventually(t, 4*time.Minute, "consul-k8s's entry chained with our installer stopped", func() error {
		if err := podsReady(ctx, c, consulK8sNS, consulK8sSelector, node.Name(), 1); err != nil {
			return err
		}
		return consulK8sChained(node)
	})
	pauseDaemonSet(t, c, consulK8sNS, consulK8sDS, true)
	if plugins, err := node.NetworkPlugins(); err != nil || slices.Contains(plugins, cniconf.PluginType) {
		t.Fatalf("chain after consul-k8s's cleanup with our installer stopped: %v (%v), want no %s", plugins, err, cniconf.PluginType)
	}

	createInjectedWeb(t, c, ns, node.Name(), 1)
	var bypassing *corev1.Pod
	poll.Eventually(t, 3*time.Minute, "the injected pod running with a sandbox made without the plugin", func() error {
		l, err := webOutsideMesh(ctx, c, ns)
		if err != nil {
			return err
		}
		if len(l) == 0 {
			return fmt.Errorf("no running pod with status %q", annotations.TProxyStatusEnabled)
		}
		bypassing = &l[0]
		return nil
	})

	pauseDaemonSet(t, c, namespace, installerName, false)
	poll.Eventually(t, 3*time.Minute, "our installer Ready again", oursReady)
	start := time.Now()
	var replacement string
	poll.Eventually(t, 5*time.Minute, "the bypassing pod replaced by a meshed one", func() error {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		for _, p := range l.Items {
			if p.UID == bypassing.UID {
				return fmt.Errorf("pod %s (sandbox without the plugin) still there", p.Name)
			}
		}
		for _, p := range l.Items {
			if p.DeletionTimestamp == nil && annotations.IsComplete(p.Annotations[annotations.KeyTransparentProxyStatus]) {
				replacement = p.Name
				return nil
			}
		}
		return fmt.Errorf("no meshed replacement among %d pods", len(l.Items))
	})
	ev, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + bypassing.Name})
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, e := range ev.Items {
		reasons = append(reasons, e.Reason)
	}
	t.Logf("pod %s, whose sandbox was made while the chain lacked %s, was replaced by %s (status complete) %v after our installer was Ready again; its events: %v",
		bypassing.Name, cniconf.PluginType, replacement, time.Since(start).Round(100*time.Millisecond), reasons)
}
