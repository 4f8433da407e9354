//go:build integration

package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/repair"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// walkthroughKubectl is the kubectl the walkthrough runs: $CCR_KUBECTL,
// else the one `make kubectl` builds into the kube bin directory.
func walkthroughKubectl(t *testing.T) string {
	p, err := cluster.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLocalWalkthrough runs the local walkthrough as written, extracted
// from docs/demo.md, with kubectl on a local cluster started like
// `make cluster NODES=2` (its own control plane, the Prometheus Operator
// CRDs, two simulated nodes running the project's programs for the
// manifests' images), then checks what the page says happens: the audit
// reports the pod made to bypass (WouldRepair) without touching it, the
// evict overlay evicts it (BypassedCNI), and its replacement is meshed.
func TestLocalWalkthrough(t *testing.T) {
	page, err := os.ReadFile(filepath.Join(testbin.RepoRoot(), walkthroughPage))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := walkthroughBlocks(page)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) == 0 {
		t.Fatalf("%s has no %s block", walkthroughPage, walkthroughMarker)
	}
	kubectl := walkthroughKubectl(t)
	c, kubeconfig := startLocalCluster(t, 2)

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	script := "set -euxo pipefail\n" + strings.Join(blocks, "")
	out, err := runScript(ctx, script, testbin.RepoRoot(), []string{
		"KUBECONFIG=" + kubeconfig,
		"PATH=" + filepath.Dir(kubectl) + string(os.PathListSeparator) + os.Getenv("PATH"),
	})
	t.Logf("walkthrough:\n%s", out)
	if err != nil {
		t.Fatalf("the local walkthrough of %s failed: %v", walkthroughPage, err)
	}
	checkWalkthroughOutcome(t, c, out)
}

// runScript runs a bash script in its own process group, killed as a whole
// when ctx ends; it returns stdout and stderr interleaved.
func runScript(ctx context.Context, script, dir string, env []string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("%w (%v)", err, ctx.Err())
	}
	return out.String(), err
}

// startLocalCluster starts what `make cluster NODES=n` starts, for this test
// alone (the walkthrough installs cluster-wide objects), and writes its
// admin kubeconfig.
func startLocalCluster(t *testing.T, nodes int) (*cluster.Cluster, string) {
	for _, cmd := range simnode.ManifestImages {
		if _, err := os.Stat(filepath.Join(testbin.RepoRoot(), "cmd", cmd)); err != nil {
			t.Skipf("cmd/%s is not in this tree", cmd)
		}
	}
	r := testnet.Reserve(t)
	c, err := cluster.Start(context.Background(), cluster.Options{})
	if err != nil {
		t.Fatalf("local control plane: %v", err)
	}
	t.Cleanup(c.Stop)
	if err := c.InstallPrometheusOperatorCRDs(context.Background()); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig, c.Config, "admin"); err != nil {
		t.Fatal(err)
	}
	programs := simnode.ProjectPrograms(t)
	programs["podprog"] = testbin.Package(t, "podprog", "./tests/cmd/podprog")
	for i := 0; i < nodes; i++ {
		simnode.StartForTest(t, c, r, func(cfg *simnode.Config) {
			for k, v := range programs {
				cfg.Programs[k] = v
			}
		})
	}
	return c, kubeconfig
}

// checkWalkthroughOutcome checks the cluster after the walkthrough: one pod
// of the example was reported by the audit and then evicted, and the
// Deployment's pods are all meshed, none of them that one.
func checkWalkthroughOutcome(t *testing.T, c *cluster.Cluster, out string) {
	ctx := context.Background()
	would := eventObjects(t, c, repair.EventWouldRepair)
	evicted := eventObjects(t, c, repair.EventBypassedCNI)
	if len(would) != 1 {
		t.Fatalf("WouldRepair Events name %d pods (%v), want the one pod made to bypass", len(would), would)
	}
	var pod string
	for p := range would {
		pod = p
	}
	if len(evicted) != 1 || !evicted[pod] {
		t.Errorf("BypassedCNI Events name %v, want only %s, the pod the audit reported", evicted, pod)
	}
	if !strings.Contains(out, "pod=\""+exampleNamespace+"/"+pod+"\"") {
		t.Errorf("the walkthrough's output has no controller log line about pod %s/%s", exampleNamespace, pod)
	}
	if _, err := c.Client.CoreV1().Pods(exampleNamespace).Get(ctx, pod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod %s still exists after the walkthrough (get: %v)", pod, err)
	}
	poll.Eventually(t, 3*time.Minute, "the example's pods all meshed", func() error {
		l, err := c.Client.CoreV1().Pods(exampleNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + exampleApp})
		if err != nil {
			return err
		}
		return allMeshed(l.Items, pod)
	})
}

func allMeshed(pods []corev1.Pod, evicted string) error {
	if len(pods) != 2 {
		return fmt.Errorf("%d pods of %s, want 2", len(pods), exampleApp)
	}
	for _, p := range pods {
		if p.Name == evicted {
			return fmt.Errorf("evicted pod %s is back", p.Name)
		}
		if s := p.Annotations[annotations.KeyTransparentProxyStatus]; !annotations.IsComplete(s) || p.DeletionTimestamp != nil {
			return fmt.Errorf("pod %s: %s is %q (deleting: %v)", p.Name, annotations.KeyTransparentProxyStatus, s, p.DeletionTimestamp != nil)
		}
	}
	return nil
}

// eventObjects returns the names of the pods of the example namespace that
// Events of reason name.
func eventObjects(t *testing.T, c *cluster.Cluster, reason string) map[string]bool {
	l, err := c.Client.CoreV1().Events(exampleNamespace).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		t.Fatal(errors.Join(fmt.Errorf("list %s Events", reason), err))
	}
	names := map[string]bool{}
	for _, e := range l.Items {
		if e.InvolvedObject.Kind == "Pod" {
			names[e.InvolvedObject.Name] = true
		}
	}
	return names
}
