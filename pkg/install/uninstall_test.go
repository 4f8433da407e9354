package install

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile/nodefiletest"
)

const ptpList = `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"ptp","ipam":{"type":"host-local"}}]}`

// installed returns a node with the installer's chain, binary and
// credentials in place.
func installed(t *testing.T) (node, *Installer) {
	t.Helper()
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-n.conflist": ptpList})
	in := n.installer(t)
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := in.VerifyInstalled(); err != nil {
		t.Fatal(err)
	}
	return n, in
}

// The primary CNI rewrites its list while the entry is being removed: the
// removal starts over on the new content, keeps the primary's change, and
// only then are the files removed.
func TestUninstallRetriesConflicts(t *testing.T) {
	n, in := installed(t)
	list := filepath.Join(n.net, "10-n.conflist")
	writes := 0
	nodefiletest.BeforeCompare(t, func(path string) {
		if path != list || writes > 0 {
			return
		}
		writes++
		cur, _ := os.ReadFile(path)
		nodefiletest.ForeignWrite(t, path, []byte(strings.Replace(string(cur), `"cniVersion": "1.0.0"`, `"cniVersion": "1.0.0", "rewritten": true`, 1)))
	})
	res, err := in.Uninstall(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(list)
	if conflist.HasPlugin(b) || !strings.Contains(string(b), `"rewritten"`) || writes != 1 {
		t.Fatalf("list after uninstall (%d foreign writes):\n%s", writes, b)
	}
	for _, f := range []string{filepath.Join(n.net, cniconf.KubeconfigFileName), filepath.Join(n.net, cniconf.TokenFileName), filepath.Join(n.bin, cniconf.PluginType)} {
		if nodefile.Exists(f) {
			t.Errorf("%s left after uninstall", f)
		}
	}
	if !res.Found() || res.KeptBinary {
		t.Errorf("result %+v", res)
	}
}

// A list that never stops changing keeps the entry: then the binary and the
// credentials it names stay too, and the error says so.
func TestUninstallKeepsFilesWhileAListIsNotClean(t *testing.T) {
	n, in := installed(t)
	list := filepath.Join(n.net, "10-n.conflist")
	i := 0
	nodefiletest.BeforeCompare(t, func(path string) {
		i++
		cur, _ := os.ReadFile(path)
		nodefiletest.ForeignWrite(t, path, []byte(strings.Replace(string(cur), `"cniVersion"`, `"x`+strings.Repeat("x", i)+`": 1, "cniVersion"`, 1)))
	})
	_, err := in.Uninstall(context.Background())
	if err == nil || !strings.Contains(err.Error(), "kept") {
		t.Fatalf("err = %v", err)
	}
	b, _ := os.ReadFile(list)
	if !conflist.HasPlugin(b) {
		t.Fatalf("entry gone:\n%s", b)
	}
	for _, f := range []string{filepath.Join(n.net, cniconf.KubeconfigFileName), filepath.Join(n.net, cniconf.TokenFileName), filepath.Join(n.bin, cniconf.PluginType)} {
		if !nodefile.Exists(f) {
			t.Errorf("%s removed while a list still names the plugin", f)
		}
	}
}

// Another installer's consul-cni entry (naming its own kubeconfig) stays,
// and so does the binary it runs; ours goes with our credentials.
func TestUninstallKeepsAnotherInstallersBinary(t *testing.T) {
	n, in := installed(t)
	other := in.Entry()
	other.Kubeconfig = "other-installer-kubeconfig"
	ob, _ := json.Marshal(other)
	conflisttest.WriteFiles(t, n.net, map[string]string{"20-other.conflist": `{"name":"o","cniVersion":"1.0.0","plugins":[{"type":"bridge"},` + string(ob) + `]}`})
	res, err := in.Uninstall(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(n.net, "10-n.conflist")); conflist.HasPlugin(b) {
		t.Errorf("our entry left:\n%s", b)
	}
	if b, _ := os.ReadFile(filepath.Join(n.net, "20-other.conflist")); !conflist.HasPlugin(b) {
		t.Errorf("the other installer's entry was removed:\n%s", b)
	}
	if !nodefile.Exists(filepath.Join(n.bin, cniconf.PluginType)) || !res.KeptBinary {
		t.Errorf("binary removed although another entry names it (result %+v)", res)
	}
	if nodefile.Exists(filepath.Join(n.net, cniconf.KubeconfigFileName)) || nodefile.Exists(filepath.Join(n.net, cniconf.TokenFileName)) {
		t.Errorf("our credentials left")
	}
}

func TestUninstallDirectoriesAndNothingFound(t *testing.T) {
	n := newHostDirs(t)
	in := n.installer(t)
	res, err := in.Uninstall(context.Background())
	if err != nil || res.Found() {
		t.Fatalf("empty node: %+v, %v", res, err)
	}
	missing := n.installer(t, func(c *Config) { c.NetDir = filepath.Join(n.root, "nope") })
	if _, err := missing.Uninstall(context.Background()); err == nil || !strings.Contains(err.Error(), "cni-net-dir") || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("missing net dir: %v", err)
	}
	missing = n.installer(t, func(c *Config) { c.BinDir = filepath.Join(n.root, "nobin") })
	if _, err := missing.Uninstall(context.Background()); err == nil || !strings.Contains(err.Error(), "cni-bin-dir") {
		t.Fatalf("missing bin dir: %v", err)
	}
}

func TestLeftovers(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"10-flannel.conf": flannelConf})
	in := n.installer(t)
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	left, err := in.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10-flannel.conf" + BackupSuffix, "10-flannel.conflist: entry", cniconf.KubeconfigFileName, cniconf.TokenFileName, cniconf.OwnerFileName, cniconf.StagedBinaryName, cniconf.PluginType}
	if strings.Join(left, ",") != strings.Join(want, ",") {
		t.Fatalf("leftovers %v, want %v", left, want)
	}
	if _, err := in.Uninstall(context.Background()); err != nil {
		t.Fatal(err)
	}
	if left, err := in.Leftovers(); err != nil || len(left) != 0 {
		t.Fatalf("after uninstall: %v %v", left, err)
	}
}

// The uninstall mode removes again what comes back (an installer of ours
// that was still stopping) until it is cancelled.
func TestKeepUninstalled(t *testing.T) {
	n, in := installed(t)
	ctx, cancel := context.WithCancel(context.Background())
	passes := make(chan error)
	proceed := make(chan struct{})
	done := make(chan struct{})
	keeper := n.installer(t, func(c *Config) { c.Resync = 10 * time.Millisecond })
	go func() {
		defer close(done)
		keeper.KeepUninstalled(ctx, func(_ UninstallResult, err error) {
			select {
			case passes <- err:
				<-proceed
			case <-ctx.Done():
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		close(proceed)
		<-done
	})
	if err := <-passes; err != nil {
		t.Fatal(err)
	}
	if left, _ := in.Leftovers(); len(left) != 0 {
		t.Fatalf("left after the first pass: %v", left)
	}
	if _, err := in.Reconcile(context.Background()); err != nil { // put back
		t.Fatal(err)
	}
	if left, _ := in.Leftovers(); len(left) == 0 {
		t.Fatal("nothing put back")
	}
	proceed <- struct{}{}
	if err := <-passes; err != nil {
		t.Fatal(err)
	}
	if left, _ := in.Leftovers(); len(left) != 0 {
		t.Fatalf("left after the next pass: %v", left)
	}
}

// The case: the installer converted 05-x.conf into 05-x.conflist,
// then the primary CNI wrote its own 05-x.conflist (which the installer
// chained). Uninstall must keep the primary's list (only our entry leaves
// it) and must not restore the stale .conf, which sorts first and would
// shadow it.
func TestUninstallKeepsAListThePrimaryWroteAfterTheConversion(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{"05-x.conf": flannelConf})
	in := n.installer(t)
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(n.net, "05-x.conflist")
	nodefiletest.ForeignWrite(t, list, []byte(ptpList))
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertRuntimeChained(t, n.net, "ptp")
	if _, err := in.Uninstall(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(list)
	if err != nil {
		t.Fatalf("the primary's list was deleted: %v", err)
	}
	if conflist.HasPlugin(b) || !conflist.SameJSON(b, []byte(ptpList)) {
		t.Fatalf("the primary's list after uninstall:\n%s", b)
	}
	files := keys(snapshot(t, n.net))
	if strings.Join(files, ",") != "05-x.conflist" {
		t.Fatalf("files after uninstall: %v (the stale .conf must not come back)", files)
	}
	if left, err := in.Leftovers(); err != nil || len(left) != 0 {
		t.Fatalf("leftovers %v %v", left, err)
	}
}

// The conversion's own list goes and the .conf comes back; but when the
// primary replaces the list just before it is removed, its list stays and
// the stale .conf does not come back.
func TestUninstallRestoresAConversionUnlessTheListChangesMeanwhile(t *testing.T) {
	for _, race := range []bool{false, true} {
		t.Run(fmt.Sprintf("race=%v", race), func(t *testing.T) {
			n := newHostDirs(t)
			conflisttest.WriteFiles(t, n.net, map[string]string{"05-x.conf": flannelConf})
			in := n.installer(t)
			if _, err := in.Reconcile(context.Background()); err != nil {
				t.Fatal(err)
			}
			list := filepath.Join(n.net, "05-x.conflist")
			if race {
				nodefiletest.BeforeRemoveIfUnchanged(t, func(path string) {
					if path == list {
						nodefiletest.ForeignWrite(t, path, []byte(ptpList))
					}
				})
			}
			if _, err := in.Uninstall(context.Background()); err != nil {
				t.Fatal(err)
			}
			files := strings.Join(keys(snapshot(t, n.net)), ",")
			if !race {
				if files != "05-x.conf" {
					t.Fatalf("files %s, want the restored 05-x.conf alone", files)
				}
				return
			}
			b, _ := os.ReadFile(list)
			if files != "05-x.conflist" || !conflist.SameJSON(b, []byte(ptpList)) {
				t.Fatalf("files %s, list %s: want the primary's list alone", files, b)
			}
		})
	}
}

// A restore never replaces a file the primary wrote meanwhile.
func TestRenameNoReplace(t *testing.T) {
	dir := t.TempDir()
	conflisttest.WriteFiles(t, dir, map[string]string{"a": "a", "b": "b"})
	ok, err := nodefile.RenameNoReplace(filepath.Join(dir, "a"), filepath.Join(dir, "b"))
	if err != nil || ok {
		t.Fatalf("renamed over an existing file: %v %v", ok, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "b")); string(b) != "b" {
		t.Fatalf("b = %q", b)
	}
	ok, err = nodefile.RenameNoReplace(filepath.Join(dir, "a"), filepath.Join(dir, "c"))
	if err != nil || !ok || nodefile.Exists(filepath.Join(dir, "a")) {
		t.Fatalf("rename to a free name: %v %v", ok, err)
	}
}
