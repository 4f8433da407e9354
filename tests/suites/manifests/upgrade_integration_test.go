//go:build integration

package manifests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/podnet"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/simnode"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// versionedInstaller is an installer build stamped with one version, with
// the consul-cni of the same version next to it (the plugin it installs).
type versionedInstaller struct {
	version, installer, plugin string
}

// versionedInstallers builds the installer and the plugin once per version,
// each pair in a directory of its own, as two image tags ship them.
func versionedInstallers(t *testing.T, versions ...string) []versionedInstaller {
	t.Helper()
	var out []versionedInstaller
	for _, v := range versions {
		// Reachable by every user: pods of the chart may run as non-root.
		// A killed run's directories go at the next run.
		proc.RemoveStale(filepath.Join(os.TempDir(), "ccr-installer-"+v+"-*"))
		dir, err := os.MkdirTemp("", "ccr-installer-"+v+"-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := proc.MarkOwned(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		vi := versionedInstaller{version: v, installer: filepath.Join(dir, "consul-cni-installer"), plugin: filepath.Join(dir, cniconf.PluginType)}
		if err := podnet.CopyExecutable(testbin.ProjectVersion(t, "consul-cni-installer", v), vi.installer); err != nil {
			t.Fatal(err)
		}
		if err := podnet.CopyExecutable(testbin.ProjectVersion(t, cniconf.PluginType, v), vi.plugin); err != nil {
			t.Fatal(err)
		}
		out = append(out, vi)
	}
	return out
}

// ready runs this version's `ready` against the node's directories, as the
// DaemonSet's readiness probe does.
func (vi versionedInstaller) ready(node *simnode.Node) error {
	var out bytes.Buffer
	cmd := exec.Command(vi.installer, "ready", "--cni-bin-dir="+node.BinDir(), "--cni-net-dir="+node.ConfDir(), "--host-cni-net-dir=/etc/cni/net.d")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// podSamples is what the sampler saw of one installer pod.
type podSamples struct {
	tag                 string
	samples, readyCount int
	// notReady counts samples after the pod was first Ready and before its
	// deletion began in which it was not Ready.
	notReady int
}

// overlapSampler samples every 100 ms, through a rolling update of the
// installer DaemonSet: the installer pods on the node (Ready condition, set
// by the node from their real readiness probes), the node's readiness
// label and startup taint, and each installer version's own `ready` run
// against the node's directories.
type overlapSampler struct {
	mu         sync.Mutex
	samples    int
	both       int // samples with two installer pods on the node
	labelSeen  bool
	labelDrops []string // sample times (since the start) without the label once it was seen
	taintBack  []string
	pods       map[string]*podSamples
	ready      map[string][2]int // version -> samples, failures of its `ready` once its pod was Ready
	before     map[string][2]int // the same before a pod of the version was first Ready
	firstFail  map[string]string
	errs       []string
	start      time.Time
	stop, done chan struct{}
}

func sampleOverlap(c *cluster.Cluster, ns string, node *simnode.Node, versions []versionedInstaller) *overlapSampler {
	s := &overlapSampler{pods: map[string]*podSamples{}, ready: map[string][2]int{}, before: map[string][2]int{}, firstFail: map[string]string{},
		start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			s.sample(c, ns, node, versions)
		}
	}()
	return s
}

func (s *overlapSampler) sample(c *cluster.Cluster, ns string, node *simnode.Node, versions []versionedInstaller) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	at := time.Since(s.start).Round(time.Millisecond).String()
	n, nerr := c.Client.CoreV1().Nodes().Get(ctx, node.Name(), metav1.GetOptions{})
	pods, perr := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + installerName})
	results := map[string]error{}
	for _, vi := range versions {
		results[vi.version] = vi.ready(node)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if nerr != nil || perr != nil {
		s.errs = append(s.errs, fmt.Sprintf("%s: node %v, pods %v", at, nerr, perr))
		return
	}
	s.samples++
	labelled := n.Labels[annotations.LabelCNIReady] == annotations.LabelCNIReadyValue
	if labelled {
		s.labelSeen = true
	} else if s.labelSeen {
		s.labelDrops = append(s.labelDrops, at)
	}
	for _, tn := range n.Spec.Taints {
		if tn.Key == annotations.TaintCNINotReady && s.labelSeen {
			s.taintBack = append(s.taintBack, at)
		}
	}
	onNode := 0
	for _, p := range pods.Items {
		if p.Spec.NodeName != node.Name() {
			continue
		}
		onNode++
		ps := s.pods[p.Name]
		if ps == nil {
			ps = &podSamples{tag: p.Spec.Containers[0].Image[strings.LastIndexByte(p.Spec.Containers[0].Image, ':')+1:]}
			s.pods[p.Name] = ps
		}
		ps.samples++
		switch {
		case podIsReady(&p):
			ps.readyCount++
		case ps.readyCount > 0 && p.DeletionTimestamp == nil:
			ps.notReady++
		}
	}
	if onNode > 1 {
		s.both++
	}
	for v, err := range results {
		// Before its own pod is Ready a newer version's `ready` fails:
		// the binary is still the older one's. Those samples are counted
		// apart.
		counts, running := s.before, s.versionWasReady(v)
		if running {
			counts = s.ready
		}
		r := counts[v]
		r[0]++
		if err != nil {
			r[1]++
			if running && s.firstFail[v] == "" {
				s.firstFail[v] = at + ": " + err.Error()
			}
		}
		counts[v] = r
	}
}

// more waits until the sampler has taken n more samples.
func (s *overlapSampler) more(t *testing.T, n int) {
	t.Helper()
	s.mu.Lock()
	want := s.samples + n
	s.mu.Unlock()
	poll.Eventually(t, time.Minute, fmt.Sprintf("%d more samples of the node and the installers", n), func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.samples >= want
	})
}

// versionWasReady tells whether a pod of version v was seen Ready.
func (s *overlapSampler) versionWasReady(v string) bool {
	for _, ps := range s.pods {
		if ps.tag == v && ps.readyCount > 0 {
			return true
		}
	}
	return false
}

func podIsReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// finish stops the sampling, logs the figures and fails the test if the
// label dropped or the taint came back after the label was first seen, if
// an installer pod turned not Ready while it ran, or if an installer
// version's own `ready` failed at any sample.
func (s *overlapSampler) finish(t *testing.T) {
	t.Helper()
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.pods))
	for name := range s.pods {
		names = append(names, name)
	}
	sort.Strings(names)
	var pods []string
	for _, name := range names {
		ps := s.pods[name]
		pods = append(pods, fmt.Sprintf("%s (%s): %d samples, %d Ready, %d not Ready while running", name, ps.tag, ps.samples, ps.readyCount, ps.notReady))
		if ps.notReady > 0 {
			t.Errorf("installer pod %s (%s) was not Ready in %d samples between its first Ready and its deletion", name, ps.tag, ps.notReady)
		}
	}
	t.Logf("overlap sampling every 100 ms over %v: %d samples, %d with two installer pods on the node; node label %s=%s absent in %d samples after it first appeared, startup taint back in %d; pods: %s; `ready` (samples, failures) per version once its pod was Ready: %v, before: %v",
		time.Since(s.start).Round(100*time.Millisecond), s.samples, s.both, annotations.LabelCNIReady, annotations.LabelCNIReadyValue,
		len(s.labelDrops), len(s.taintBack), strings.Join(pods, "; "), s.ready, s.before)
	if len(s.errs) > 0 {
		t.Logf("samples lost to API errors: %d, first: %s", len(s.errs), s.errs[0])
	}
	if !s.labelSeen || s.samples == 0 {
		t.Errorf("the node label was never seen in %d samples", s.samples)
	}
	if len(s.labelDrops) > 0 {
		t.Errorf("node label removed during the rollout, at %v", s.labelDrops)
	}
	if len(s.taintBack) > 0 {
		t.Errorf("startup taint back during the rollout, at %v", s.taintBack)
	}
	if s.both == 0 {
		t.Errorf("no sample saw the old and the new installer pod on the node together: no overlap was sampled")
	}
	for v, f := range s.firstFail {
		t.Errorf("installer %s `ready` failed in %d of %d samples, first at %s", v, s.ready[v][1], s.ready[v][0], f)
	}
}

// installerWrites counts, per installer pod on the node (from its
// container logs, every instance), the passes in which it wrote the plugin
// binary and the chain entry.
func installerWrites(t *testing.T, node *simnode.Node, ns string) map[string][2]int {
	t.Helper()
	files, err := node.LogFiles()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]int{}
	for _, f := range files {
		if f.Namespace != ns || f.Container != "installer" || !strings.HasPrefix(f.Pod, installerName+"-") {
			continue
		}
		b, err := os.ReadFile(f.Path)
		if err != nil {
			t.Fatal(err)
		}
		w := out[f.Pod]
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, "Updated the node's CNI installation") {
				continue
			}
			if strings.Contains(line, `"binary"`) {
				w[0]++
			}
			if strings.Contains(line, `"chain `) {
				w[1]++
			}
		}
		out[f.Pod] = w
	}
	return out
}

// checkNewerRemains: the node's plugin binary is the newer version's and
// the owner record beside the chain names that version.
func checkNewerRemains(t *testing.T, node *simnode.Node, newer versionedInstaller) {
	t.Helper()
	got, err := os.ReadFile(filepath.Join(node.BinDir(), cniconf.PluginType))
	want, werr := os.ReadFile(newer.plugin)
	if err != nil || werr != nil || !bytes.Equal(got, want) {
		t.Errorf("the node's %s is not the %s build (%d bytes vs %d; %v, %v)", cniconf.PluginType, newer.version, len(got), len(want), err, werr)
	}
	b, err := os.ReadFile(filepath.Join(node.ConfDir(), cniconf.OwnerFileName))
	var owner struct {
		Version string `json:"version"`
		Pod     string `json:"pod"`
	}
	if err != nil || json.Unmarshal(b, &owner) != nil || owner.Version != newer.version {
		t.Errorf("%s: %s (%v), want version %s", cniconf.OwnerFileName, b, err, newer.version)
	}
	plugins, err := node.NetworkPlugins()
	if err != nil || len(plugins) == 0 || plugins[len(plugins)-1] != cniconf.PluginType {
		t.Errorf("the node's chain %v (%v), want %s last", plugins, err, cniconf.PluginType)
	}
	t.Logf("after the rollout: %s is the %s build, %s names %s (pod %s), chain %v", cniconf.PluginType, newer.version, cniconf.OwnerFileName, owner.Version, owner.Pod, plugins)
}
