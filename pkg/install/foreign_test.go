package install

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/credentials/credentialstest"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/nodefile"
)

// consulK8sInstallationKubeconfig is the kubeconfig name consul-k8s's
// installer writes since 1.8: one per installation (its pod's UID).
const consulK8sInstallationKubeconfig = cniconf.ConsulK8sKubeconfigFileName + "-6f1c1a52-3c1e-4c1e-9a57-0d7a5e0c1b11"

// kubeconfigWith renders a kubeconfig whose user authenticates with the
// token or, when tokenFile is set, with that file.
func kubeconfigWith(t *testing.T, token, tokenFile string) string {
	t.Helper()
	b, err := clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"local": {Server: "https://10.96.0.1:443"}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"consul-cni": {Token: token, TokenFile: tokenFile}},
		Contexts:       map[string]*clientcmdapi.Context{"consul-cni-context": {Cluster: "local", AuthInfo: "consul-cni"}},
		CurrentContext: "consul-cni-context",
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// consulK8sEntryJSON is the entry consul-k8s's installer appends (its keys,
// mapstructure's order does not matter).
func consulK8sEntryJSON(netDir, kubeconfig string) string {
	return `{"name":"consul-cni","type":"consul-cni","cni_bin_dir":"/opt/cni/bin","cni_net_dir":"` + netDir +
		`","kubeconfig":"` + kubeconfig + `","cni_token_path":"/var/run/secrets/kubernetes.io/serviceaccount/token",` +
		`"cni_host_token_path":"","autorotate_token":false,"log_level":"info","multus":false}`
}

func TestJudgeForeignEntry(t *testing.T) {
	live := credentialstest.PodToken("consul-cni-abcde", "uid-live", time.Now().Add(time.Hour))
	gone := credentialstest.PodToken("consul-cni-fghij", "uid-gone", time.Now().Add(time.Hour))
	podGone := func(_ context.Context, _, _, uid string) (bool, error) {
		switch uid {
		case "uid-live":
			return false, nil
		case "uid-gone":
			return true, nil
		}
		return false, errors.New("the API does not answer")
	}
	old := time.Now().Add(-time.Minute)
	for _, c := range []struct {
		name string
		// entry is the list's last plugin; files are written into the net
		// dir (the list's mtime is listAge ago).
		entry   string
		files   map[string]string
		listAge time.Duration
		want    foreignVerdict
	}{
		{"ours", "", nil, time.Minute, replaceEntry},
		{"consul-k8s's, its installer running", consulK8sEntryJSON("/etc/cni/net.d", consulK8sInstallationKubeconfig),
			map[string]string{consulK8sInstallationKubeconfig: kubeconfigWith(t, live, "")}, time.Minute, keepEntry},
		{"consul-k8s's before 1.8 (one kubeconfig name)", consulK8sEntryJSON("/etc/cni/net.d", cniconf.ConsulK8sKubeconfigFileName),
			map[string]string{cniconf.ConsulK8sKubeconfigFileName: kubeconfigWith(t, "not-a-jwt", "")}, time.Minute, keepEntry},
		{"consul-k8s's, its pod gone without its cleanup", consulK8sEntryJSON("/etc/cni/net.d", consulK8sInstallationKubeconfig),
			map[string]string{consulK8sInstallationKubeconfig: kubeconfigWith(t, gone, "")}, time.Minute, replaceEntry},
		{"consul-k8s's, the API does not answer", consulK8sEntryJSON("/etc/cni/net.d", consulK8sInstallationKubeconfig),
			map[string]string{consulK8sInstallationKubeconfig: kubeconfigWith(t, credentialstest.PodToken("p", "uid-unknown", time.Now().Add(time.Hour)), "")}, time.Minute, keepEntry},
		{"consul-k8s's with autorotate-token, its pod gone", consulK8sEntryJSON("/etc/cni/net.d", consulK8sInstallationKubeconfig),
			map[string]string{consulK8sInstallationKubeconfig: kubeconfigWith(t, "", "/etc/cni/net.d/cni-host-token-x"), "cni-host-token-x": gone}, time.Minute, replaceEntry},
		{"consul-k8s's with autorotate-token, running", consulK8sEntryJSON("/etc/cni/net.d", consulK8sInstallationKubeconfig),
			map[string]string{consulK8sInstallationKubeconfig: kubeconfigWith(t, "", "/etc/cni/net.d/cni-host-token-x"), "cni-host-token-x": live}, time.Minute, keepEntry},
		{"consul-k8s's, its kubeconfig about to be written", consulK8sEntryJSON("/etc/cni/net.d", consulK8sInstallationKubeconfig), nil, 0, keepEntryForNow},
		{"consul-k8s's, its kubeconfig long gone", consulK8sEntryJSON("/etc/cni/net.d", consulK8sInstallationKubeconfig), nil, time.Minute, replaceEntry},
		{"an earlier installer of ours (its kubeconfig under consul-k8s's name)", consulK8sEntryJSON("/etc/cni/net.d", cniconf.LegacyKubeconfigFileName),
			map[string]string{cniconf.LegacyKubeconfigFileName: string(legacyKubeconfig(t))}, time.Minute, replaceEntry},
		{"consul-k8s's for another net dir", consulK8sEntryJSON("/var/lib/cni/net.d", consulK8sInstallationKubeconfig),
			map[string]string{consulK8sInstallationKubeconfig: kubeconfigWith(t, live, "")}, time.Minute, replaceEntry},
		{"a kubeconfig by path", consulK8sEntryJSON("/etc/cni/net.d", "/etc/cni/net.d/"+consulK8sInstallationKubeconfig),
			map[string]string{consulK8sInstallationKubeconfig: kubeconfigWith(t, live, "")}, time.Minute, replaceEntry},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := newHostDirs(t)
			in := n.installer(t, func(cfg *Config) { cfg.PodGone = podGone })
			entry := c.entry
			if entry == "" {
				entry = string(in.Entry().JSON())
			}
			list := filepath.Join(n.net, "10-n.conflist")
			conflisttest.WriteFiles(t, n.net, map[string]string{"10-n.conflist": `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"ptp"},` + entry + `]}`})
			conflisttest.WriteFiles(t, n.net, c.files)
			if c.listAge > 0 {
				if err := os.Chtimes(list, old, old); err != nil {
					t.Fatal(err)
				}
			}
			if got := in.judgeForeignEntry(context.Background(), []byte(entry), list); got != c.want {
				t.Errorf("judgeForeignEntry = %v, want %v", got, c.want)
			}
		})
	}
}

// A pass beside consul-k8s's running installer leaves its entry (the list
// is not written), installs our binary to serve it, and is ready; once that
// installer's cleanup has removed its entry, the next pass chains ours.
func TestPassLeavesConsulK8sEntry(t *testing.T) {
	n := newHostDirs(t)
	list := filepath.Join(n.net, "10-n.conflist")
	theirs := `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"ptp"},` + consulK8sEntryJSON("/etc/cni/net.d", consulK8sInstallationKubeconfig) + "]}\n"
	conflisttest.WriteFiles(t, n.net, map[string]string{
		"10-n.conflist":                 theirs,
		consulK8sInstallationKubeconfig: kubeconfigWith(t, "embedded", ""),
	})
	conflisttest.WriteFiles(t, n.bin, map[string]string{cniconf.PluginType: "#!/bin/sh\necho consul-k8s's plugin\n"})
	in := n.installer(t)
	st := reconcile(t, in)
	for _, w := range st.Wrote {
		if strings.HasPrefix(w, "chain") {
			t.Errorf("pass wrote the list beside consul-k8s's installer: %v", st.Wrote)
		}
	}
	if b, _ := os.ReadFile(list); string(b) != theirs {
		t.Errorf("list changed:\n%s", b)
	}
	if same, err := nodefile.SameContent(n.src, filepath.Join(n.bin, cniconf.PluginType)); err != nil || !same {
		t.Errorf("our binary does not serve the entry (same=%v, err=%v)", same, err)
	}
	if err := in.VerifyInstalled(); err != nil {
		t.Errorf("not ready beside consul-k8s's entry: %v", err)
	}
	if st := reconcile(t, in); len(st.Wrote) != 0 {
		t.Errorf("second pass wrote %v", st.Wrote)
	}

	// consul-k8s's cleanup: its entry out (in place), then its kubeconfig.
	if err := os.WriteFile(list, []byte(`{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"ptp"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(n.net, consulK8sInstallationKubeconfig)); err != nil {
		t.Fatal(err)
	}
	reconcile(t, in)
	if kc := entryKubeconfig(t, list); kc != cniconf.KubeconfigFileName {
		t.Errorf("after consul-k8s's cleanup the entry names %q, want ours", kc)
	}
}

// A list being written in place (empty for a moment) is read again rather
// than judged broken.
func TestScanConfDirWaitsForAWriteInPlace(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "10-n.conflist")
	if err := os.WriteFile(list, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(3 * restoreDebounce)
		_ = os.WriteFile(list, []byte(`{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"ptp"}]}`), 0o644)
	}()
	cands, err := conflist.ScanConfDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(cands) != 1 || !cands[0].Valid() {
		t.Fatalf("candidates %+v: want the list, valid, once written", cands)
	}

	// A file broken long ago costs no wait.
	old := time.Now().Add(-time.Minute)
	conflisttest.WriteFiles(t, dir, map[string]string{"05-broken.conflist": "{"})
	if err := os.Chtimes(filepath.Join(dir, "05-broken.conflist"), old, old); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cands, err = conflist.ScanConfDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= restoreDebounce || cands[0].Valid() {
		t.Errorf("old broken file: scan took %v (want no wait), valid=%v", took, cands[0].Valid())
	}
}

// A pod of consul-k8s's installer seen to exist is not asked about again
// for foreignPodTTL: a pass that follows a change must not wait for the API.
func TestForeignPodAskedOncePerTTL(t *testing.T) {
	n := newHostDirs(t)
	asked := 0
	in := n.installer(t, func(cfg *Config) {
		cfg.PodGone = func(context.Context, string, string, string) (bool, error) { asked++; return false, nil }
	})
	kc := []byte(kubeconfigWith(t, credentialstest.PodToken("consul-cni-abcde", "uid-live", time.Now().Add(time.Hour)), ""))
	for i := 0; i < 3; i++ {
		if !in.foreignPodAlive(context.Background(), kc) {
			t.Fatal("pod taken for gone")
		}
	}
	if asked != 1 {
		t.Errorf("API asked %d times in three passes, want 1", asked)
	}
	in.foreign.at["uid-live"] = time.Now().Add(-foreignPodTTL)
	in.foreignPodAlive(context.Background(), kc)
	if asked != 2 {
		t.Errorf("API asked %d times after the TTL, want 2", asked)
	}
}
