package realnode

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testnet"
)

// TB is the part of testing.TB StartForTest uses (*testing.T, *testing.B,
// tests/harness/lifecycle.Env with a Logf).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
	Logf(format string, args ...any)
}

// StartForTest starts a node for a test: the pause image built, the
// reference plugins of $CCR_CNI_BIN_DIR (or built by testbin), the node's
// progress in the test log. It returns once the node is Ready (unless
// opts.NoConfList) and stops it when the test ends.
func StartForTest(tb TB, c *cluster.Cluster, r *testnet.Range, opts Options) *Node {
	tb.Helper()
	BuildImages(tb)
	if opts.CNIBinDir == "" {
		opts.CNIBinDir = CNIPluginDir(tb)
	}
	if opts.Logf == nil {
		opts.Logf = tb.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, err := Start(ctx, c, r, opts)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(n.Stop)
	if opts.NoConfList {
		return n
	}
	if err := n.WaitReady(ctx); err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Logf("node %s (%s, dir %s) Ready %.2fs after kubelet started", n.Name, n.IP, n.Dir, n.ReadyAfter().Seconds())
	return n
}

// CNIPluginDir is $CCR_CNI_BIN_DIR when it holds ptp, host-local and
// loopback (`make cni-bins`), else testbin.CNIPluginDir.
func CNIPluginDir(tb testbin.TB) string {
	tb.Helper()
	if d := os.Getenv("CCR_CNI_BIN_DIR"); d != "" {
		ok := true
		for _, p := range []string{"ptp", "host-local", "loopback"} {
			if _, err := os.Stat(filepath.Join(d, p)); err != nil {
				ok = false
			}
		}
		if ok {
			return d
		}
	}
	return testbin.CNIPluginDir(tb)
}
