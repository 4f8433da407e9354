//go:build integration

package manifests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/realnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/registry"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// firstHourVersion is the version the test publishes: the one the README's
// commands name (chart 0.1.0, images v0.1.0).
const firstHourVersion = "v0.1.0"

// TestFirstHour publishes the project to a real registry on loopback with
// `make publish` and runs the README's path as written (its first-hour
// blocks, only the registry's host changed and helm's --plain-http added) with kubectl and helm against
// two real nodes that hold none of the project's images: they pull them
// from the registry. Beside it runs a stand-in of consul-k8s's CNI
// DaemonSet (consul/consul-cni, the pause image), which the README's
// hand-over stops. It checks that every image came from the registry, the
// installer chained consul-cni on both nodes, audit mode changed nothing,
// acting labelled the nodes and injected pods are marked complete, the
// audit finds no pod outside the mesh, and the removal leaves the nodes
// clean. It logs the push and pull times and the images' sizes.
func TestFirstHour(t *testing.T) {
	requireProjectCommands(t)
	reg := registry.Start(t)
	published := reg.Host + "/consul-cni-repair"
	pushes := publishWithMake(t, published)
	for _, l := range pushes {
		t.Logf("make publish: %s", l)
	}

	c := cluster.Shared(t)
	a := newApplier(t, c)
	helm := newHelmCLI(t, c.Kubeconfig)
	kubectl := walkthroughKubectl(t)
	removeNamespace(t, c, namespace) // the README's first block creates it
	removeClusterScoped(t, a, renderChartIn(t, namespace, chartValues(t, nil)))

	r := testnet.Reserve(t)
	app := realnode.ProgramImage(t, "podprog")
	var nodes []*realnode.Node
	for i := 0; i < 2; i++ {
		n := realnode.StartForTest(t, c, r, realnode.Options{Images: realnode.Archives(app)})
		reg.Forward(t, n.Netns)
		nodes = append(nodes, n)
	}
	consulCNIStandIn(t, c)

	blocks := firstHourBlocks(t, published)
	env := []string{
		"KUBECONFIG=" + c.Kubeconfig,
		"PATH=" + filepath.Dir(kubectl) + string(os.PathListSeparator) + filepath.Dir(helm.bin) + string(os.PathListSeparator) + os.Getenv("PATH"),
		"HELM_CONFIG_HOME=" + filepath.Join(helm.home, "config"),
		"HELM_CACHE_HOME=" + filepath.Join(helm.home, "cache"),
		"HELM_DATA_HOME=" + filepath.Join(helm.home, "data"),
	}
	run := func(i int) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		start := time.Now()
		out, err := runScript(ctx, "set -euxo pipefail\n"+blocks[i], testbin.RepoRoot(), env)
		t.Logf("README block %d (%v):\n%s", i+1, time.Since(start).Round(100*time.Millisecond), out)
		if err != nil {
			t.Fatalf("README block %d failed: %v", i+1, err)
		}
		return out
	}
	if len(blocks) != 8 {
		t.Fatalf("README.md has %d first-hour blocks, want 8 (namespace, install, hand-over, verify x3, act, remove)", len(blocks))
	}
	start := time.Now()
	for i := 0; i < 6; i++ {
		if out := run(i); i == 4 && !strings.Contains(out, "ok: controller: Lease "+namespace+"/") {
			t.Errorf("README block 5: helm test did not check the controller's Lease")
		}
	}
	t.Logf("from the README's first command to a verified install in audit mode: %v", time.Since(start).Round(100*time.Millisecond))
	checkFirstInstall(t, c, nodes, published)

	run(6) // let it act
	for _, n := range nodes {
		poll.Eventually(t, 3*time.Minute, "node "+n.Name+" labelled cni=ready", func() error {
			return nodeCNIReady(context.Background(), c.Client, n.Name)
		})
	}
	appNS := c.Namespace(t)
	for _, n := range nodes {
		injectedPodComplete(t, c, appNS, n.Name, app)
	}
	if out := run(4); !strings.Contains(out, "0 of 2 injected pods outside the mesh") {
		t.Errorf("repair audit after the injected pods: want 0 of 2 outside the mesh")
	} else if !strings.Contains(out, "ok: node readiness: the 2 nodes with a Ready pod") {
		t.Errorf("helm test once the controller acts: want node readiness checked on both nodes")
	}
	logPulls(t, c, published)
	helmTestFailsWithoutController(t, env, published)

	run(7) // remove
	for _, n := range nodes {
		assertNothingOfOurs(t, realDirs{n})
	}
	waitNamespaceGone(t, c, namespace)
}

// helmTestFailsWithoutController: with the controller scaled to zero (its
// leader gone), `helm test` fails, and its Pod says it was the controller's
// Lease. The test's checks are given 10 s instead of 2 min first.
func helmTestFailsWithoutController(t *testing.T, env []string, published string) {
	t.Helper()
	script := fmt.Sprintf(`set -euxo pipefail
helm upgrade consul-cni-repair oci://%s/charts/consul-cni-repair --plain-http --version %s -n %s --reuse-values --set tests.checksTimeout=10s --wait
kubectl -n %[3]s scale deployment/%[4]s --replicas=0
kubectl -n %[3]s wait --for=delete pod -l app.kubernetes.io/component=controller --timeout=2m
if helm test consul-cni-repair -n %[3]s; then echo "helm test passed without a controller"; exit 1; fi
kubectl -n %[3]s logs %[4]s-test
`, published, strings.TrimPrefix(firstHourVersion, "v"), namespace, controllerName)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := runScript(ctx, script, testbin.RepoRoot(), env)
	t.Logf("helm test without a controller (%v):\n%s", time.Since(start).Round(100*time.Millisecond), out)
	if err != nil {
		t.Fatalf("helm test without a controller: %v", err)
	}
	if !strings.Contains(out, "FAIL: controller: Lease "+namespace+"/"+controllerName) {
		t.Errorf("helm test without a controller: its Pod's log does not name the controller's Lease")
	}
}

// publishWithMake runs `make publish` into the registry, for every platform
// of the Makefile, with the version the README names, and returns what it
// printed about each push.
func publishWithMake(t *testing.T, dest string) []string {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("make", "publish", "REGISTRY="+dest, "VERSION="+firstHourVersion)
	cmd.Dir = testbin.RepoRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make publish REGISTRY=%s: %v\n%s", dest, err, out)
	}
	var pushed []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "pushed ") {
			pushed = append(pushed, l)
		}
	}
	if len(pushed) != 4 {
		t.Fatalf("make publish: %d pushes reported, want 3 images and the chart:\n%s", len(pushed), out)
	}
	t.Logf("make publish (build included): %v", time.Since(start).Round(100*time.Millisecond))
	return pushed
}

// firstHourBlocks are the README's first-hour blocks with the published
// registry in place of the project's, and helm told to speak plain HTTP to
// it (helm, unlike containerd and go-containerregistry, does not choose it
// by itself for a loopback registry).
func firstHourBlocks(t *testing.T, published string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := markedBlocks(b, "README.md", firstHourMarker)
	if err != nil {
		t.Fatal(err)
	}
	for i := range blocks {
		blocks[i] = strings.ReplaceAll(blocks[i], projectRegistry, published)
		chart := "oci://" + published + "/charts/consul-cni-repair"
		blocks[i] = strings.ReplaceAll(blocks[i], chart, chart+" --plain-http")
	}
	return blocks
}

// consulCNIStandIn is consul-k8s's CNI DaemonSet as its chart names it
// (release consul: namespace consul, DaemonSet consul-cni, pods labelled
// app=consul,component=cni), running the pause image: what the README's
// hand-over acts on. Its pods run on both nodes first. Its namespace is
// its own for the test: gone when the test ends, so the next test that
// makes it does not find it terminating.
func consulCNIStandIn(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	ctx := context.Background()
	freshNamespace(t, c, consulK8sNS)
	labels := map[string]string{"app": "consul", "component": "cni"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: consulK8sDS, Namespace: consulK8sNS, Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers:  []corev1.Container{{Name: "install-cni", Image: realnode.PauseImage, ImagePullPolicy: corev1.PullNever}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().DaemonSets(consulK8sNS).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 3*time.Minute, "consul-k8s's CNI DaemonSet (stand-in) Ready on both nodes", func() error {
		return podsReady(ctx, c, consulK8sNS, consulK8sSelector, "", 2)
	})
}

// checkFirstInstall: after the README's install, hand-over and verify
// blocks, the installer runs from the registry's image on both nodes with
// consul-cni last in their chain, the controller runs in audit mode and
// labelled no node, and consul-k8s's CNI pods are gone.
func checkFirstInstall(t *testing.T, c *cluster.Cluster, nodes []*realnode.Node, published string) {
	t.Helper()
	ctx := context.Background()
	for _, n := range nodes {
		if last := lastPlugin(t, n); last != cniconf.PluginType {
			t.Errorf("node %s: last plugin %q, want %s", n.Name, last, cniconf.PluginType)
		}
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := node.Labels["consul.hashicorp.com/cni"]; ok {
			t.Errorf("node %s labelled %v in audit mode", n.Name, node.Labels)
		}
	}
	pods, err := c.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) < 4 {
		t.Errorf("%d pods in %s, want 2 installers and 2 controllers", len(pods.Items), namespace)
	}
	controllers := 0
	for _, p := range pods.Items {
		for _, ct := range p.Spec.Containers {
			if !strings.HasPrefix(ct.Image, published+"/") {
				t.Errorf("pod %s runs %s, not an image of %s", p.Name, ct.Image, published)
			}
		}
		if p.Labels["app.kubernetes.io/component"] != "controller" {
			continue
		}
		controllers++
		if !contains(p.Spec.Containers[0].Args, "--dry-run=true") {
			t.Errorf("controller pod %s without --dry-run=true: %v", p.Name, p.Spec.Containers[0].Args)
		}
	}
	if controllers != 2 {
		t.Errorf("%d controller pods (app.kubernetes.io/component=controller), want 2", controllers)
	}
	poll.Eventually(t, 2*time.Minute, "consul-k8s's CNI pods gone after the hand-over", func() error {
		l, err := c.Client.CoreV1().Pods(consulK8sNS).List(ctx, metav1.ListOptions{LabelSelector: consulK8sSelector})
		if err == nil && len(l.Items) > 0 {
			err = fmt.Errorf("%d pods left, %s among them", len(l.Items), l.Items[0].Name)
		}
		return err
	})
}

// pulled matches the kubelet's Pulled Event: `Successfully pulled image
// "<ref>" in 1.234s (1.234s including waiting). Image size: 123 bytes.`
var pulled = regexp.MustCompile(`Successfully pulled image "([^"]+)" in ([^ ]+) .*Image size: ([0-9]+) bytes`)

// logPulls logs every pull of a published image the kubelets reported, and
// fails when none was reported (the nodes did not pull from the registry).
func logPulls(t *testing.T, c *cluster.Cluster, published string) {
	t.Helper()
	evs, err := c.Client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=Pulled"})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if m := pulled.FindStringSubmatch(e.Message); m != nil && strings.HasPrefix(m[1], published+"/") {
			n++
			t.Logf("pulled %s on %s in %s, %s bytes", m[1], e.Source.Host, m[2], m[3])
		}
	}
	if n == 0 {
		t.Errorf("no kubelet reported pulling an image of %s", published)
	}
}

// waitNamespaceGone waits until ns does not exist (another test's may still
// be terminating).
func waitNamespaceGone(t *testing.T, c *cluster.Cluster, ns string) {
	t.Helper()
	poll.Eventually(t, 3*time.Minute, "namespace "+ns+" gone", func() error {
		_, err := c.Client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}

// freshNamespace makes namespace ns for the test alone: one another test
// left (or is still deleting) is removed first, since a terminating
// namespace refuses new objects. At the test's end ns is removed again, so
// the next test that makes it starts clean.
func freshNamespace(t *testing.T, c *cluster.Cluster, ns string) {
	t.Helper()
	removeNamespace(t, c, ns)
	if _, err := c.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	t.Cleanup(func() { removeNamespace(t, c, ns) })
}

// removeNamespace deletes namespace ns if it exists and waits until it is
// gone.
func removeNamespace(t *testing.T, c *cluster.Cluster, ns string) {
	t.Helper()
	err := c.Client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete namespace %s: %v", ns, err)
	}
	waitNamespaceGone(t, c, ns)
}
