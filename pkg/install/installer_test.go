package install

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/poll"
	"github.com/containernetworking/cni/libcni"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// node is a fake host: the installer's container view is the host path
// itself here (the two views only differ inside a pod).
type node struct {
	root, bin, net, src, token string
}

// newHostDirs makes a host tree in a temporary directory: empty CNI bin
// and net dirs, a plugin executable to install and a service-account token.
func newHostDirs(t *testing.T) node {
	t.Helper()
	root := t.TempDir()
	n := node{
		root:  root,
		bin:   filepath.Join(root, "opt/cni/bin"),
		net:   filepath.Join(root, "etc/cni/net.d"),
		src:   filepath.Join(root, "image/consul-cni"),
		token: filepath.Join(root, "sa/token"),
	}
	conflisttest.WriteFiles(t, root, map[string]string{
		"image/consul-cni": "#!/bin/sh\necho plugin v1\n",
		"sa/token":         "token-1\n",
	})
	for _, d := range []string{n.bin, n.net} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func (n node) installer(t *testing.T, mutate ...func(*Config)) *Installer {
	t.Helper()
	cfg := Config{
		BinDir: n.bin, NetDir: n.net, HostBinDir: "/opt/cni/bin", HostNetDir: "/etc/cni/net.d",
		PluginBinary: n.src, LogLevel: "info",
		Client:   &credentials.Source{Server: "https://10.96.0.1:443", CAData: []byte("CA"), TokenFile: n.token},
		Resync:   time.Hour,
		Debounce: 20 * time.Millisecond,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// containerdView loads the network the way containerd's CRI plugin does
// (go-cni with the default of one network): the first file of the sorted
// .conf/.conflist/.json list, strictly.
func containerdView(dir string) (*libcni.NetworkConfigList, string, error) {
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, "", err
	}
	if len(files) == 0 {
		return nil, "", errors.New("no network config found")
	}
	sort.Strings(files)
	f := files[0]
	if strings.HasSuffix(f, ".conflist") {
		l, err := libcni.ConfListFromFile(f)
		return l, f, err
	}
	c, err := libcni.ConfFromFile(f)
	if err != nil {
		return nil, f, err
	}
	if c.Network.Type == "" {
		return nil, f, errors.New("network type not found")
	}
	l, err := libcni.ConfListFromConf(c)
	return l, f, err
}

func chainTypes(l *libcni.NetworkConfigList) []string {
	var out []string
	for _, p := range l.Plugins {
		out = append(out, p.Network.Type)
	}
	return out
}

// assertRuntimeChained fails unless the runtime's network ends with exactly
// one consul-cni entry and starts with want.
func assertRuntimeChained(t *testing.T, dir string, want ...string) {
	t.Helper()
	l, f, err := containerdView(dir)
	if err != nil {
		t.Fatalf("containerd would not load %s: %v", dir, err)
	}
	got := strings.Join(chainTypes(l), ",")
	if exp := strings.Join(append(want, cniconf.PluginType), ","); got != exp {
		t.Fatalf("runtime chain from %s = %s, want %s", filepath.Base(f), got, exp)
	}
}

func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

const (
	flannelConf = `{"name":"cbr0","cniVersion":"0.3.1","type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}}`
	bridgeJSON  = `{"name":"br","cniVersion":"1.0.0","type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.1.0.0/16"}}`
)

func TestReconcilePrimaries(t *testing.T) {
	for _, tc := range []struct {
		name      string
		files     map[string]string
		wantTypes []string // the primary's plugins before consul-cni
		wantFiles []string // files that must exist afterwards
		gone      []string // files that must not
	}{
		{name: "conflist", files: map[string]string{"10-kindnet.conflist": conflisttest.Kindnet}, wantTypes: []string{"ptp", "portmap"}},
		{name: "conf converted", files: map[string]string{"10-flannel.conf": flannelConf},
			wantTypes: []string{"flannel"},
			wantFiles: []string{"10-flannel.conflist", "10-flannel.conf" + BackupSuffix}, gone: []string{"10-flannel.conf"}},
		{name: "json converted", files: map[string]string{"05-br.json": bridgeJSON, "10-kindnet.conflist": conflisttest.Kindnet},
			wantTypes: []string{"bridge"},
			wantFiles: []string{"05-br.conflist", "05-br.json" + BackupSuffix, "10-kindnet.conflist"}},
		{name: "conf shadowing a foreign conflist of the same stem", files: map[string]string{
			"10-flannel.conf": flannelConf, "10-flannel.conflist": conflisttest.Kindnet},
			wantTypes: []string{"flannel"},
			wantFiles: []string{"10-flannel.conflist", "10-flannel.conf" + BackupSuffix, "10-flannel.conflist" + BackupSuffix}},
		{name: "invalid file before the primary", files: map[string]string{
			"00-half-written.conflist": `{"name":"x","plugins":[{"ty`, "10-kindnet.conflist": conflisttest.Kindnet},
			wantTypes: nil /* containerd refuses the broken first file; checked below */},
		{name: "consul-cni in the middle and twice", files: map[string]string{
			"10-n.conflist": `{"name":"n","cniVersion":"1.0.0","plugins":[` + string(conflisttest.Entry) + `,{"type":"ptp","ipam":{"type":"host-local"}},` + string(conflisttest.Entry) + `,{"type":"tuning"}]}`},
			wantTypes: []string{"ptp", "tuning"}},
		{name: "plugins only in the plugin directory", files: map[string]string{
			"10-dir.conflist":       `{"name":"dirnet","cniVersion":"1.1.0"}`,
			"dirnet/10-ptp.conf":    `{"type":"ptp","ipam":{"type":"host-local"}}`,
			"dirnet/20-tuning.conf": `{"type":"tuning"}`},
			wantTypes: []string{"ptp", "tuning"}, wantFiles: []string{"dirnet/" + conflist.PluginDirFile}},
		{name: "inline plugins and plugin directory", files: map[string]string{
			"10-dir.conflist":    `{"name":"dirnet","cniVersion":"1.1.0","plugins":[{"type":"bridge"},` + string(conflisttest.Entry) + `]}`,
			"dirnet/10-ptp.conf": `{"type":"ptp"}`},
			wantTypes: []string{"bridge", "ptp"}, wantFiles: []string{"dirnet/" + conflist.PluginDirFile}},
		{name: "plugin directory ignored when only inlined plugins load", files: map[string]string{
			"10-dir.conflist":    `{"name":"dirnet","loadOnlyInlinedPlugins":true,"plugins":[{"type":"bridge"}]}`,
			"dirnet/10-ptp.conf": `{"type":"ptp"}`},
			wantTypes: []string{"bridge"}, gone: []string{"dirnet/" + conflist.PluginDirFile}},
		{name: "plugin directory sorting after ours", files: map[string]string{
			"10-dir.conflist":      `{"name":"dirnet","cniVersion":"1.1.0"}`,
			"dirnet/zzzz-foo.conf": `{"type":"tuning"}`},
			wantTypes: []string{"tuning"}, wantFiles: []string{"dirnet/zzzz-foo.conf-" + conflist.PluginDirFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newHostDirs(t)
			conflisttest.WriteFiles(t, n.net, tc.files)
			before := snapshot(t, n.net)
			in := n.installer(t)
			ctx := context.Background()
			st, err := in.Reconcile(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Waiting || st.Primary == "" {
				t.Fatalf("status %+v", st)
			}
			if tc.wantTypes != nil {
				assertRuntimeChained(t, n.net, tc.wantTypes...)
			} else {
				// A strict runtime fails on the broken first file; the first
				// valid one (what CRI-O and kubelet use) is chained.
				c, _ := conflist.ScanConfDir(n.net)
				p, _, _ := conflist.Primary(c)
				if s := conflist.FindEntry(p.Network); !s.Last {
					t.Fatalf("first valid network not chained: %+v", s)
				}
			}
			if err := in.VerifyInstalled(); err != nil {
				t.Fatalf("Ready after install: %v", err)
			}
			for _, f := range tc.wantFiles {
				if !nodefile.Exists(filepath.Join(n.net, f)) {
					t.Errorf("%s missing; have %v", f, keys(snapshot(t, n.net)))
				}
			}
			for _, f := range tc.gone {
				if nodefile.Exists(filepath.Join(n.net, f)) {
					t.Errorf("%s still there", f)
				}
			}
			// Idempotent: a second pass writes nothing.
			after := snapshot(t, n.net)
			st2, err := in.Reconcile(ctx)
			if err != nil || len(st2.Wrote) != 0 {
				t.Fatalf("second pass wrote %v (err %v)", st2.Wrote, err)
			}
			if again := snapshot(t, n.net); fmt.Sprint(again) != fmt.Sprint(after) {
				t.Errorf("second pass changed files")
			}

			// Uninstall brings back what was there (configuration lists as
			// equal JSON, everything else byte for byte).
			if _, err := in.Uninstall(ctx); err != nil {
				t.Fatal(err)
			}
			restored := snapshot(t, n.net)
			for name, body := range before {
				got, ok := restored[name]
				switch {
				case !ok:
					t.Errorf("uninstall lost %s", name)
				case strings.HasSuffix(name, ".conflist") && strings.Contains(body, cniconf.PluginType):
					out, _, _ := conflist.UnchainInline([]byte(body))
					if !conflist.SameJSON([]byte(got), out) {
						t.Errorf("%s after uninstall:\n%s", name, got)
					}
				case strings.HasSuffix(name, ".conflist"):
					if got != body && !conflist.SameJSON([]byte(got), []byte(body)) {
						t.Errorf("%s after uninstall:\n%s\nwant\n%s", name, got, body)
					}
				case got != body:
					t.Errorf("%s after uninstall:\n%s\nwant\n%s", name, got, body)
				}
			}
			for name := range restored {
				if _, ok := before[name]; !ok {
					t.Errorf("uninstall left %s", name)
				}
			}
			if nodefile.Exists(filepath.Join(n.bin, cniconf.PluginType)) {
				t.Errorf("binary left after uninstall")
			}
			if err := in.VerifyInstalled(); err == nil {
				t.Errorf("Ready after uninstall")
			}
		})
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestReconcileWaitsForPrimary(t *testing.T) {
	n := newHostDirs(t)
	in := n.installer(t)
	st, err := in.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !st.Waiting {
		t.Fatalf("status %+v, want waiting", st)
	}
	if err := in.VerifyInstalled(); err == nil || !strings.Contains(err.Error(), "no valid CNI network configuration") {
		t.Fatalf("Ready = %v", err)
	}
	// The binary and credentials are in place already; nothing else is.
	for _, f := range []string{filepath.Join(n.bin, cniconf.PluginType), filepath.Join(n.net, cniconf.KubeconfigFileName), filepath.Join(n.net, cniconf.TokenFileName)} {
		if !nodefile.Exists(f) {
			t.Errorf("%s missing", f)
		}
	}
	c, _ := conflist.ScanConfDir(n.net)
	if len(c) != 0 {
		t.Errorf("installer created a network configuration on its own: %v", c)
	}
}

func TestBinaryAtomicCopy(t *testing.T) {
	n := newHostDirs(t)
	in := n.installer(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(n.bin, cniconf.PluginType)
	st1, _ := os.Stat(dst)
	if st1.Mode().Perm() != 0o755 {
		t.Errorf("mode %v", st1.Mode())
	}
	// Keep the old binary open as a running plugin would: the update must
	// replace the directory entry, not rewrite the file in place.
	old, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	conflisttest.WriteFiles(t, n.root, map[string]string{"image/consul-cni": "#!/bin/sh\necho plugin v2\n"})
	if err := in.VerifyInstalled(); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Fatalf("Ready with an outdated binary = %v", err)
	}
	st, err := in.Reconcile(context.Background())
	if err != nil || fmt.Sprint(st.Wrote) != "[binary staged binary]" {
		t.Fatalf("wrote %v, err %v", st.Wrote, err)
	}
	got, _ := os.ReadFile(dst)
	if !strings.Contains(string(got), "v2") {
		t.Errorf("binary not updated: %s", got)
	}
	oldBody := make([]byte, 100)
	k, _ := old.ReadAt(oldBody, 0)
	if !strings.Contains(string(oldBody[:k]), "v1") {
		t.Errorf("the open old binary was modified in place: %q", oldBody[:k])
	}
	if err := in.VerifyInstalled(); err != nil {
		t.Fatal(err)
	}
	// No temporary files left behind: the binary and its staged copy.
	ents, _ := os.ReadDir(n.bin)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := cniconf.StagedBinaryName + " " + cniconf.PluginType; strings.Join(names, " ") != want {
		t.Errorf("bin dir holds %v, want %s", names, want)
	}
}

func TestReadyFailures(t *testing.T) {
	for _, tc := range []struct {
		name    string
		setup   func(t *testing.T, n node, in *Installer)
		wantErr string
	}{
		{name: "no binary", setup: func(t *testing.T, n node, in *Installer) {
			conflisttest.WriteFiles(t, n.net, map[string]string{"10-a.conflist": `{"name":"a","plugins":[{"type":"ptp"},` + string(conflisttest.Entry) + `]}`})
		}, wantErr: "plugin binary"},
		{name: "single network file read by the runtime", setup: func(t *testing.T, n node, in *Installer) {
			reconcile(t, in)
			conflisttest.WriteFiles(t, n.net, map[string]string{"00-new.conf": flannelConf})
		}, wantErr: "single-network file"},
		{name: "primary rewritten without consul-cni", setup: func(t *testing.T, n node, in *Installer) {
			reconcile(t, in)
			conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
		}, wantErr: "not in the chain"},
		{name: "new primary sorts first", setup: func(t *testing.T, n node, in *Installer) {
			reconcile(t, in)
			conflisttest.WriteFiles(t, n.net, map[string]string{"05-calico.conflist": conflisttest.Kindnet})
		}, wantErr: "not in the chain of " + "X/05-calico.conflist"},
		{name: "another plugin appended after ours", setup: func(t *testing.T, n node, in *Installer) {
			reconcile(t, in)
			p := filepath.Join(n.net, "10-kindnet.conflist")
			b, _ := os.ReadFile(p)
			var m map[string]any
			json.Unmarshal(b, &m)
			m["plugins"] = append(m["plugins"].([]any), map[string]any{"type": "bandwidth"})
			b, _ = json.Marshal(m)
			os.WriteFile(p, b, 0o644)
		}, wantErr: "not the last plugin"},
		{name: "kubeconfig missing", setup: func(t *testing.T, n node, in *Installer) {
			reconcile(t, in)
			os.Remove(filepath.Join(n.net, cniconf.KubeconfigFileName))
		}, wantErr: "plugin kubeconfig"},
		{name: "token missing", setup: func(t *testing.T, n node, in *Installer) {
			reconcile(t, in)
			os.Remove(filepath.Join(n.net, cniconf.TokenFileName))
		}, wantErr: "plugin token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newHostDirs(t)
			in := n.installer(t)
			conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
			tc.setup(t, n, in)
			err := in.VerifyInstalled()
			want := strings.ReplaceAll(tc.wantErr, "X/", n.net+"/")
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Ready = %v, want an error containing %q", err, want)
			}
			// And a pass repairs every one of them.
			reconcile(t, in)
			if err := in.VerifyInstalled(); err != nil {
				t.Fatalf("Ready after a pass: %v", err)
			}
			assertRuntimeChainedAny(t, n.net)
		})
	}
}

func reconcile(t *testing.T, in *Installer) PassResult {
	t.Helper()
	st, err := in.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func assertRuntimeChainedAny(t *testing.T, dir string) {
	t.Helper()
	l, f, err := containerdView(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s := conflist.FindEntry(l); !s.Last {
		t.Fatalf("runtime network %s: %v", f, chainTypes(l))
	}
}

func TestReplaceIfUnchangedConflict(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "10-a.conflist")
	os.WriteFile(p, []byte("v1"), 0o640)
	os.WriteFile(p, []byte("v2"), 0o640) // another writer got there first
	if err := nodefile.ReplaceIfUnchanged(p, []byte("v1"), []byte("mine")); !errors.Is(err, nodefile.ErrConflict) {
		t.Fatalf("err = %v, want conflict", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "v2" {
		t.Fatalf("the other writer's content was lost: %s", b)
	}
	if err := nodefile.ReplaceIfUnchanged(p, []byte("v2"), []byte("mine")); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if b, _ := os.ReadFile(p); string(b) != "mine" || st.Mode().Perm() != 0o640 {
		t.Fatalf("content %q mode %v", b, st.Mode())
	}
}

func TestPluginKubeconfig(t *testing.T) {
	n := newHostDirs(t)
	in := n.installer(t)
	reconcile(t, in)
	kc := filepath.Join(n.net, cniconf.KubeconfigFileName)
	body, _ := os.ReadFile(kc)
	if strings.Contains(string(body), "token-1") {
		t.Fatalf("kubeconfig embeds the token:\n%s", body)
	}
	// What it holds is credentials.Kubeconfig's (tested there), naming
	// the token file at its path on the host.
	want, err := credentials.Kubeconfig(*in.cfg.Client, "/etc/cni/net.d/"+cniconf.TokenFileName)
	if err != nil || string(body) != string(want) {
		t.Fatalf("kubeconfig written:\n%s\nwant (%v):\n%s", body, err, want)
	}
	tok := filepath.Join(n.net, cniconf.TokenFileName)
	if b, _ := os.ReadFile(tok); string(b) != "token-1" {
		t.Errorf("token copy %q", b)
	}
	if st, _ := os.Stat(tok); st.Mode().Perm() != 0o600 {
		t.Errorf("token mode %v", st.Mode())
	}

	// kubelet rotates the projected token by swapping a symlink; the next
	// pass copies the new one and leaves the kubeconfig alone.
	swapToken(t, n, "token-2")
	st := reconcile(t, in)
	if fmt.Sprint(st.Wrote) != "[token]" {
		t.Errorf("wrote %v, want [token]", st.Wrote)
	}
	if b, _ := os.ReadFile(tok); string(b) != "token-2" {
		t.Errorf("token copy %q after rotation", b)
	}
}

// swapToken replaces the installer's token the way kubelet's atomic writer
// updates a projected volume: a new timestamped directory and a symlink
// renamed over ..data; "token" itself is a symlink into ..data.
func swapToken(t *testing.T, n node, token string) {
	t.Helper()
	dir := filepath.Dir(n.token)
	if fi, err := os.Lstat(n.token); err == nil && fi.Mode()&os.ModeSymlink == 0 {
		os.Remove(n.token)
		if err := os.Symlink("..data/token", n.token); err != nil {
			t.Fatal(err)
		}
	}
	ts := fmt.Sprintf("..%d", time.Now().UnixNano())
	conflisttest.WriteFiles(t, dir, map[string]string{ts + "/token": token})
	tmp := filepath.Join(dir, "..data_tmp")
	os.Remove(tmp)
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// runInstaller starts Run and returns a function that waits for a pass
// whose status satisfies cond.
type runner struct {
	mu     sync.Mutex
	passes []PassResult
	errs   []error
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startRun(t *testing.T, in *Installer) *runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- in.Run(ctx, func(st PassResult, err error) {
			r.mu.Lock()
			r.passes = append(r.passes, st)
			r.errs = append(r.errs, err)
			r.mu.Unlock()
		})
	}()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *runner) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("Run returned %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not stop")
		}
	})
}

func TestRunWatchesAndReappends(t *testing.T) {
	n := newHostDirs(t)
	reg := prometheus.NewRegistry()
	in := n.installer(t, func(c *Config) { c.Metrics = NewMetrics(reg) })
	r := startRun(t, in)

	// No primary yet: the installer waits and is not ready.
	poll.Eventually(t, 2*time.Minute, "a waiting pass", func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		if len(r.passes) == 0 || !r.passes[0].Waiting {
			return errors.New("no waiting pass yet")
		}
		return nil
	})
	if err := in.VerifyInstalled(); err == nil {
		t.Fatal("ready without a primary network")
	}

	// The primary CNI writes its configuration: chained without a resync.
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	poll.Eventually(t, 2*time.Minute, "chained", in.VerifyInstalled)
	assertRuntimeChained(t, n.net, "ptp", "portmap")

	// The primary CNI rewrites its file (e.g. after its own restart).
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": strings.Replace(conflisttest.Kindnet, "1500", "1450", 1)})
	poll.Eventually(t, 2*time.Minute, "re-chained after rewrite", in.VerifyInstalled)
	assertRuntimeChained(t, n.net, "ptp", "portmap")
	if b, _ := os.ReadFile(filepath.Join(n.net, "10-kindnet.conflist")); !strings.Contains(string(b), "1450") {
		t.Errorf("the primary's new content was lost:\n%s", b)
	}

	// A different CNI takes over with a file that sorts first, as a .conf.
	conflisttest.WriteFiles(t, n.net, map[string]string{"05-flannel.conf": flannelConf})
	poll.Eventually(t, 2*time.Minute, "new primary converted and chained", in.VerifyInstalled)
	assertRuntimeChained(t, n.net, "flannel")

	// Somebody deletes the plugin binary.
	os.Remove(filepath.Join(n.bin, cniconf.PluginType))
	poll.Eventually(t, 2*time.Minute, "binary restored", in.VerifyInstalled)

	// kubelet rotates the service-account token.
	swapToken(t, n, "token-rotated")
	poll.Eventually(t, 2*time.Minute, "token copy refreshed", func() error {
		b, _ := os.ReadFile(filepath.Join(n.net, cniconf.TokenFileName))
		if string(b) != "token-rotated" {
			return fmt.Errorf("token copy %q", b)
		}
		return nil
	})

	// SIGTERM: Run returns and leaves everything in place.
	r.stop(t)
	if err := in.VerifyInstalled(); err != nil {
		t.Fatalf("after stop: %v", err)
	}
	assertRuntimeChained(t, n.net, "flannel")
	if testutil.ToFloat64(in.cfg.Metrics.Chained) != 1 {
		t.Errorf("consul_cni_installer_chained = %v", testutil.ToFloat64(in.cfg.Metrics.Chained))
	}
	if c := testutil.ToFloat64(in.cfg.Metrics.Writes.WithLabelValues("chain")); c < 2 {
		t.Errorf("consul_cni_installer_writes_total{what=chain} = %v", c)
	}
}

func TestRunSurvivesDirectoryReplacement(t *testing.T) {
	// The net dir is swapped for another directory (atomically, so no event
	// reaches the old watch): the periodic pass repairs the chain, and the
	// watch moves to the new directory.
	n := newHostDirs(t)
	in := n.installer(t, func(c *Config) { c.Resync = 100 * time.Millisecond })
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	startRun(t, in)
	poll.Eventually(t, 2*time.Minute, "chained", in.VerifyInstalled)
	tmp := n.net + ".new"
	conflisttest.WriteFiles(t, tmp, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, n.net, unix.RENAME_EXCHANGE); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 2*time.Minute, "chained again", in.VerifyInstalled)
	assertRuntimeChained(t, n.net, "ptp", "portmap")
}

func TestBinaryCorruptedInPlace(t *testing.T) {
	n := newHostDirs(t)
	in := n.installer(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	reconcile(t, in)
	dst := filepath.Join(n.bin, cniconf.PluginType)
	// Same size, other bytes, written in place (its time changes).
	time.Sleep(10 * time.Millisecond)
	b, _ := os.ReadFile(dst)
	b[len(b)-2] ^= 0xff
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := in.VerifyInstalled(); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Fatalf("Ready with a corrupted binary = %v", err)
	}
	// The staged copy is put in place, then staged again.
	if st := reconcile(t, in); fmt.Sprint(st.Wrote) != "[binary staged binary]" {
		t.Fatalf("wrote %v", st.Wrote)
	}
	if err := in.VerifyInstalled(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkReady measures the readiness probe's work on a node with a
// plugin binary of realistic size (40 MB): it must not read the binary.
func BenchmarkReady(b *testing.B) {
	root := b.TempDir()
	n := node{root: root, bin: filepath.Join(root, "bin"), net: filepath.Join(root, "net"),
		src: filepath.Join(root, "consul-cni"), token: filepath.Join(root, "token")}
	os.MkdirAll(n.bin, 0o755)
	os.MkdirAll(n.net, 0o755)
	os.WriteFile(n.src, make([]byte, 40<<20), 0o755)
	os.WriteFile(n.token, []byte("t"), 0o600)
	os.WriteFile(filepath.Join(n.net, "10-kindnet.conflist"), []byte(conflisttest.Kindnet), 0o644)
	in, err := New(Config{BinDir: n.bin, NetDir: n.net, HostBinDir: "/opt/cni/bin", HostNetDir: "/etc/cni/net.d",
		PluginBinary: n.src, Client: &credentials.Source{Server: "https://h", TokenFile: n.token}})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := in.Reconcile(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := in.VerifyInstalled(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReconcileSteadyState is the cost of a pass that finds
// everything in place (every resync and every file event).
func BenchmarkReconcileSteadyState(b *testing.B) {
	root := b.TempDir()
	bin, net := filepath.Join(root, "bin"), filepath.Join(root, "net")
	os.MkdirAll(bin, 0o755)
	os.MkdirAll(net, 0o755)
	src, token := filepath.Join(root, "consul-cni"), filepath.Join(root, "token")
	os.WriteFile(src, make([]byte, 40<<20), 0o755)
	os.WriteFile(token, []byte("t"), 0o600)
	os.WriteFile(filepath.Join(net, "10-kindnet.conflist"), []byte(conflisttest.Kindnet), 0o644)
	in, _ := New(Config{BinDir: bin, NetDir: net, HostBinDir: "/opt/cni/bin", HostNetDir: "/etc/cni/net.d",
		PluginBinary: src, Client: &credentials.Source{Server: "https://h", TokenFile: token}})
	ctx := klog.NewContext(context.Background(), klog.Background().V(10))
	in.Reconcile(ctx)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st, err := in.Reconcile(ctx)
		if err != nil || len(st.Wrote) != 0 {
			b.Fatalf("%v %v", st.Wrote, err)
		}
	}
}

// Without a readable token the chain is still written, with the kubeconfig
// (the plugin then fails ADD for injected pods: they wait rather than
// bypass), the error is reported and the installer is not Ready. Without
// the kubeconfig (which the plugin reads as "uninstalled") nothing is
// chained.
func TestChainsEvenWithoutCredentials(t *testing.T) {
	n := newHostDirs(t)
	in := n.installer(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	os.Remove(n.token)
	st, err := in.Reconcile(context.Background())
	if err == nil || !strings.Contains(err.Error(), "service-account token") {
		t.Fatalf("err = %v", err)
	}
	if st.Primary == "" {
		t.Fatalf("status %+v", st)
	}
	assertRuntimeChained(t, n.net, "ptp", "portmap")
	if !nodefile.Exists(filepath.Join(n.net, cniconf.KubeconfigFileName)) || nodefile.Exists(filepath.Join(n.net, cniconf.TokenFileName)) {
		t.Fatalf("files %v", keys(snapshot(t, n.net)))
	}
	if err := in.VerifyInstalled(); err == nil {
		t.Fatal("Ready without credentials")
	}
	// No kubeconfig at all (it could not be written): not chained.
	nk := newHostDirs(t)
	ink := nk.installer(t)
	conflisttest.WriteFiles(t, nk.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	writeKubeconfig = func(string, []byte, fs.FileMode) error { return errors.New("disk full") }
	t.Cleanup(func() { writeKubeconfig = nodefile.WriteAtomic })
	if _, err := ink.Reconcile(context.Background()); err == nil || !strings.Contains(err.Error(), "not chained") {
		t.Fatalf("err = %v", err)
	}
	writeKubeconfig = nodefile.WriteAtomic
	if b, _ := os.ReadFile(filepath.Join(nk.net, "10-kindnet.conflist")); strings.Contains(string(b), cniconf.PluginType) {
		t.Fatal("chained without a kubeconfig")
	}
	// A kubeconfig that is there but unusable (a directory) is not
	// absence: the plugin fails ADD closed with it (it never passes pods
	// through), so the chain is written and the error reported.
	nd := newHostDirs(t)
	ind := nd.installer(t)
	conflisttest.WriteFiles(t, nd.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	if err := os.Mkdir(filepath.Join(nd.net, cniconf.KubeconfigFileName), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := ind.Reconcile(context.Background()); err == nil || !strings.Contains(err.Error(), "fails ADD closed") {
		t.Fatalf("err = %v", err)
	}
	assertRuntimeChained(t, nd.net, "ptp", "portmap")
	if err := ind.VerifyInstalled(); err == nil {
		t.Fatal("Ready with a directory for a kubeconfig")
	}
	// Without the binary nothing is chained: every ADD on the node would
	// fail, mesh or not.
	n2 := newHostDirs(t)
	in2 := n2.installer(t)
	conflisttest.WriteFiles(t, n2.net, map[string]string{"10-kindnet.conflist": conflisttest.Kindnet})
	os.Remove(n2.src)
	if _, err := in2.Reconcile(context.Background()); err == nil {
		t.Fatal("no error without a plugin binary")
	}
	if b, _ := os.ReadFile(filepath.Join(n2.net, "10-kindnet.conflist")); strings.Contains(string(b), cniconf.PluginType) {
		t.Fatal("chained without a binary")
	}
}
