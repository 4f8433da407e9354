package simnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/podnet"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// TB is the part of testing.TB StartForTest uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
	Logf(format string, args ...any)
	Name() string
}

// nodeSeq numbers the nodes StartForTest names.
var nodeSeq atomic.Int64

// NewRoot makes a node root directory readable by any user (containers
// may run as non-root) with the primary network set up by SetupRoot.
func NewRoot(pluginDir string, r *testnet.Range, subnet int) (string, error) {
	proc.RemoveStale(filepath.Join(os.TempDir(), "ccr-node-*"))
	root, err := os.MkdirTemp("", "ccr-node-")
	if err != nil {
		return "", err
	}
	if err := proc.MarkOwned(root); err != nil {
		return "", err
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return "", err
	}
	return root, SetupRoot(root, pluginDir, r.Subnet4(subnet, 24))
}

// ManifestImages are the basenames of the images the manifests name; on
// simulated nodes they run the commands of the same name built from this
// tree (ProjectPrograms).
var ManifestImages = []string{"consul-cni-installer", "consul-cni-check", "repair"}

// ProjectPrograms builds the commands of ManifestImages that this tree has
// (and consul-cni next to the installer, which copies it from there, and the
// verifier, which the installer's image holds too) and
// returns them as Config.Programs entries.
func ProjectPrograms(tb testbin.TB) map[string]string {
	tb.Helper()
	programs := map[string]string{}
	for _, cmd := range ManifestImages {
		if _, err := os.Stat(filepath.Join(testbin.RepoRoot(), "cmd", cmd)); err == nil {
			programs[cmd] = testbin.Project(tb, cmd)
		}
	}
	if _, ok := programs["consul-cni-installer"]; ok {
		testbin.Project(tb, "consul-cni")
		// The installer's image also holds the verifier, which the
		// verifier DaemonSet runs (its command).
		if _, err := os.Stat(filepath.Join(testbin.RepoRoot(), "cmd", "consul-cni-verifier")); err == nil {
			programs["consul-cni-verifier"] = testbin.Project(tb, "consul-cni-verifier")
		}
	}
	return programs
}

// StartForTest starts a node for a test against the shared control plane:
// a fresh root with the primary network (ptp + host-local, a /24 of the
// test's address slot), podprog known as image "podprog", kubelet-like
// defaults with short back-offs; edit the config with mod (may be nil).
// The node is registered and Ready (its own taints still apply) when it
// returns, and is stopped (pods
// torn down, Node deleted, root removed) when the test ends.
func StartForTest(tb TB, c *cluster.Cluster, r *testnet.Range, mod func(*Config)) *Node {
	tb.Helper()
	idx, release, err := podnet.AllocSubnet()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(release)
	root, err := NewRoot(testbin.CNIPluginDir(tb), r, idx)
	if err != nil {
		tb.Fatalf("node root: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(root) })
	name := fmt.Sprintf("sim-s%d-%d-%d", r.Slot, os.Getpid()%100000, nodeSeq.Add(1))
	cfg := Config{
		Name:              name,
		Client:            c.Client,
		RestConfig:        c.Config,
		Root:              root,
		Programs:          map[string]string{"podprog": testbin.Package(tb, "podprog", "./tests/cmd/podprog")},
		Range:             r,
		PodSubnet:         r.Subnet4(idx, 24),
		RestartBackoff:    time.Second,
		MaxRestartBackoff: 5 * time.Second,
		SyncRetry:         2 * time.Second,
		HeartbeatInterval: 5 * time.Second,
		Logf:              func(f string, a ...any) { tb.Logf(f, a...) },
	}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n, err := Start(ctx, cfg)
	if err != nil {
		tb.Fatalf("start node: %v", err)
	}
	var stopped bool
	tb.Cleanup(func() {
		if !stopped {
			stopped = true
			n.Stop()
		}
	})
	if err := n.WaitReady(ctx); err != nil {
		tb.Fatalf("%v", err)
	}
	return n
}
