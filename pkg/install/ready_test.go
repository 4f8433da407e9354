package install

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile/nodefiletest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/watchcheck"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/watchcheck/watchchecktest"
)

// With no inotify instance to be had (fs.inotify.max_user_instances
// reached), Run keeps going: the chain is made, a foreign rewrite is undone
// by the periodic pass, and once a watcher can be made it is, at the next
// pass.
func TestRunWithoutAWatcher(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	in := n.installer(t, func(c *Config) { c.Resync = 100 * time.Millisecond })
	var fail atomic.Bool
	fail.Store(true)
	made := make(chan struct{}, 1)
	newWatcher = func() (*fsnotify.Watcher, error) {
		if fail.Load() {
			return nil, errors.New("too many open files")
		}
		select {
		case made <- struct{}{}:
		default:
		}
		return fsnotify.NewWatcher()
	}
	t.Cleanup(func() { newWatcher = fsnotify.NewWatcher })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- in.Run(ctx, nil) }()
	list := filepath.Join(n.net, "10-kindnet.conflist")
	poll.Eventually(t, 10*time.Second, "chained without a watcher", func() error { return in.VerifyInstalled() })
	nodefiletest.ForeignWrite(t, list, []byte(conflisttest.Kindnet))
	poll.Eventually(t, 10*time.Second, "the periodic pass restores the chain", func() error { return in.VerifyInstalled() })
	fail.Store(false)
	select {
	case <-made:
	case <-time.After(10 * time.Second):
		t.Error("no watcher made once it could be")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// The readiness probe's verdict: a chained node is ready only while the
// installer's run process watches both directories; a node not chained is
// not ready whatever is watched; with no installer process visible only
// the files count (watchcheck.ErrNoInstallerProcess, told apart for the caller).
func TestReady(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	in := n.installer(t)
	run := []string{"consul-cni-installer", "run"}
	if err := in.Ready(watchchecktest.Proc(t, run, n.net, n.bin)); err == nil || !strings.Contains(err.Error(), "plugin binary") {
		t.Errorf("nothing installed yet, both watched: %v, want the missing binary", err)
	}
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := in.Ready(watchchecktest.Proc(t, run, n.net, n.bin)); err != nil {
		t.Errorf("chained and both watched: %v", err)
	}
	err := in.Ready(watchchecktest.Proc(t, run, n.bin))
	if err == nil || !strings.Contains(err.Error(), "does not watch "+n.net) || !strings.Contains(err.Error(), "max_user_instances") {
		t.Errorf("chained, net dir not watched: %v, want it named with the inotify limits", err)
	}
	if err := in.Ready(watchchecktest.Proc(t, run)); err == nil {
		t.Error("chained, nothing watched: ready")
	}
	if err := in.Ready(t.TempDir()); !errors.Is(err, watchcheck.ErrNoInstallerProcess) {
		t.Errorf("chained, no installer process: %v, want watchcheck.ErrNoInstallerProcess", err)
	}
}
