//go:build integration

package manifests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

// helmCLI is the helm command pinned in tools/go.mod (the one `make helm`
// builds): $HELM when set, else built once per test process.
type helmCLI struct {
	bin, kubeconfig, home string
}

func newHelmCLI(t *testing.T, kubeconfig string) *helmCLI {
	t.Helper()
	bin := os.Getenv("HELM")
	if bin == "" {
		bin = filepath.Join(testbin.Dir(), "helm")
		tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
		if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("go", "build", "-o", tmp, "helm.sh/helm/v4/cmd/helm")
		cmd.Dir = filepath.Join(testbin.RepoRoot(), "tools")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build helm: %v\n%s", err, out)
		}
		if err := os.Rename(tmp, bin); err != nil {
			t.Fatal(err)
		}
	}
	return &helmCLI{bin: bin, kubeconfig: kubeconfig, home: t.TempDir()}
}

// run runs helm with its state (repositories, cache) in a directory of the
// test's own, and returns stdout.
func (h *helmCLI) run(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(h.bin, append(args, "--kubeconfig", h.kubeconfig)...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

type helmRelease struct {
	Name       string `json:"name"`
	Revision   any    `json:"revision"` // a string or a number, whichever helm writes
	Status     string `json:"status"`
	Chart      string `json:"chart"`
	AppVersion string `json:"app_version"`
}

func (h *helmCLI) list(t *testing.T, ns string) []helmRelease {
	t.Helper()
	var rels []helmRelease
	if err := json.Unmarshal([]byte(h.run(t, "list", "-n", ns, "-o", "json")), &rels); err != nil {
		t.Fatalf("helm list: %v", err)
	}
	return rels
}

// TestHelmInstallUpgradeUninstall installs the chart with the helm command
// into a fresh namespace of the local control plane with one simulated node
// (registered with the startup taint; the images' basenames run the real
// installer and controller), upgrades it to a second chart version and
// appVersion (new image tags), and uninstalls it.
func TestHelmInstallUpgradeUninstall(t *testing.T) {
	for _, cmd := range []string{"repair", "consul-cni-installer", "consul-cni"} {
		if _, err := os.Stat(filepath.Join(testbin.RepoRoot(), "cmd", cmd)); err != nil {
			t.Skipf("cmd/%s is not in this tree", cmd)
		}
	}
	c := cluster.Shared(t)
	a := newApplier(t, c)
	helm := newHelmCLI(t, c.Kubeconfig)
	ns := privilegedNamespace(t, c)
	// No Prometheus Operator in the local control plane; the controller
	// acts (the chart's default is audit mode, which labels no node).
	profiles := []string{"without-prometheus-operator.yaml", "evict.yaml"}
	profileArgs := []string{"-f", filepath.Join(chartDir(t), "profiles", profiles[0]), "-f", filepath.Join(chartDir(t), "profiles", profiles[1])}
	rendered := renderChartIn(t, ns, chartValues(t, profiles))
	removeClusterScoped(t, a, rendered) // left by the kustomize tests of this binary

	testbin.Project(t, "consul-cni")
	programs := map[string]string{
		"consul-cni-installer": testbin.Project(t, "consul-cni-installer"),
		"consul-cni-verifier":  testbin.Project(t, "consul-cni-verifier"),
		"repair":               testbin.Project(t, "repair"),
	}
	// The installer image of each appVersion runs its own build, stamped
	// with that version and shipping a plugin of that version.
	versions := versionedInstallers(t, "v0.1.0", "v0.2.0")
	for _, vi := range versions {
		programs["consul-cni-installer:"+vi.version] = vi.installer
	}
	node := simnode.StartForTest(t, c, testnet.Reserve(t), func(cfg *simnode.Config) {
		cfg.Taints = []corev1.Taint{{Key: annotations.TaintCNINotReady, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
		for k, v := range programs {
			cfg.Programs[k] = v
		}
	})
	t.Cleanup(func() { removeClusterScoped(t, a, rendered) })

	// install: helm waits for the DaemonSet and the Deployment to be ready.
	start := time.Now()
	helm.run(t, append([]string{"install", "ccr", chartDir(t), "-n", ns, "--wait", "--timeout", "8m"}, profileArgs...)...)
	helmDone := time.Since(start)
	holder := waitRollout(t, c, ns, node.Name(), "v0.1.0", "")
	t.Logf("helm install -> installer Ready, node %s cni=ready, controller leading (%s): %v (helm install --wait returned after %v)",
		node.Name(), holder, time.Since(start).Round(100*time.Millisecond), helmDone.Round(100*time.Millisecond))
	checkRelease(t, helm.list(t, ns), "1", "consul-cni-repair-0.1.0", "v0.1.0")

	// upgrade to a second chart version whose appVersion (the images' tag)
	// is new: both workloads roll, the node keeps its readiness. The
	// DaemonSet (maxSurge 1) starts the v0.2.0 installer beside the v0.1.0
	// one and deletes the old one once the new one is Ready; the sampler
	// watches the node label, the taint and both installers every 100 ms
	// through it, and 30 samples more with the new one alone.
	pkgDir := t.TempDir()
	helm.run(t, "package", chartDir(t), "--version", "0.2.0", "--app-version", "v0.2.0", "-d", pkgDir)
	start = time.Now()
	sampler := sampleOverlap(c, ns, node, versions)
	helm.run(t, append([]string{"upgrade", "ccr", filepath.Join(pkgDir, "consul-cni-repair-0.2.0.tgz"), "-n", ns, "--wait", "--timeout", "8m"}, profileArgs...)...)
	holder = waitRollout(t, c, ns, node.Name(), "v0.2.0", holder)
	sampler.more(t, 30)
	sampler.finish(t)
	t.Logf("helm upgrade to v0.2.0 -> both workloads rolled, controller leading (%s): %v", holder, time.Since(start).Round(100*time.Millisecond))
	checkRelease(t, helm.list(t, ns), "2", "consul-cni-repair-0.2.0", "v0.2.0")
	writes := installerWrites(t, node, ns)
	t.Logf("passes that wrote (binary, chain entry) per installer pod, over its whole life: %v", writes)
	if len(writes) != 2 {
		t.Errorf("installer pods with logs on the node: %v, want the v0.1.0 and the v0.2.0 one", writes)
	}
	for pod, w := range writes {
		if w[0] > 1 || w[1] > 1 {
			t.Errorf("installer pod %s wrote the binary %d times and the entry %d times, want at most once each", pod, w[0], w[1])
		}
	}
	checkNewerRemains(t, node, versions[1])

	// uninstall: the pre-delete hook switches the installer to removers and
	// completes once the node is clean; then every object of the release,
	// the hook's included, is gone, nothing of ours is left on the node and
	// a new non-injected pod starts there.
	uninstallRelease(t, helm, c, a, ns, chartValues(t, profiles), node)
	plainPodRuns(t, c, c.Namespace(t), node.Name())
	if rels := helm.list(t, ns); len(rels) != 0 {
		t.Errorf("helm list after uninstall: %+v", rels)
	}
}

// uninstallRelease runs `helm uninstall` of the release ccr in ns, whose
// pre-delete hook completes once every node is clean: nothing of ours is
// left on nodes when it returns, and then every object the chart renders
// with vals, the hook's included, and every pod of ns is gone. It returns
// how long helm uninstall took and how long until all was gone.
func uninstallRelease(t *testing.T, helm *helmCLI, c *cluster.Cluster, a *applier, ns string, vals map[string]any, nodes ...cniNode) (helmTook, goneAfter time.Duration) {
	t.Helper()
	ctx := context.Background()
	rendered, hooks, err := helmRender(chartDir(t), ns, vals)
	if err != nil || len(hooks) == 0 {
		t.Fatalf("the chart's hooks: %d (%v)", len(hooks), err)
	}
	start := time.Now()
	helm.run(t, "uninstall", "ccr", "-n", ns, "--wait", "--timeout", "8m")
	helmTook = time.Since(start)
	t.Logf("helm uninstall (pre-delete hook: every node clean): %v", helmTook.Round(100*time.Millisecond))
	for _, n := range nodes {
		assertNothingOfOurs(t, n)
	}
	all := append(rendered, hooks...)
	poll.Eventually(t, 3*time.Minute, "every rendered object deleted", func() error {
		for _, o := range all {
			ri, err := a.resource(o)
			if err != nil {
				return err
			}
			if _, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s %s/%s still there (%v)", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
		}
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) > 0 {
			return fmt.Errorf("pods left in %s: %d (%v)", ns, len(pods.Items), err)
		}
		return nil
	})
	goneAfter = time.Since(start)
	for _, n := range nodes {
		assertNothingOfOurs(t, n)
	}
	return helmTook, goneAfter
}

// privilegedNamespace is a fresh namespace labelled for the installer's
// hostPath volumes, as the README and docs/install.md tell users to create it.
func privilegedNamespace(t *testing.T, c *cluster.Cluster) string {
	t.Helper()
	ns := c.Namespace(t)
	patch := []byte(`{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"privileged"}}}`)
	if _, err := c.Client.CoreV1().Namespaces().Patch(context.Background(), ns, "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

func renderChartIn(t *testing.T, ns string, vals map[string]any) []*unstructured.Unstructured {
	t.Helper()
	objs, err := helmTemplateNamespace(chartDir(t), ns, vals)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	return objs
}

// resource is the dynamic client of an object's kind and namespace.
func (a *applier) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return a.dyn.Resource(m.Resource).Namespace(o.GetNamespace()), nil
	}
	return a.dyn.Resource(m.Resource), nil
}

// removeClusterScoped deletes the cluster-scoped objects the chart renders
// (fixed names, shared with the kustomize builds), so the release can own
// them, and waits until they are gone.
func removeClusterScoped(t *testing.T, a *applier, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	for _, o := range objs {
		if o.GetNamespace() != "" {
			continue
		}
		ri, err := a.resource(o)
		if err != nil {
			t.Fatal(err)
		}
		if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		poll.Eventually(t, time.Minute, "deleted "+o.GetKind()+" "+o.GetName(), func() error {
			if _, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there (%v)", err)
			}
			return nil
		})
	}
}

// waitRollout waits until the installer pod on node and both controller
// replicas run images tagged tag and are Ready, the node is labelled
// cni=ready without its startup taint, and a controller process other than
// oldHolder holds and renews the leader Lease; it returns the holder.
func waitRollout(t *testing.T, c *cluster.Cluster, ns, node, tag, oldHolder string) string {
	t.Helper()
	ctx := context.Background()
	poll.Eventually(t, 6*time.Minute, "installer Ready with tag "+tag, func() error {
		return podsReadyWithTag(ctx, c, ns, "app.kubernetes.io/name="+installerName, node, 1, tag)
	})
	poll.Eventually(t, 6*time.Minute, "controller replicas Ready with tag "+tag, func() error {
		return podsReadyWithTag(ctx, c, ns, "app.kubernetes.io/name="+controllerName, node, 2, tag)
	})
	poll.Eventually(t, 2*time.Minute, "node cni=ready without its startup taint", func() error {
		return nodeCNIReady(ctx, c.Client, node)
	})
	since := metav1.NowMicro()
	var holder string
	poll.Eventually(t, 3*time.Minute, "a current replica holds and renews the Lease", func() error {
		l, err := c.Client.CoordinationV1().Leases(ns).Get(ctx, controllerName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		h := l.Spec.HolderIdentity
		switch {
		case h == nil || *h == "":
			return fmt.Errorf("no holder")
		case *h == oldHolder:
			return fmt.Errorf("still held by %s, a replica of before", *h)
		case l.Spec.RenewTime == nil || l.Spec.RenewTime.Before(&since):
			return fmt.Errorf("%s has not renewed since %v", *h, since)
		}
		holder = *h
		return nil
	})
	return holder
}

// podsReadyWithTag is podsReady, and every pod of the selector (none left
// of the previous version) runs images ending in :tag.
func podsReadyWithTag(ctx context.Context, c *cluster.Cluster, ns, selector, node string, want int, tag string) error {
	if err := podsReady(ctx, c, ns, selector, node, want); err != nil {
		return err
	}
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return err
	}
	if len(l.Items) != want {
		return fmt.Errorf("%d pods of %s, want %d", len(l.Items), selector, want)
	}
	for _, p := range l.Items {
		for _, ctr := range p.Spec.Containers {
			if !strings.HasSuffix(ctr.Image, ":"+tag) {
				return fmt.Errorf("pod %s runs %s, want tag %s", p.Name, ctr.Image, tag)
			}
		}
	}
	return nil
}

func checkRelease(t *testing.T, rels []helmRelease, revision, chart, appVersion string) {
	t.Helper()
	if len(rels) != 1 {
		t.Fatalf("helm list: %+v, want one release", rels)
	}
	r := rels[0]
	if fmt.Sprint(r.Revision) != revision || r.Status != "deployed" || r.Chart != chart || r.AppVersion != appVersion {
		t.Errorf("helm list: %+v, want revision %s deployed, chart %s, app version %s", r, revision, chart, appVersion)
	}
}
