package install

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// consulK8sKubeconfig renders a kubeconfig the way consul-k8s's installer
// writes it: the service-account token embedded.
func consulK8sKubeconfig(t *testing.T) []byte {
	t.Helper()
	b, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"local": {Server: "https://10.96.0.1:443", CertificateAuthorityData: []byte("CA")}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"consul-cni": {Token: "embedded-token"}},
		Contexts:       map[string]*clientcmdapi.Context{"consul-cni": {Cluster: "local", AuthInfo: "consul-cni"}},
		CurrentContext: "consul-cni",
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// legacyKubeconfig renders the kubeconfig an earlier installer of ours
// wrote under cniconf.LegacyKubeconfigFileName.
func legacyKubeconfig(t *testing.T) []byte {
	t.Helper()
	b, err := credentials.Kubeconfig(credentials.Source{Server: "https://10.96.0.1:443", CAData: []byte("CA")}, "/etc/cni/net.d/"+cniconf.TokenFileName)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// listWithEntry is a configuration list whose consul-cni entry names
// kubeconfig, as an earlier installer of ours or consul-k8s's wrote it.
func listWithEntry(kubeconfig string) string {
	return `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"ptp","ipam":{"type":"host-local"}},` +
		`{"name":"consul-cni","type":"consul-cni","cni_bin_dir":"/opt/cni/bin","cni_net_dir":"/etc/cni/net.d","kubeconfig":"` + kubeconfig + `","log_level":"info","multus":false}]}`
}

// entryKubeconfig returns the kubeconfig the consul-cni entry of a list
// names.
func entryKubeconfig(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var l struct{ Plugins []conflist.PluginConfig }
	if err := json.Unmarshal(b, &l); err != nil {
		t.Fatal(err)
	}
	var kcs []string
	for _, p := range l.Plugins {
		if p.Type == cniconf.PluginType {
			kcs = append(kcs, p.Kubeconfig)
		}
	}
	return strings.Join(kcs, ",")
}

// The plugin's kubeconfig has a name of its own: consul-k8s's installer,
// stopping, removes the file under its name, and our chain stays complete.
func TestKubeconfigSurvivesConsulK8sCleanup(t *testing.T) {
	if cniconf.KubeconfigFileName == cniconf.ConsulK8sKubeconfigFileName {
		t.Fatalf("the installer's kubeconfig is named %s, as consul-k8s's", cniconf.KubeconfigFileName)
	}
	n, in := installed(t)
	if kc := entryKubeconfig(t, filepath.Join(n.net, "10-n.conflist")); kc != cniconf.KubeconfigFileName {
		t.Fatalf("entry names kubeconfig %q, want %q", kc, cniconf.KubeconfigFileName)
	}
	// What consul-k8s's cleanup removes of the net dir.
	if err := nodefile.RemoveIfExists(filepath.Join(n.net, cniconf.ConsulK8sKubeconfigFileName)); err != nil {
		t.Fatal(err)
	}
	if err := in.VerifyInstalled(); err != nil {
		t.Fatalf("after consul-k8s's kubeconfig is removed: %v", err)
	}
}

// An upgrade from an installer of ours that wrote the kubeconfig under the
// name consul-k8s uses: the entry names ours afterwards and the old file,
// ours, is gone.
func TestUpgradeFromLegacyKubeconfigName(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{
		"10-n.conflist":                  listWithEntry(cniconf.LegacyKubeconfigFileName),
		cniconf.LegacyKubeconfigFileName: string(legacyKubeconfig(t)),
		cniconf.TokenFileName:            "token-1",
	})
	in := n.installer(t)
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if kc := entryKubeconfig(t, filepath.Join(n.net, "10-n.conflist")); kc != cniconf.KubeconfigFileName {
		t.Errorf("entry names kubeconfig %q, want %q", kc, cniconf.KubeconfigFileName)
	}
	if nodefile.Exists(filepath.Join(n.net, cniconf.LegacyKubeconfigFileName)) {
		t.Errorf("%s, written by an earlier installer of ours, is left", cniconf.LegacyKubeconfigFileName)
	}
	if err := in.VerifyInstalled(); err != nil {
		t.Fatal(err)
	}
}

// consul-k8s's kubeconfig under the shared name is never removed: not
// while our installer chains beside it, not by uninstall, and it is no
// leftover of ours.
func TestConsulK8sKubeconfigKept(t *testing.T) {
	n := newHostDirs(t)
	theirs := consulK8sKubeconfig(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{
		"10-n.conflist":                     listWithEntry(cniconf.ConsulK8sKubeconfigFileName),
		cniconf.ConsulK8sKubeconfigFileName: string(theirs),
	})
	in := n.installer(t)
	path := filepath.Join(n.net, cniconf.ConsulK8sKubeconfigFileName)
	check := func(when string) {
		t.Helper()
		if b, err := os.ReadFile(path); err != nil || string(b) != string(theirs) {
			t.Fatalf("%s: consul-k8s's kubeconfig %s: %v\n%s", when, path, err, b)
		}
	}
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	check("after a pass")
	left, err := in.Leftovers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range left {
		if l == cniconf.ConsulK8sKubeconfigFileName {
			t.Errorf("consul-k8s's kubeconfig listed as a leftover of ours: %v", left)
		}
	}
	// consul-k8s's entry put back beside ours, in another list: uninstall
	// keeps it, its kubeconfig and the binary it runs.
	conflisttest.WriteFiles(t, n.net, map[string]string{"20-other.conflist": listWithEntry(cniconf.ConsulK8sKubeconfigFileName)})
	res, err := in.Uninstall(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	check("after uninstall")
	if !res.KeptBinary || entryKubeconfig(t, filepath.Join(n.net, "20-other.conflist")) != cniconf.ConsulK8sKubeconfigFileName {
		t.Errorf("uninstall removed consul-k8s's entry or binary: %+v", res)
	}
}

// Uninstall after an earlier installer of ours (kubeconfig under the
// shared name) removes its entry and that kubeconfig too.
func TestUninstallRemovesLegacyKubeconfig(t *testing.T) {
	n := newHostDirs(t)
	conflisttest.WriteFiles(t, n.net, map[string]string{
		"10-n.conflist":                  listWithEntry(cniconf.LegacyKubeconfigFileName),
		cniconf.LegacyKubeconfigFileName: string(legacyKubeconfig(t)),
		cniconf.TokenFileName:            "token-1",
	})
	conflisttest.WriteFiles(t, n.bin, map[string]string{cniconf.PluginType: "#!/bin/sh\n"})
	in := n.installer(t)
	left, err := in.Leftovers()
	if err != nil || !strings.Contains(strings.Join(left, ","), cniconf.LegacyKubeconfigFileName) {
		t.Fatalf("leftovers %v (%v), want %s among them", left, err, cniconf.LegacyKubeconfigFileName)
	}
	if _, err := in.Uninstall(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(n.net, "10-n.conflist"))
	if conflist.HasPlugin(b) {
		t.Errorf("the earlier installer's entry is left:\n%s", b)
	}
	for _, f := range []string{filepath.Join(n.net, cniconf.LegacyKubeconfigFileName), filepath.Join(n.bin, cniconf.PluginType)} {
		if nodefile.Exists(f) {
			t.Errorf("%s left after uninstall", f)
		}
	}
	if left, err := in.Leftovers(); err != nil || len(left) != 0 {
		t.Errorf("after uninstall: %v %v", left, err)
	}
}

// Putting the binary back after another installer removed it is a rename
// of the staged copy (no copy of the plugin), and the copy is staged again
// once the chain is complete.
func TestRestoreRenamesStagedBinary(t *testing.T) {
	n, in := installed(t)
	staged := filepath.Join(n.bin, cniconf.StagedBinaryName)
	st, err := os.Stat(staged)
	if err != nil {
		t.Fatalf("no staged copy after a pass: %v", err)
	}
	stagedIno := st.Sys().(*syscall.Stat_t).Ino
	bin := filepath.Join(n.bin, cniconf.PluginType)
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	res, err := in.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st, err = os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	if ino := st.Sys().(*syscall.Stat_t).Ino; ino != stagedIno {
		t.Errorf("binary restored as inode %d, want the staged copy's %d (wrote %v)", ino, stagedIno, res.Wrote)
	}
	if !strings.Contains(strings.Join(res.Wrote, ","), "staged binary") {
		t.Errorf("copy not staged again: wrote %v", res.Wrote)
	}
	if same, err := nodefile.SameContent(n.src, staged); err != nil || !same {
		t.Errorf("staged copy after the restore: same %v, %v", same, err)
	}
	if err := in.VerifyInstalled(); err != nil {
		t.Fatal(err)
	}
}

// A staged copy that is not the binary to install (an older version's, or
// written over) is never renamed into place.
func TestStaleStagedBinaryNotUsed(t *testing.T) {
	n, in := installed(t)
	conflisttest.WriteFiles(t, n.bin, map[string]string{cniconf.StagedBinaryName: "#!/bin/sh\necho stale\n"})
	if err := os.Chmod(filepath.Join(n.bin, cniconf.StagedBinaryName), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(n.bin, cniconf.PluginType)); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{cniconf.PluginType, cniconf.StagedBinaryName} {
		if same, err := nodefile.SameContent(n.src, filepath.Join(n.bin, f)); err != nil || !same {
			t.Errorf("%s: same as the binary to install %v, %v", f, same, err)
		}
	}
}

// nadConfig is the config of consul-k8s's NetworkAttachmentDefinition
// (charts/consul/templates/cni-networkattachmentdefinition.yaml): it names
// the kubeconfig by consul-k8s's fixed name.
const nadConfig = `{"cniVersion":"0.3.1","type":"consul-cni","cni_bin_dir":"/opt/cni/bin","cni_net_dir":"/etc/cni/net.d",` +
	`"kubeconfig":"ZZZ-consul-cni-kubeconfig","log_level":"info","multus":true,"name":"consul-cni"}`

// A kubeconfig of ours under the earlier name is removed once our entry
// names the current one, unless another configuration on the node names
// it (a NetworkAttachmentDefinition-style delegate, Multus's list of
// delegates, a name the plugin completes with "-*") or Multus is on
// (NetworkAttachmentDefinitions live in the API, out of the installer's
// sight): then it is kept, brought up to date.
func TestLegacyKubeconfigKeptWhileNamed(t *testing.T) {
	for _, c := range []struct {
		name   string
		files  map[string]string
		multus bool
		kept   bool
	}{
		{"named by nothing else", nil, false, false},
		{"a NetworkAttachmentDefinition-style delegate file", map[string]string{"multus.d/consul-cni.conf": nadConfig}, false, true},
		{"Multus's delegates", map[string]string{"multus/00-multus.json": `{"name":"multus","type":"multus","delegates":[` + nadConfig + `]}`}, false, true},
		{"by its path in the host's net dir", map[string]string{"multus.d/c.conf": strings.Replace(nadConfig, `"ZZZ-consul-cni-kubeconfig"`, `"/etc/cni/net.d/ZZZ-consul-cni-kubeconfig"`, 1)}, false, true},
		{"by a name the plugin completes", map[string]string{"multus.d/c.conf": strings.Replace(nadConfig, `"ZZZ-consul-cni-kubeconfig"`, `"ZZZ-consul-cni"`, 1)}, false, true},
		{"a path in another directory", map[string]string{"multus.d/c.conf": strings.Replace(nadConfig, `"ZZZ-consul-cni-kubeconfig"`, `"/etc/other/ZZZ-consul-cni-kubeconfig"`, 1)}, false, false},
		{"too deep to be a configuration", map[string]string{"a/b/c/d.conf": nadConfig}, false, false},
		{"with Multus", nil, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newHostDirs(t)
			stale := strings.Replace(string(legacyKubeconfig(t)), "10.96.0.1", "10.96.0.2", 1)
			conflisttest.WriteFiles(t, n.net, map[string]string{
				"10-n.conflist":                  listWithEntry(cniconf.LegacyKubeconfigFileName),
				cniconf.LegacyKubeconfigFileName: stale,
			})
			conflisttest.WriteFiles(t, n.net, c.files)
			in := n.installer(t, func(cfg *Config) { cfg.Multus = c.multus })
			reconcile(t, in)
			if kc := entryKubeconfig(t, filepath.Join(n.net, "10-n.conflist")); kc != cniconf.KubeconfigFileName {
				t.Fatalf("entry names %q, want %q", kc, cniconf.KubeconfigFileName)
			}
			b, err := os.ReadFile(filepath.Join(n.net, cniconf.LegacyKubeconfigFileName))
			if !c.kept {
				if err == nil {
					t.Fatalf("%s kept though nothing else names it", cniconf.LegacyKubeconfigFileName)
				}
				return
			}
			cur, _ := os.ReadFile(filepath.Join(n.net, cniconf.KubeconfigFileName))
			if err != nil || string(b) != string(cur) {
				t.Fatalf("%s: %v; want it kept with the current kubeconfig's content\n%s", cniconf.LegacyKubeconfigFileName, err, b)
			}
			if st := reconcile(t, in); len(st.Wrote) != 0 {
				t.Errorf("a second pass wrote %v", st.Wrote)
			}
		})
	}
}
