//go:build integration

package main_test

import (
	"context"
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

// readinessSampler runs each node view's `ready` every 100 ms and counts
// the failures.
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
				err := v.ready(t)
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

// A rolling update from v0.1.0 to v0.2.0 on one node: the two installer
// builds (stamped with different versions, installing different plugin
// binaries and entries) overlap. The newer one writes the binary and the
// entry once, the older one never writes them back, and both report Ready
// at every 100 ms sample through the overlap.
func TestUpgradeOverlapWithoutChurn(t *testing.T) {
	c := cluster.Shared(t)
	ns := setupNamespace(t, c)
	n := newInstallerHost(t)
	conflist := filepath.Join(n.net, "10-kindnet.conflist")
	if err := os.WriteFile(conflist, []byte(kindnet), 0o644); err != nil {
		t.Fatal(err)
	}
	older, newer := n, n
	older.installer = testbin.ProjectVersion(t, "consul-cni-installer", "v0.1.0")
	newer.installer = testbin.ProjectVersion(t, "consul-cni-installer", "v0.2.0-3-gabcdef0")
	newer.plugin = filepath.Join(n.root, "image2/consul-cni")
	if err := os.MkdirAll(filepath.Dir(newer.plugin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(newer.plugin, []byte("#!/bin/sh\n# v0.2.0\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}

	a := newInstallerPod(t, c, ns, "consul-cni-old", t.TempDir())
	pa := older.start(t, c, a, "--log-level", "info")
	poll.Eventually(t, 2*time.Minute, "older installer ready", func() error { return older.ready(t) })

	wc := countWrites(t, n, conflist)
	olderOnly := sampleReadiness(t, map[string]node{"older": older})
	b := newInstallerPod(t, c, ns, "consul-cni-new", t.TempDir())
	pb := newer.start(t, c, b, "--log-level", "debug")
	poll.Eventually(t, 2*time.Minute, "newer installer ready", func() error { return newer.ready(t) })
	olderOnly.finish()
	both := sampleReadiness(t, map[string]node{"older": older, "newer": newer})
	// Overlap: several resync (2 s) and recheck passes of both.
	time.Sleep(7 * time.Second)
	// The old pod goes: its deletion starts, then it stops.
	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), a.pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pa.Stop(10 * time.Second)
	time.Sleep(3 * time.Second)
	both.finish()
	_ = pb

	bin, chain := wc.counts()
	t.Logf("writes during the overlap: binary %d, chain entry %d; readiness samples %v", bin, chain, both.samples)
	if bin != 1 || chain != 1 {
		t.Errorf("writes during the overlap: binary %d, chain entry %d; want exactly 1 each (the newer installer's)", bin, chain)
	}
	for name, f := range olderOnly.failures {
		t.Errorf("%s installer not ready while the newer one started (%d of %d samples), first: %s", name, len(f), olderOnly.samples[name], f[0])
	}
	for name, f := range both.failures {
		t.Errorf("%s installer not ready during the overlap (%d of %d samples), first: %s", name, len(f), both.samples[name], f[0])
	}
	if err := newer.ready(t); err != nil {
		t.Errorf("newer installer not ready after the older one stopped: %v", err)
	}
	got, err := os.ReadFile(filepath.Join(n.bin, cniconf.PluginType))
	want, _ := os.ReadFile(newer.plugin)
	if err != nil || string(got) != string(want) {
		t.Errorf("installed plugin binary is not the newer one: %q (%v)", got, err)
	}
}
