//go:build integration

package installer_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/consulk8s"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
)

var migrationTrials = flag.Int("consulk8s.trials", 50, "trials of TestMigrationFromConsulK8sInstaller (consul-k8s's installer stopped, our chain restored)")

// syncWriter serialises the writes of a log shared by processes.
type syncWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// consulK8sNode is a host tree (newInstallerHost) with consul-k8s's real
// install-cni run on it as the container of pods of its own.
type consulK8sNode struct {
	node
	t    *testing.T
	c    *cluster.Cluster
	ns   string
	bins consulk8s.Binaries
	n    int
	// current is the installer besideFreshConsulK8s started last.
	current *consulk8s.Installer
}

func newConsulK8sNode(t *testing.T) *consulK8sNode {
	t.Helper()
	bins := consulk8s.Unpack(t)
	c := cluster.Shared(t)
	k := &consulK8sNode{node: newInstallerHost(t), t: t, c: c, ns: setupNamespace(t, c), bins: bins}
	if err := os.WriteFile(k.conflist(), []byte(kindnet), 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}

func (k *consulK8sNode) conflist() string { return filepath.Join(k.net, "10-kindnet.conflist") }

// startConsulK8s runs install-cni as a new pod's container (its
// pod-bound token, its UID as the installation id), with the flags of
// consul-k8s's chart.
func (k *consulK8sNode) startConsulK8s() *consulk8s.Installer {
	t := k.t
	t.Helper()
	k.n++
	name := fmt.Sprintf("consul-k8s-cni-%d", k.n)
	ip := newInstallerPod(t, k.c, k.ns, name, t.TempDir())
	log := &syncWriter{}
	ri, err := consulk8s.Start(k.bins, consulk8s.Options{
		BinDir: k.bin, NetDir: k.net, InstallationID: string(ip.pod.UID),
		Server: k.c.Server, CA: k.c.CAData, TokenFile: ip.tokenFile, Log: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ri.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("%s (consul-k8s's install-cni) log:\n%s", name, log.String())
		}
	})
	return ri
}

// lastEntryKubeconfig is the kubeconfig the last plugin of the list names
// when it is consul-cni, "" otherwise.
func (k *consulK8sNode) lastEntryKubeconfig() string {
	b, err := os.ReadFile(k.conflist())
	if err != nil {
		return ""
	}
	var l struct {
		Plugins []struct{ Type, Kubeconfig string }
	}
	if json.Unmarshal(b, &l) != nil || len(l.Plugins) == 0 || l.Plugins[len(l.Plugins)-1].Type != cniconf.PluginType {
		return ""
	}
	return l.Plugins[len(l.Plugins)-1].Kubeconfig
}

// waitChainedBy waits for ri's entry to be the last plugin and its
// kubeconfig to exist.
func (k *consulK8sNode) waitChainedBy(ri *consulk8s.Installer) {
	k.t.Helper()
	poll.Eventually(k.t, 3*time.Minute, "consul-k8s's installer chained its entry", func() error {
		if kc := k.lastEntryKubeconfig(); kc != filepath.Base(ri.Kubeconfig()) {
			return fmt.Errorf("last entry names kubeconfig %q", kc)
		}
		_, err := os.Stat(ri.Kubeconfig())
		return err
	})
}

// servedByOurs checks what a runtime runs for the chain: our plugin binary
// (whoever's entry it is), and an entry whose kubeconfig exists.
func (k *consulK8sNode) servedByOurs() error {
	got, err := os.ReadFile(filepath.Join(k.bin, cniconf.PluginType))
	want, _ := os.ReadFile(k.plugin)
	if err != nil || !bytes.Equal(got, want) {
		return fmt.Errorf("the plugin binary is not ours (%v)", err)
	}
	kc := k.lastEntryKubeconfig()
	if kc == "" {
		return errors.New("consul-cni is not the last plugin")
	}
	_, err = os.Stat(filepath.Join(k.net, kc))
	return err
}

// chainComplete tells whether the runtime would run the plugin on the node
// with our credentials at hand: binary, our kubeconfig and token in place
// and consul-cni the last plugin of the list (ours, or consul-k8s's while
// its installer runs).
func (n node) chainComplete(conflist string) bool {
	for _, f := range []string{filepath.Join(n.bin, cniconf.PluginType), filepath.Join(n.net, cniconf.KubeconfigFileName), filepath.Join(n.net, cniconf.TokenFileName)} {
		if _, err := os.Stat(f); err != nil {
			return false
		}
	}
	b, err := os.ReadFile(conflist)
	if err != nil {
		return false
	}
	var l struct{ Plugins []struct{ Type string } }
	if json.Unmarshal(b, &l) != nil || len(l.Plugins) == 0 {
		return false
	}
	return l.Plugins[len(l.Plugins)-1].Type == cniconf.PluginType
}

// restoreGap polls the chain every millisecond (a poller that never
// sleeps would take a core from the installers on a small machine) from
// just before consul-k8s's installer is told to stop until it has exited
// and the chain has been complete for 200 ms. The gap runs from the first incomplete poll to the
// last return to complete (its cleanup takes the entry, then the binary:
// either may open a gap); broken is false when no poll saw the chain
// incomplete (restored between two polls).
func (k *consulK8sNode) restoreGap(exited <-chan struct{}) (gap time.Duration, broken bool, err error) {
	var broke, restored, completeSince time.Time
	gone := false
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		complete := k.chainComplete(k.conflist())
		now := time.Now()
		switch {
		case !complete:
			if broke.IsZero() {
				broke = now
			}
			restored, completeSince = time.Time{}, time.Time{}
		case completeSince.IsZero():
			completeSince = now
			if !broke.IsZero() {
				restored = now
			}
		}
		if !gone {
			select {
			case <-exited:
				gone = true
			default:
			}
		}
		if gone && complete && now.Sub(completeSince) >= 200*time.Millisecond {
			if broke.IsZero() {
				return 0, false, nil
			}
			return restored.Sub(broke), true, nil
		}
		time.Sleep(time.Millisecond)
	}
	return 0, !broke.IsZero(), errors.New("the chain was not complete again within 30 s of consul-k8s's cleanup")
}

// Our installer beside consul-k8s's real install-cni on one node's
// directories (step 1 of README "Coming from consul-k8s's CNI").
// consul-k8s's runs first; ours starts and leaves its entry (no write of
// the list), serving it with our binary. The list is then read every 5 ms
// for 10 s, three times, as a runtime creating sandboxes would: no change,
// no broken read, no write. Then consul-k8s's DaemonSet rolls (maxSurge 1:
// the new pod starts, the old one stops and cleans up): ours writes the
// list at most twice per write of consul-k8s's, and is still again after.
func TestBesideConsulK8sInstaller(t *testing.T) {
	k := newConsulK8sNode(t)
	ri := k.startConsulK8s()
	k.waitChainedBy(ri)
	wc, err := consulk8s.CountWrites(k.conflist())
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	ours := newInstallerPod(t, k.c, k.ns, "consul-cni-ours", t.TempDir())
	k.start(t, k.c, ours)
	poll.Eventually(t, 2*time.Minute, "our installer ready beside consul-k8s's", func() error { return k.ready(t) })
	poll.Eventually(t, time.Minute, "consul-k8s's entry served by our binary", k.servedByOurs)
	time.Sleep(time.Second)
	if w := wc.Reset(); w.Total() != 0 {
		t.Errorf("writes of the list while ours started beside consul-k8s's: %v; want none", w)
	}
	k.steadyState(wc, "beside consul-k8s's installer")

	next := k.startConsulK8s()
	time.Sleep(time.Second) // it waits for the binary to go (its pod's predecessor removes it)
	if code := ri.Stop(30 * time.Second); code != 0 {
		t.Errorf("consul-k8s's installer exited with %d after SIGTERM", code)
	}
	k.waitChainedBy(next)
	poll.Eventually(t, time.Minute, "consul-k8s's new entry served by our binary", k.servedByOurs)
	time.Sleep(2 * time.Second)
	w := wc.Reset()
	t.Logf("writes of the list during consul-k8s's rolling update: %v", w)
	switch {
	case w.InPlace == 0:
		t.Errorf("no write of consul-k8s's installer seen during its rolling update (%v)", w)
	case w.Renamed > 2*w.InPlace:
		t.Errorf("our installer wrote the list %d times for %d writes of consul-k8s's; want at most 2 per write", w.Renamed, w.InPlace)
	}
	k.steadyState(wc, "after consul-k8s's rolling update")
}

// steadyState samples the list every 5 ms for 10 s, three times: nothing
// may change or be written.
func (k *consulK8sNode) steadyState(wc *consulk8s.WriteCounter, when string) {
	k.t.Helper()
	for trial := 0; trial < 3; trial++ {
		s := consulk8s.Sample(k.conflist(), 5*time.Millisecond, 10*time.Second)
		w := wc.Reset()
		k.t.Logf("%s, 10 s steady state, trial %d: %v; writes %v", when, trial, s, w)
		if s.Changes != 0 || s.Broken != 0 || w.Total() != 0 {
			k.t.Errorf("%s, trial %d: the list changed: %v; writes %v", when, trial, s, w)
		}
	}
}

// Migration from consul-k8s's installer (step 2 of README "Coming from
// consul-k8s's CNI"): consul-k8s's real install-cni runs beside ours, then
// gets SIGTERM, as kubelet sends it when its DaemonSet's pod goes; its
// cleanup removes its entry (writing the list in place), the plugin binary
// and its kubeconfig. Ours puts its entry and the binary back. The gap
// (restoreGap) is measured over -consulk8s.trials trials and logged with
// its percentiles; every trial must end with our entry and binary.
func TestMigrationFromConsulK8sInstaller(t *testing.T) {
	k := newConsulK8sNode(t)
	ours := newInstallerPod(t, k.c, k.ns, "consul-cni-ours", t.TempDir())
	var gaps []time.Duration
	unseen := 0
	for i := 0; i < *migrationTrials; i++ {
		p := k.besideFreshConsulK8s(ours)
		ri := k.current
		if err := ri.Terminate(); err != nil {
			t.Fatal(err)
		}
		gap, broken, err := k.restoreGap(ri.Done())
		if err != nil {
			t.Fatalf("trial %d: %v", i, err)
		}
		if !broken {
			unseen++
		}
		gaps = append(gaps, gap)
		if kc := k.lastEntryKubeconfig(); kc != cniconf.KubeconfigFileName {
			t.Fatalf("trial %d: after consul-k8s's cleanup the last entry names %q, want ours", i, kc)
		}
		if err := k.servedByOurs(); err != nil {
			t.Fatalf("trial %d: %v", i, err)
		}
		p.Stop(10 * time.Second)
	}
	logGaps(t, gaps, unseen)
}

// besideFreshConsulK8s makes the starting point of a trial: a new
// consul-k8s installer chained, ours running beside it. consul-k8s's copies
// its binary at once only where none is installed (otherwise it waits up to
// 100 s for the binary to be removed), so the binary is removed while ours
// is stopped (which leaves everything in place) before it starts.
func (k *consulK8sNode) besideFreshConsulK8s(ours *installerPod) *proc.Process {
	k.t.Helper()
	if err := os.Remove(filepath.Join(k.bin, cniconf.PluginType)); err != nil && !os.IsNotExist(err) {
		k.t.Fatal(err)
	}
	k.current = k.startConsulK8s()
	k.waitChainedBy(k.current)
	p := k.start(k.t, k.c, ours)
	poll.Eventually(k.t, 2*time.Minute, "our installer ready beside consul-k8s's", func() error { return k.ready(k.t) })
	poll.Eventually(k.t, time.Minute, "consul-k8s's entry served by our binary", k.servedByOurs)
	// Step 2 follows once ours runs everywhere, not while it starts.
	time.Sleep(time.Second)
	return p
}

// logGaps logs the restore gaps' percentiles.
func logGaps(t *testing.T, gaps []time.Duration, unseen int) {
	t.Helper()
	if len(gaps) == 0 {
		return
	}
	slices.Sort(gaps)
	pct := func(p float64) time.Duration {
		i := int(float64(len(gaps))*p+0.999999) - 1
		return gaps[max(0, min(i, len(gaps)-1))]
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
	t.Logf("restore gap over %d trials: p50 %s, p99 %s, max %s (min %s; %d trials restored between two polls)",
		len(gaps), ms(pct(0.50)), ms(pct(0.99)), ms(gaps[len(gaps)-1]), ms(gaps[0]), unseen)
	all := make([]string, len(gaps))
	for i, g := range gaps {
		all[i] = ms(g)
	}
	t.Logf("all gaps: %s", strings.Join(all, ", "))
}
