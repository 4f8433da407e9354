package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/install"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
)

// chainedNode makes a node on which an installer pass has chained the
// plugin: the probe's files all check out.
func chainedNode(t *testing.T) (dir string, o *options) {
	t.Helper()
	dir = t.TempDir()
	files := map[string]string{
		"net/10-bridge.conflist": `{"cniVersion":"1.0.0","name":"bridge","plugins":[{"type":"bridge"}]}`,
		"image/consul-cni":       "#!/bin/sh\n",
		"sa/token":               "token\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	o = &options{BinDir: filepath.Join(dir, "bin"), NetDir: filepath.Join(dir, "net"), HostBinDir: "/opt/cni/bin",
		HostNetDir: "/etc/cni/net.d", PluginBinary: filepath.Join(dir, "image/consul-cni"), LogLevel: "info", Resync: time.Minute}
	cfg := o.config()
	cfg.Client = &credentials.Source{Server: "https://10.96.0.1:443", CAData: []byte("CA"), TokenFile: filepath.Join(dir, "sa/token")}
	in, err := install.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	return dir, o
}

// fakeProcWithoutWatches is a /proc holding one `consul-cni-installer run`
// process that has no inotify watch (its watcher could not be made).
func fakeProcWithoutWatches(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	pid := filepath.Join(root, "7")
	if err := os.MkdirAll(filepath.Join(pid, "fdinfo"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pid, "fdinfo", "0"), []byte("pos:\t0\nflags:\t02\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmdline := "/usr/local/bin/consul-cni-installer\x00run\x00--cni-net-dir=/host/etc/cni/net.d\x00"
	if err := os.WriteFile(filepath.Join(pid, "cmdline"), []byte(cmdline), 0o644); err != nil {
		t.Fatal(err)
	}
	return root
}

// A chained node whose installer could not set up its directory watch
// (inotify limits) is not ready, and the probe says which directory and
// what to look at; with no installer process beside the probe (run by
// hand) the files alone decide, and it says the watch was not checked.
func TestReadyFailsWhenTheInstallerCannotWatch(t *testing.T) {
	_, o := chainedNode(t)
	defer func(p string) { procRoot = p }(procRoot)

	procRoot = fakeProcWithoutWatches(t)
	var out bytes.Buffer
	if code := ready(o, &out); code != 1 {
		t.Errorf("installer without a watch: exit %d, want 1 (%s)", code, out.String())
	}
	if msg := out.String(); !strings.Contains(msg, "does not watch") || !strings.Contains(msg, o.NetDir) || !strings.Contains(msg, "fs.inotify.max_user_watches") {
		t.Errorf("installer without a watch: %q, want the unwatched directories and the inotify limits named", msg)
	}

	procRoot = t.TempDir()
	out.Reset()
	if code := ready(o, &out); code != 0 || !strings.Contains(out.String(), "not checked") {
		t.Errorf("no installer process visible: exit %d, %q; want 0 and the watch said not checked", code, out.String())
	}
}
