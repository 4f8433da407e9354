//go:build integration

package main_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// chainComplete tells whether the runtime would run the plugin on the node:
// binary, kubeconfig and token in place and consul-cni the last plugin of
// the primary list.
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

// Migration from consul-k8s's installer: ours runs beside a stand-in of
// consul-k8s's install-cni (same three paths, its own content, all removed
// on SIGTERM). While both run neither rewrites the other's files more than
// once; after the foreign cleanup ours restores a complete chain. The gap
// between the first incomplete and the next complete state (polled without
// sleeping) is measured over 20 trials.
func TestMigrationFromConsulK8sInstaller(t *testing.T) {
	c := cluster.Shared(t)
	ns := setupNamespace(t, c)
	n := newInstallerHost(t)
	conflist := filepath.Join(n.net, "10-kindnet.conflist")
	if err := os.WriteFile(conflist, []byte(kindnet), 0o644); err != nil {
		t.Fatal(err)
	}
	podprog := testbin.Package(t, "podprog", "./tests/cmd/podprog")
	foreignPlugin := filepath.Join(n.root, "consul-k8s/consul-cni")
	if err := os.MkdirAll(filepath.Dir(foreignPlugin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(foreignPlugin, []byte("#!/bin/sh\n# consul-k8s's plugin\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	foreign := newInstallerPod(t, c, ns, "consul-k8s-cni", t.TempDir())
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerTokenFile = foreign.tokenFile
	foreignKC := filepath.Join(filepath.Dir(foreign.tokenFile), "kubeconfig")
	if err := cluster.WriteKubeconfig(foreignKC, cfg, foreign.name); err != nil {
		t.Fatal(err)
	}

	ours := newInstallerPod(t, c, ns, "consul-cni-ours", t.TempDir())
	n.start(t, c, ours)
	poll.Eventually(t, 2*time.Minute, "our installer ready", func() error { return n.ready(t) })

	const trials = 20
	var gaps []time.Duration
	var writes [][2]int
	for i := 0; i < trials; i++ {
		wc := countWrites(t, n, conflist)
		cmd := exec.Command(podprog, "install-cni", "--bin-dir", n.bin, "--net-dir", n.net, "--plugin", foreignPlugin)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+foreignKC)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		p, err := proc.Start(cmd, "")
		if err != nil {
			t.Fatal(err)
		}
		// Both run: the stand-in has chained, ours put its own back.
		poll.Eventually(t, 2*time.Minute, "the binary written again after the stand-in started", func() error {
			if bin, _ := wc.counts(); bin == 0 {
				return errors.New("no write of the binary yet")
			}
			return nil
		})
		time.Sleep(1500 * time.Millisecond)
		poll.Eventually(t, 2*time.Minute, "our installer ready beside the stand-in", func() error { return n.ready(t) })
		bin, chain := wc.counts()
		wc.watcher.Close()
		writes = append(writes, [2]int{bin, chain})
		if bin > 2 || chain > 2 {
			t.Errorf("trial %d: writes while both ran: binary %d, chain %d; want at most 2 each (the stand-in's and ours)", i, bin, chain)
		}

		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		var broke time.Time
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			complete := n.chainComplete(conflist)
			if !complete && broke.IsZero() {
				broke = time.Now()
			}
			if complete && !broke.IsZero() {
				gaps = append(gaps, time.Since(broke))
				break
			}
			select {
			case <-p.Done():
				if broke.IsZero() && complete {
					// The cleanup was over and restored between two polls.
					gaps = append(gaps, 0)
					deadline = time.Time{}
				}
			default:
			}
		}
		<-p.Done()
		if len(gaps) != i+1 {
			t.Fatalf("trial %d: no complete chain within 30 s of the stand-in's cleanup", i)
		}
		poll.Eventually(t, 2*time.Minute, "our installer ready after the cleanup", func() error { return n.ready(t) })
	}
	slices.Sort(gaps)
	t.Logf("writes (binary, chain) while both ran, per trial: %v", writes)
	t.Logf("restore gap over %d trials: min %v, median %v, p99 (max) %v; all %v", trials, gaps[0], gaps[len(gaps)/2], gaps[len(gaps)-1], gaps)
}
