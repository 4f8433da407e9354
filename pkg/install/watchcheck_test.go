package install

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile/nodefiletest"
)

// fakeProc is a /proc with one process: its command line and the fdinfo
// files of this test process's inotify watches on dirs (the kernel's own
// format, read back from /proc/self).
func fakeProc(t *testing.T, cmdline []string, dirs ...string) string {
	t.Helper()
	root := t.TempDir()
	pid := filepath.Join(root, "4242")
	if err := os.MkdirAll(filepath.Join(pid, "fdinfo"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pid, "cmdline"), []byte(strings.Join(cmdline, "\x00")+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		return root
	}
	before := inotifyFDs(t)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	for _, d := range dirs {
		if err := w.Add(d); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for fd, b := range inotifyFDs(t) {
		if _, old := before[fd]; old {
			continue // another fake's watcher, still open
		}
		if err := os.WriteFile(filepath.Join(pid, "fdinfo", fd), b, 0o644); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("%d new inotify file descriptors in /proc/self/fdinfo, want 1", n)
	}
	return root
}

// inotifyFDs returns this process's inotify file descriptors and their
// fdinfo.
func inotifyFDs(t *testing.T) map[string][]byte {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fdinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err == nil && strings.Contains(string(b), "inotify wd:") {
			out[e.Name()] = b
		}
	}
	return out
}

// The readiness probe finds the installer's `run` process and reads its
// inotify watches from the kernel's fdinfo: both directories watched is
// ready; one missing is not, named, with the inotify limits as the cause
// to look at; no installer process visible is told apart.
func TestCheckWatched(t *testing.T) {
	n := newHostDirs(t)
	run := []string{"/usr/local/bin/consul-cni-installer", "--cni-net-dir=/host/etc/cni/net.d", "run"}
	if err := CheckWatched(fakeProc(t, run, n.net, n.bin), n.net, n.bin); err != nil {
		t.Errorf("both watched: %v", err)
	}
	err := CheckWatched(fakeProc(t, run, n.net), n.net, n.bin)
	if err == nil || !strings.Contains(err.Error(), n.bin) || strings.Contains(err.Error(), n.net+",") || !strings.Contains(err.Error(), "max_user_watches") {
		t.Errorf("bin dir not watched: %v", err)
	}
	if err := CheckWatched(fakeProc(t, run), n.net, n.bin); err == nil {
		t.Error("no watch at all: ready")
	}
	defaultRun := []string{"consul-cni-installer", "--resync=30s"}
	if err := CheckWatched(fakeProc(t, defaultRun, n.net, n.bin), n.net, n.bin); err != nil {
		t.Errorf("run as the default subcommand: %v", err)
	}
	probe := []string{"consul-cni-installer", "ready"}
	if err := CheckWatched(fakeProc(t, probe, n.net, n.bin), n.net, n.bin); !errors.Is(err, ErrNoInstallerProcess) {
		t.Errorf("only a probe process: %v, want ErrNoInstallerProcess", err)
	}
}

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
// the files count (ErrNoInstallerProcess, told apart for the caller).
func TestReady(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	in := n.installer(t)
	run := []string{"consul-cni-installer", "run"}
	if err := in.Ready(fakeProc(t, run, n.net, n.bin)); err == nil || !strings.Contains(err.Error(), "plugin binary") {
		t.Errorf("nothing installed yet, both watched: %v, want the missing binary", err)
	}
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := in.Ready(fakeProc(t, run, n.net, n.bin)); err != nil {
		t.Errorf("chained and both watched: %v", err)
	}
	err := in.Ready(fakeProc(t, run, n.bin))
	if err == nil || !strings.Contains(err.Error(), "does not watch "+n.net) || !strings.Contains(err.Error(), "max_user_instances") {
		t.Errorf("chained, net dir not watched: %v, want it named with the inotify limits", err)
	}
	if err := in.Ready(fakeProc(t, run)); err == nil {
		t.Error("chained, nothing watched: ready")
	}
	if err := in.Ready(t.TempDir()); !errors.Is(err, ErrNoInstallerProcess) {
		t.Errorf("chained, no installer process: %v, want ErrNoInstallerProcess", err)
	}
}
