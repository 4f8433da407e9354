//go:build integration

package installer_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// writeCounter counts the renames onto the plugin binary and the primary
// conflist: every write of the installer (and of nothing else here) ends
// in one.
type writeCounter struct {
	mu      sync.Mutex
	binary  int
	chain   int
	watcher *fsnotify.Watcher
}

func countWrites(t *testing.T, n node, conflist string) *writeCounter {
	t.Helper()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{n.bin, n.net} {
		if err := w.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	wc := &writeCounter{watcher: w}
	go func() {
		for ev := range w.Events {
			if !ev.Has(fsnotify.Create) {
				continue
			}
			wc.mu.Lock()
			switch ev.Name {
			case filepath.Join(n.bin, cniconf.PluginType):
				wc.binary++
			case conflist:
				wc.chain++
			}
			wc.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Close() })
	return wc
}

func (wc *writeCounter) counts() (binary, chain int) {
	wc.mu.Lock()
	defer wc.mu.Unlock()
	return wc.binary, wc.chain
}

// readinessSampler runs each node view's `ready` every 100 ms (the whole
// check: chain and directory watch) and counts the failures.
type readinessSampler struct {
	mu       sync.Mutex
	samples  map[string]int
	failures map[string][]string
	stop     chan struct{}
	done     sync.WaitGroup
}

func sampleReadiness(t *testing.T, views map[string]node) *readinessSampler {
	s := &readinessSampler{samples: map[string]int{}, failures: map[string][]string{}, stop: make(chan struct{})}
	for name, v := range views {
		s.done.Add(1)
		go func() {
			defer s.done.Done()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-s.stop:
					return
				case <-tick.C:
				}
				err := v.watching(t)
				s.mu.Lock()
				s.samples[name]++
				if err != nil {
					s.failures[name] = append(s.failures[name], err.Error())
				}
				s.mu.Unlock()
			}
		}()
	}
	return s
}

func (s *readinessSampler) finish() {
	close(s.stop)
	s.done.Wait()
}

// overlapCase is one way two installers overlap on a node.
type overlapCase struct {
	name             string
	oldVer, newVer   string
	newPlugin        bool     // the newer installer installs another plugin binary
	oldArgs, newArgs []string // flags of each
	// wantBinary and wantChain are the writes of the binary and the list
	// during the overlap; wantBackend the final entry's backend ("" unset).
	wantBinary, wantChain int
	wantBackend           string
}

var overlapCases = []overlapCase{
	// A rolling update from v0.1.0 to v0.2.0: the newer one writes the
	// binary and the entry once, the older never writes them back.
	{name: "newer version", oldVer: "v0.1.0", newVer: "v0.2.0-3-gabcdef0", newPlugin: true,
		oldArgs: []string{"--log-level", "info"}, newArgs: []string{"--log-level", "debug"}, wantBinary: 1, wantChain: 1},
	// A rollout restart (or a helm upgrade of the log level) of one
	// version: the pod in place keeps the installation until it is
	// deleted, then the new one writes its entry once.
	{name: "same version", oldVer: "v0.2.0", newVer: "v0.2.0",
		oldArgs: []string{"--log-level", "info"}, newArgs: []string{"--log-level", "debug"}, wantBinary: 0, wantChain: 1},
	// helm upgrade --set installer.backend=nftables: the same, and the
	// entry ends with the new backend.
	{name: "backend switch", oldVer: "v0.2.0", newVer: "v0.2.0",
		oldArgs: []string{"--backend", "iptables"}, newArgs: []string{"--backend", "nftables"}, wantBinary: 0, wantChain: 1, wantBackend: "nftables"},
}

// Two installers overlap on one node (a DaemonSet rolling update with
// surge, helm upgrade): the installer builds (stamped with their
// versions, their flags) run side by side for several resync and recheck
// passes, then the old pod is deleted and its installer stops. Each case
// states the writes of the binary and the list it allows; both installers
// report Ready at every 100 ms sample through the overlap.
func TestUpgradeOverlapWithoutChurn(t *testing.T) {
	c := cluster.Shared(t)
	for _, oc := range overlapCases {
		t.Run(oc.name, func(t *testing.T) { testOverlap(t, c, oc) })
	}
}

func testOverlap(t *testing.T, c *cluster.Cluster, oc overlapCase) {
	ns := setupNamespace(t, c)
	n := newInstallerHost(t)
	conflist := filepath.Join(n.net, "10-kindnet.conflist")
	if err := os.WriteFile(conflist, []byte(kindnet), 0o644); err != nil {
		t.Fatal(err)
	}
	older, newer := n, n
	older.installer = testbin.ProjectVersion(t, "consul-cni-installer", oc.oldVer)
	newer.installer = testbin.ProjectVersion(t, "consul-cni-installer", oc.newVer)
	if oc.newPlugin {
		newer.plugin = filepath.Join(n.root, "image2/consul-cni")
		if err := os.MkdirAll(filepath.Dir(newer.plugin), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(newer.plugin, []byte("#!/bin/sh\n# "+oc.newVer+"\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	a := newInstallerPod(t, c, ns, "consul-cni-old", t.TempDir())
	pa := older.start(t, c, a, oc.oldArgs...)
	poll.Eventually(t, 2*time.Minute, "older installer ready", func() error { return older.watching(t) })

	wc := countWrites(t, n, conflist)
	olderOnly := sampleReadiness(t, map[string]node{"older": older})
	b := newInstallerPod(t, c, ns, "consul-cni-new", t.TempDir())
	newer.start(t, c, b, oc.newArgs...)
	poll.Eventually(t, 2*time.Minute, "newer installer ready", func() error { return newer.watching(t) })
	olderOnly.finish()
	both := sampleReadiness(t, map[string]node{"older": older, "newer": newer})
	// Overlap: several resync (2 s) and recheck passes of both.
	time.Sleep(7 * time.Second)
	// The old pod goes: its deletion starts, then it stops.
	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), a.pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pa.Stop(10 * time.Second)
	time.Sleep(5 * time.Second)
	both.finish()

	bin, chain := wc.counts()
	t.Logf("%s: writes during the overlap: binary %d, chain entry %d; readiness samples %v", oc.name, bin, chain, both.samples)
	if bin != oc.wantBinary || chain != oc.wantChain {
		t.Errorf("writes during the overlap: binary %d, chain entry %d; want %d and %d", bin, chain, oc.wantBinary, oc.wantChain)
	}
	for name, f := range olderOnly.failures {
		t.Errorf("%s installer not ready while the newer one started (%d of %d samples), first: %s", name, len(f), olderOnly.samples[name], f[0])
	}
	for name, f := range both.failures {
		t.Errorf("%s installer not ready during the overlap (%d of %d samples), first: %s", name, len(f), both.samples[name], f[0])
	}
	if err := newer.watching(t); err != nil {
		t.Errorf("newer installer not ready after the older one stopped: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(n.bin, cniconf.PluginType))
	want, _ := os.ReadFile(newer.plugin)
	if err != nil || string(got) != string(want) {
		t.Errorf("installed plugin binary is not the newer one: %q (%v)", got, err)
	}
	checkLastEntry(t, conflist, oc)
}

// checkLastEntry checks the final entry is the newer installer's: its log
// level and backend.
func checkLastEntry(t *testing.T, conflist string, oc overlapCase) {
	t.Helper()
	raw, err := os.ReadFile(conflist)
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		Plugins []struct {
			Type     string `json:"type"`
			LogLevel string `json:"log_level"`
			Backend  string `json:"backend"`
		}
	}
	if err := json.Unmarshal(raw, &l); err != nil || len(l.Plugins) == 0 {
		t.Fatalf("list after the overlap: %v\n%s", err, raw)
	}
	e := l.Plugins[len(l.Plugins)-1]
	wantLevel := "info"
	for i, a := range oc.newArgs {
		if a == "--log-level" && i+1 < len(oc.newArgs) {
			wantLevel = oc.newArgs[i+1]
		}
	}
	if e.Type != cniconf.PluginType || e.LogLevel != wantLevel || e.Backend != oc.wantBackend {
		t.Errorf("last entry after the overlap: %+v; want the newer installer's (log level %q, backend %q)", e, wantLevel, oc.wantBackend)
	}
}
