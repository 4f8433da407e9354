//go:build integration

package manifests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// lifecycleEnv is what the rows of the lifecycle matrix share: one control
// plane, two real nodes with the project's images, the helm command.
type lifecycleEnv struct {
	c        *cluster.Cluster
	a        *applier
	helm     *helmCLI
	nodes    []*realnode.Node
	app      realnode.Image
	set      []string
	profiles []string
	ns       string // the row's release namespace
	rendered []*unstructured.Unstructured
}

// lifecycleRow is one way in or out of the product.
type lifecycleRow struct {
	name string
	// stays says, per node, whether the product stays on it after change.
	stays []bool
	// controller: a controller runs after change and must lead.
	controller bool
	// extra values of the row's helm install (nil: the base overlay is
	// applied with kustomize instead, in its own namespace).
	set  []string
	helm bool
	// kustomizeNS: without helm, the namespace the base is built for
	// (kustomize's namespace:); "" keeps the base's.
	kustomizeNS string
	change      func(t *testing.T, e *lifecycleEnv)
	// check runs after change, before the nodes are asked (may be nil).
	check func(t *testing.T, e *lifecycleEnv) string
}

// lifecycleResult is one line of the matrix.
type lifecycleResult struct {
	row                  string
	stays                []bool
	settled              time.Duration
	plainMax             time.Duration
	injected, breaks     string
	leftClean, leads, ok string
	note                 string
}

// TestLifecycleMatrixOnRealNodes runs each way in or out of the product on
// two real nodes (kubelet, containerd, runc) with the project's images,
// one after another on the same nodes, and asserts after each: a plain pod
// created on every node starts within 60 s; an injected pod is meshed
// (complete) where the product stays and starts outside the mesh where it
// left (no plugin in the chain, its status left as the webhook wrote it);
// nothing of ours is left on a node it left (chain entry, binary,
// kubeconfig, token, owner and state files); the chain never lost
// consul-cni on a node it stayed on (sampled every 100 ms during the
// change); a controller leads where one is deployed. It logs the matrix.
func TestLifecycleMatrixOnRealNodes(t *testing.T) {
	requireProjectCommands(t)
	e := &lifecycleEnv{c: cluster.Shared(t)}
	e.a = newApplier(t, e.c)
	e.helm = newHelmCLI(t, e.c.Kubeconfig)
	var imgs []realnode.Image
	e.nodes, imgs, e.app = startRealNodes(t, e.c, 2, manifestImageTag(t, buildOverlay(t, "base")))
	e.set = imageValues(t, imgs)
	e.profiles = []string{"without-prometheus-operator.yaml", "evict.yaml"}
	// The installer's nodeSelector of the narrowed row keeps the first node.
	patchNodeLabel(t, e.c, e.nodes[0].Name, "ccr-keep", "yes")

	var results []*lifecycleResult
	for _, row := range lifecycleRows() {
		r := &lifecycleResult{row: row.name, stays: row.stays, leads: "-", leftClean: "-", ok: "not run"}
		results = append(results, r)
		t.Run(row.name, func(t *testing.T) { runLifecycleRow(t, e, row, r) })
	}
	var b strings.Builder
	b.WriteString("\n| way in or out | stays on | settled | plain pods start (max) | injected pods | chain breaks where it stayed | left nodes clean | controller leads | result |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		name := r.row
		if r.note != "" {
			name += " (" + r.note + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %v | %v | %s | %s | %s | %s | %s |\n", name, staysText(r.stays), r.settled.Round(100*time.Millisecond),
			r.plainMax.Round(100*time.Millisecond), r.injected, r.breaks, r.leftClean, r.leads, r.ok)
	}
	t.Log(b.String())
}

func staysText(stays []bool) string {
	var s []string
	for i, st := range stays {
		if st {
			s = append(s, fmt.Sprintf("node %d", i+1))
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func lifecycleRows() []lifecycleRow {
	both, none := []bool{true, true}, []bool{false, false}
	return []lifecycleRow{
		{name: "helm uninstall (pre-delete hook)", stays: none, helm: true, change: func(t *testing.T, e *lifecycleEnv) {
			e.helm.run(t, "uninstall", "ccr", "-n", e.ns, "--wait", "--timeout", "8m")
		}},
		{name: "helm uninstall --no-hooks", stays: none, helm: true, change: func(t *testing.T, e *lifecycleEnv) {
			e.helm.run(t, "uninstall", "ccr", "-n", e.ns, "--no-hooks", "--wait", "--timeout", "8m")
		}},
		{name: "helm upgrade to the repair-only profile", stays: none, controller: true, helm: true, change: func(t *testing.T, e *lifecycleEnv) {
			e.helm.run(t, "upgrade", "ccr", chartDir(t), "-n", e.ns, "--reuse-values", "--wait", "--timeout", "8m",
				"-f", filepath.Join(chartDir(t), "profiles", "repair-only.yaml"))
		}},
		{name: "installer nodeSelector narrowed to exclude node 2", stays: []bool{true, false}, controller: true, helm: true, change: func(t *testing.T, e *lifecycleEnv) {
			e.helm.run(t, "upgrade", "ccr", chartDir(t), "-n", e.ns, "--reuse-values", "--set", "installer.nodeSelector.ccr-keep=yes", "--timeout", "8m")
		}},
		{name: "DaemonSet deleted by hand", stays: none, controller: true, helm: true, change: func(t *testing.T, e *lifecycleEnv) {
			if err := e.c.Client.AppsV1().DaemonSets(e.ns).Delete(context.Background(), installerName, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "kubectl rollout restart of the installer", stays: both, controller: true, helm: true,
			set: []string{"nodeStartupTaint.enabled=true"}, change: rolloutRestart, check: windowsNodeUntainted},
		{name: "namespace deleted", stays: none, helm: true, change: func(t *testing.T, e *lifecycleEnv) {
			if err := e.c.Client.CoreV1().Namespaces().Delete(context.Background(), e.ns, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "kubectl delete -k manifests/base", stays: none, change: deleteBase},
		{name: "kustomize install under namespace mesh-lifecycle (controller leads there), then kubectl delete -k", stays: none,
			kustomizeNS: "mesh-lifecycle", change: deleteBase},
	}
}

// runLifecycleRow installs, makes the change with the chains sampled,
// waits until each node settled, and asserts what the matrix asserts.
func runLifecycleRow(t *testing.T, e *lifecycleEnv, row lifecycleRow, res *lifecycleResult) {
	res.ok = "FAIL"
	ctx := context.Background()
	for _, n := range e.nodes {
		if err := nothingOfOurs(realDirs{n}); err != nil {
			t.Fatalf("before the row: %v", err)
		}
	}
	installForRow(t, e, row)
	if row.kustomizeNS != "" {
		res.note = "a replica led in " + e.ns + " and labelled every node"
	}
	appNS := e.c.Namespace(t)
	stop := sampleChains(e.nodes, row.stays)
	start := time.Now()
	row.change(t, e)
	for i, n := range e.nodes {
		if !row.stays[i] {
			poll.Eventually(t, 2*time.Minute, "nothing of ours on "+n.Name, func() error { return nothingOfOurs(realDirs{n}) })
		}
	}
	if row.stays[0] || row.stays[1] {
		poll.Eventually(t, 4*time.Minute, "installer DaemonSet rolled out", func() error { return rolledOut(ctx, e) })
	}
	res.settled = time.Since(start)
	breaks := stop()
	res.breaks = fmt.Sprintf("%d of %d samples", breaks.broken, breaks.samples)
	if breaks.broken > 0 {
		t.Errorf("the chain lost consul-cni in %d of %d samples on a node the product stayed on: %s", breaks.broken, breaks.samples, breaks.first)
	}
	if row.check != nil {
		res.note = row.check(t, e)
	}
	res.plainMax = plainPodsStart(t, e, appNS)
	res.injected = injectedPodsHandled(t, e, appNS, row.stays)
	left := 0
	for i := range e.nodes {
		if !row.stays[i] {
			left++
		}
	}
	if left > 0 {
		res.leftClean = fmt.Sprintf("%d of %d", left, left)
	}
	if row.controller {
		res.leads = leaderRenews(t, e, start)
	}
	cleanupRow(t, e, row)
	if !t.Failed() {
		res.ok = "ok"
	}
}

// installForRow installs the chart with helm into a fresh namespace, or
// applies the base overlay, and waits until every node is ready.
func installForRow(t *testing.T, e *lifecycleEnv, row lifecycleRow) {
	t.Helper()
	if !row.helm {
		objs := baseBuild(t, row.kustomizeNS)
		e.ns = find(t, objs, "DaemonSet", installerName).GetNamespace()
		removeClusterScoped(t, e.a, objs)
		applyAll(t, e.a, objs, nil)
		e.rendered = objs
		holder := waitRealNodesReady(t, e.c, e.ns, e.nodes)
		t.Logf("base in namespace %s: installers Ready, nodes labelled by the leader %s", e.ns, holder)
		return
	}
	e.ns = privilegedNamespace(t, e.c)
	set := append(append([]string{}, e.set...), row.set...)
	vals := chartValues(t, e.profiles, set...)
	e.rendered = renderChartIn(t, e.ns, vals)
	removeClusterScoped(t, e.a, e.rendered)
	args := []string{"install", "ccr", chartDir(t), "-n", e.ns, "--wait", "--timeout", "8m"}
	for _, p := range e.profiles {
		args = append(args, "-f", filepath.Join(chartDir(t), "profiles", p))
	}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	e.helm.run(t, args...)
	waitRealNodesReady(t, e.c, e.ns, e.nodes)
}

// cleanupRow removes what the row left installed (the release without its
// hook, which needs the DaemonSet, then the cluster-wide objects), and
// waits until every node is clean again.
func cleanupRow(t *testing.T, e *lifecycleEnv, row lifecycleRow) {
	t.Helper()
	ctx := context.Background()
	if row.helm && namespaceLeaving(t, e) {
		namespaceDeletedCleanup(t, e)
	} else if row.helm {
		if rels := e.helm.list(t, e.ns); len(rels) > 0 {
			args := []string{"uninstall", "ccr", "-n", e.ns, "--wait", "--timeout", "8m"}
			// The pre-delete hook turns the DaemonSet's pods into removers.
			if _, err := e.c.Client.AppsV1().DaemonSets(e.ns).Get(ctx, installerName, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				args = append(args, "--no-hooks")
			}
			e.helm.run(t, args...)
		}
		removeClusterScoped(t, e.a, e.rendered)
	}
	for _, n := range e.nodes {
		poll.Eventually(t, 3*time.Minute, "nothing of ours on "+n.Name+" after the row", func() error { return nothingOfOurs(realDirs{n}) })
	}
	poll.Eventually(t, 3*time.Minute, "no pod left in "+e.ns, func() error {
		l, err := e.c.Client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d pods", len(l.Items))
		}
		return nil
	})
}

// namespaceLeaving says whether the row's release namespace is gone or
// terminating.
func namespaceLeaving(t *testing.T, e *lifecycleEnv) bool {
	t.Helper()
	ns, err := e.c.Client.CoreV1().Namespaces().Get(context.Background(), e.ns, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true
	case err != nil:
		t.Fatal(err)
	}
	return ns.DeletionTimestamp != nil
}

// namespaceDeletedCleanup runs docs/operate.md's block for a release whose
// namespace was deleted first, with the row's namespace and release, and
// checks what the page says: helm then knows no release, and no
// cluster-wide object of the chart is left.
func namespaceDeletedCleanup(t *testing.T, e *lifecycleEnv) {
	t.Helper()
	page, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), "docs", "operate.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := markedBlocks(page, "docs/operate.md", "<!-- namespace-deleted -->")
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 1 {
		t.Fatalf("docs/operate.md has %d namespace-deleted blocks, want 1", len(blocks))
	}
	script := strings.NewReplacer("namespace/consul-cni-repair", "namespace/"+e.ns,
		"app.kubernetes.io/instance=consul-cni-repair", "app.kubernetes.io/instance=ccr").Replace(blocks[0])
	ctx, cancel := context.WithTimeout(context.Background(), 7*time.Minute)
	defer cancel()
	out, err := runScript(ctx, "set -euxo pipefail\n"+script, testbin.RepoRoot(), []string{
		"KUBECONFIG=" + e.c.Kubeconfig,
		"PATH=" + filepath.Dir(walkthroughKubectl(t)) + string(os.PathListSeparator) + os.Getenv("PATH"),
	})
	t.Logf("docs/operate.md, namespace deleted first:\n%s", out)
	if err != nil {
		t.Fatalf("docs/operate.md's block for a deleted namespace failed: %v", err)
	}
	if rels := e.helm.list(t, e.ns); len(rels) > 0 {
		t.Errorf("helm still lists %d releases in the deleted namespace %s", len(rels), e.ns)
	}
	for _, o := range e.rendered {
		if o.GetNamespace() != "" {
			continue
		}
		ri, err := e.a.resource(o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("%s %s left after docs/operate.md's block (%v)", o.GetKind(), o.GetName(), err)
		}
	}
	removeClusterScoped(t, e.a, e.rendered)
}

// nothingOfOurs is assertNothingOfOurs as an error, with the installer's
// state file too.
func nothingOfOurs(n cniNode) error {
	var left []string
	for _, f := range []string{filepath.Join(n.ConfDir(), cniconf.KubeconfigFileName), filepath.Join(n.ConfDir(), cniconf.TokenFileName),
		filepath.Join(n.ConfDir(), cniconf.OwnerFileName), filepath.Join(n.BinDir(), cniconf.StagedBinaryName),
		filepath.Join(n.BinDir(), cniconf.PluginType), filepath.Join(n.BinDir(), cniconf.StateFileName)} {
		if _, err := os.Lstat(f); err == nil {
			left = append(left, filepath.Base(f))
		}
	}
	ents, err := os.ReadDir(n.ConfDir())
	if err != nil {
		return err
	}
	for _, en := range ents {
		if b, err := os.ReadFile(filepath.Join(n.ConfDir(), en.Name())); err == nil && chainsPlugin(b) {
			left = append(left, en.Name()+" chains "+cniconf.PluginType)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("node %s: %s left", n.Name(), strings.Join(left, ", "))
	}
	return nil
}

func chainsPlugin(b []byte) bool {
	var list struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if json.Unmarshal(b, &list) != nil {
		return false
	}
	for _, p := range list.Plugins {
		if p.Type == cniconf.PluginType {
			return true
		}
	}
	return false
}

type chainSamples struct {
	samples, broken int
	first           string
}

// sampleChains reads, every 100 ms, the conflist of each node whose
// product stays, until the returned function is called; it returns how
// many samples did not end with consul-cni.
func sampleChains(nodes []*realnode.Node, stays []bool) func() chainSamples {
	var mu sync.Mutex
	var s chainSamples
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			for i, n := range nodes {
				if !stays[i] {
					continue
				}
				b, err := n.ConfList()
				last, perr := lastPluginOf(b)
				mu.Lock()
				s.samples++
				if err != nil || perr != nil || last != cniconf.PluginType {
					s.broken++
					if s.first == "" {
						s.first = fmt.Sprintf("node %s at %s: last plugin %q (%v %v)", n.Name, time.Now().Format(time.StampMilli), last, err, perr)
					}
				}
				mu.Unlock()
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() chainSamples {
		close(done)
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return s
	}
}

func lastPluginOf(b []byte) (string, error) {
	var list struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return "", err
	}
	if len(list.Plugins) == 0 {
		return "", errors.New("no plugins")
	}
	return list.Plugins[len(list.Plugins)-1].Type, nil
}

// plainPodsStart creates a plain pod on every node and fails unless each
// runs within 60 s; it returns the slowest start.
func plainPodsStart(t *testing.T, e *lifecycleEnv, ns string) time.Duration {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	for _, n := range e.nodes {
		if _, err := e.c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "plain-" + n.Name},
			Spec: corev1.PodSpec{NodeSelector: map[string]string{"kubernetes.io/hostname": n.Name},
				Tolerations: []corev1.Toleration{{Key: annotations.TaintCNINotReady, Operator: corev1.TolerationOpExists}},
				Containers: []corev1.Container{{Name: "app", Image: e.app.Ref, ImagePullPolicy: corev1.PullNever,
					Args: []string{"serve", "--listen", ":8080", "--reply", "plain"}}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var slowest time.Duration
	for _, n := range e.nodes {
		name := "plain-" + n.Name
		poll.Eventually(t, 60*time.Second-time.Since(start), "plain pod "+name+" running within 60 s", func() error {
			return podRunning(ctx, e.c, ns, name)
		})
		slowest = time.Since(start)
	}
	return slowest
}

func podRunning(ctx context.Context, c *cluster.Cluster, ns, name string) error {
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return fmt.Errorf("phase %s, node %q, conditions %v, containers %v", p.Status.Phase, p.Spec.NodeName, p.Status.Conditions, p.Status.ContainerStatuses)
	}
	return nil
}

// injectedPodsHandled creates an injected pod on every node: where the
// product stays the plugin must mark it complete; where it left it starts
// outside the mesh, its status as the webhook wrote it (the controller
// and the init-container check find it there).
func injectedPodsHandled(t *testing.T, e *lifecycleEnv, ns string, stays []bool) string {
	t.Helper()
	ctx := context.Background()
	var out []string
	for i, n := range e.nodes {
		meta := injectedMeta(map[string]string{"app": "web"})
		meta.Name = "web-" + n.Name
		meta.Annotations[annotations.KeyRedirectTrafficConfig] = `{"ProxyUserID":"5995","ProxyInboundPort":20000,"ProxyOutboundPort":15001,"ExcludeUIDs":["5996"]}`
		if _, err := e.c.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"kubernetes.io/hostname": n.Name},
			Tolerations:  []corev1.Toleration{{Key: annotations.TaintCNINotReady, Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{Name: "web", Image: e.app.Ref, ImagePullPolicy: corev1.PullNever,
				Args: []string{"serve", "--listen", ":8080", "--reply", "web"}}},
		}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 60*time.Second, "injected pod "+meta.Name+" handled", func() error {
			p, err := e.c.Client.CoreV1().Pods(ns).Get(ctx, meta.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			s := p.Annotations[annotations.KeyTransparentProxyStatus]
			switch {
			case p.Status.Phase != corev1.PodRunning:
				return fmt.Errorf("phase %s, status %q", p.Status.Phase, s)
			case stays[i] && !annotations.IsComplete(s):
				return fmt.Errorf("running but transparent-proxy-status %q where the product stays", s)
			case !stays[i] && annotations.IsComplete(s):
				return fmt.Errorf("marked %q on a node the product left", s)
			}
			return nil
		})
		if stays[i] {
			out = append(out, fmt.Sprintf("node %d meshed", i+1))
		} else {
			out = append(out, fmt.Sprintf("node %d outside the mesh", i+1))
		}
	}
	return strings.Join(out, ", ")
}

// leaderRenews: a controller replica holds the row's Lease and renewed it
// after since.
func leaderRenews(t *testing.T, e *lifecycleEnv, since time.Time) string {
	t.Helper()
	poll.Eventually(t, 2*time.Minute, "a controller replica leads", func() error {
		l, err := e.c.Client.CoordinationV1().Leases(e.ns).Get(context.Background(), controllerName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil || l.Spec.RenewTime.Time.Before(since) {
			return fmt.Errorf("holder %v renewed %v", l.Spec.HolderIdentity, l.Spec.RenewTime)
		}
		return nil
	})
	return "yes"
}

func rolloutRestart(t *testing.T, e *lifecycleEnv) {
	t.Helper()
	ctx := context.Background()
	old, err := e.c.Client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + installerName})
	if err != nil {
		t.Fatal(err)
	}
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"kubectl.kubernetes.io/restartedAt":%q}}}}}`, time.Now().Format(time.RFC3339))
	if _, err := e.c.Client.AppsV1().DaemonSets(e.ns).Patch(ctx, installerName, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 4*time.Minute, "every installer pod replaced", func() error {
		for _, p := range old.Items {
			if _, err := e.c.Client.CoreV1().Pods(e.ns).Get(ctx, p.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("pod %s still there (%v)", p.Name, err)
			}
		}
		return podsReady(ctx, e.c, e.ns, "app.kubernetes.io/name="+installerName, "", len(e.nodes))
	})
}

// windowsNodeUntainted: with the startup taint on, a Node registering as
// Windows (no installer will run there) gets no startup taint, and a Linux
// one does (so this can fail).
func windowsNodeUntainted(t *testing.T, e *lifecycleEnv) string {
	t.Helper()
	ctx := context.Background()
	got := map[string]bool{}
	for _, os := range []string{"windows", "linux"} {
		name := "lifecycle-" + os + "-" + e.ns
		n, err := e.c.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"kubernetes.io/os": os}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Gone before the row's uninstall, whose removers would wait for a
		// node without a kubelet.
		if err := e.c.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, tn := range n.Spec.Taints {
			if tn.Key == annotations.TaintCNINotReady {
				got[os] = true
			}
		}
	}
	if got["windows"] || !got["linux"] {
		t.Errorf("startup taint at CREATE: windows %v, linux %v; want only linux", got["windows"], got["linux"])
	}
	return "a Windows Node untainted at CREATE"
}

// deleteBase deletes the base's objects in the build's order, as kubectl
// delete -k does, and waits until its namespace is gone.
func deleteBase(t *testing.T, e *lifecycleEnv) {
	t.Helper()
	ctx := context.Background()
	for _, o := range e.rendered {
		if gvkOf(o).Group == monitoringGroup {
			continue
		}
		ri, err := e.a.resource(o)
		if err != nil {
			t.Fatal(err)
		}
		if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	poll.Eventually(t, 3*time.Minute, "namespace "+e.ns+" gone", func() error {
		if _, err := e.c.Client.CoreV1().Namespaces().Get(ctx, e.ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%v)", err)
		}
		return nil
	})
	if e.ns == namespace {
		// The later tests of this binary expect the namespace.
		t.Cleanup(func() {
			applyAll(t, e.a, buildOverlay(t, "base"), func(k string) bool { return k != "Namespace" })
		})
	}
}

// baseBuild is the base, built for ns when not "".
func baseBuild(t *testing.T, ns string) []*unstructured.Unstructured {
	t.Helper()
	if ns == "" {
		return buildOverlay(t, "base")
	}
	return buildInNamespace(t, "base", ns)
}

// rolledOut: the installer DaemonSet's pods are all updated and available.
func rolledOut(ctx context.Context, e *lifecycleEnv) error {
	ds, err := e.c.Client.AppsV1().DaemonSets(e.ns).Get(ctx, installerName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	st := ds.Status
	if st.ObservedGeneration < ds.Generation || st.UpdatedNumberScheduled != st.DesiredNumberScheduled ||
		st.NumberAvailable != st.DesiredNumberScheduled || st.NumberUnavailable != 0 || st.CurrentNumberScheduled != st.DesiredNumberScheduled {
		return fmt.Errorf("status %+v at generation %d", st, ds.Generation)
	}
	return podsReady(ctx, e.c, e.ns, "app.kubernetes.io/name="+installerName, "", int(st.DesiredNumberScheduled))
}

func patchNodeLabel(t *testing.T, c *cluster.Cluster, node, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, key, value)
	if _, err := c.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}
