package plugin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cniversion "github.com/containernetworking/cni/pkg/version"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect/iptables"
)

func TestParseConfigUpstreamEntry(t *testing.T) {
	// What consul-k8s's installer writes, newer keys included.
	stdin := conflistEntry("0.3.1", `,"cni_token_path":"/var/run/secrets/kubernetes.io/serviceaccount/token","cni_host_token_path":"","autorotate_token":false,"runtime_config":{}`)
	c, err := parseConfig([]byte(stdin))
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "k8s-pod-network" || c.Type != "consul-cni" || c.CNINetDir != "/etc/cni/net.d" || c.CNIBinDir != "/opt/cni/bin" ||
		c.Kubeconfig != cniconf.ConsulK8sKubeconfigFileName || c.Multus || c.PrevResult == nil {
		t.Fatalf("%+v", c)
	}
	if c.apiTimeout != DefaultAPITimeout || c.iptablesTimeout != DefaultIptablesTimeout || !c.autoVariant || c.StateDir != DefaultStateDir {
		t.Fatalf("defaults %+v", c)
	}
	c, err = parseConfig([]byte(conflistEntry("1.1.0", `,"api_timeout":"2s","iptables_timeout":"5s","iptables_backend":"legacy","log_level":"warn"`)))
	if err != nil {
		t.Fatal(err)
	}
	if c.apiTimeout != 2*time.Second || c.iptablesTimeout != 5*time.Second || c.autoVariant || c.iptablesVariant != iptables.VariantLegacy {
		t.Fatalf("%+v", c)
	}
}

// The variant of the iptables tools is iptables_variant; its former key
// iptables_backend, which chain entries already written may hold, still
// works, alone or with the same value.
func TestIptablesVariantKeys(t *testing.T) {
	for _, extra := range []string{`,"iptables_variant":"legacy"`, `,"iptables_backend":"legacy"`,
		`,"iptables_variant":"legacy","iptables_backend":"Legacy"`} {
		c, err := parseConfig([]byte(conflistEntry("1.0.0", extra)))
		if err != nil {
			t.Fatalf("%s: %v", extra, err)
		}
		if c.autoVariant || c.iptablesVariant != iptables.VariantLegacy {
			t.Fatalf("%s: variant %q (auto %v)", extra, c.iptablesVariant, c.autoVariant)
		}
	}
}

func TestParseConfigErrorsNameKeyAndValue(t *testing.T) {
	for _, tc := range []struct {
		name, stdin string
		want        []string
	}{
		{"not json", `{"cniVersion":`, []string{"not valid JSON"}},
		{"no version", `{"name":"n","type":"consul-cni"}`, []string{`"cniVersion"`, "required"}},
		{"unknown version", `{"cniVersion":"0.9.0","name":"n"}`, []string{`"cniVersion"`, `"0.9.0"`, "not supported"}},
		{"api timeout", conflistEntry("1.0.0", `,"api_timeout":"soon"`), []string{`"api_timeout"`, `"soon"`}},
		{"negative timeout", conflistEntry("1.0.0", `,"api_timeout":"-1s"`), []string{`"api_timeout"`, `"-1s"`}},
		{"huge timeout", conflistEntry("1.0.0", `,"iptables_timeout":"1h"`), []string{`"iptables_timeout"`, `"1h"`}},
		{"iptables variant", conflistEntry("1.0.0", `,"iptables_variant":"nftables"`), []string{`"iptables_variant"`, `"nftables"`}},
		{"iptables variant, former key", conflistEntry("1.0.0", `,"iptables_backend":"nftables"`), []string{`"iptables_backend"`, `"nftables"`}},
		{"iptables variant, both keys", conflistEntry("1.0.0", `,"iptables_variant":"nft","iptables_backend":"legacy"`), []string{`"iptables_backend"`, `"legacy"`, `"nft"`}},
		{"backend", conflistEntry("1.0.0", `,"backend":"nft"`), []string{`"backend"`, `"nft"`, "iptables or nftables"}},
		{"backend case", conflistEntry("1.0.0", `,"backend":"NFTables"`), []string{`"backend"`, `"NFTables"`}},
		{"log level", conflistEntry("1.0.0", `,"log_level":"verbose"`), []string{`"log_level"`, `"verbose"`}},
		{"kubeconfig glob", conflistEntry("1.0.0", `,"kubeconfig":"kc*"`), []string{`"kubeconfig"`, `"kc*"`}},
		{"relative net dir", conflistEntry("1.0.0", `,"cni_net_dir":"etc/cni"`), []string{`"cni_net_dir"`, `"etc/cni"`}},
		{"relative log file", conflistEntry("1.0.0", `,"log_file":"cni.log"`), []string{`"log_file"`, `"cni.log"`}},
		{"relative state dir", conflistEntry("1.0.0", `,"state_dir":"run"`), []string{`"state_dir"`, `"run"`}},
		{"bad prevResult", `{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":"x"}}`, []string{"prevResult"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tc.stdin))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %s", err, w)
				}
			}
		})
	}
}

func TestParseCNIArgs(t *testing.T) {
	a, err := parseCNIArgs(`IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web-0;K8S_POD_UID=u-1;K8S_POD_INFRA_CONTAINER_ID=abc;CONSUL_IPTABLES_CONFIG={"a":"b=c"};OTHER=x`)
	if err != nil {
		t.Fatal(err)
	}
	if a.PodNamespace != "ns" || a.PodName != "web-0" || a.PodUID != "u-1" || a.InfraContainerID != "abc" || a.IptablesConfig != `{"a":"b=c"}` {
		t.Fatalf("%+v", a)
	}
	if _, err := parseCNIArgs("K8S_POD_NAME"); err == nil {
		t.Fatal("pair without = accepted")
	}
	if a, err := parseCNIArgs(""); err != nil || a != (cniArgs{}) {
		t.Fatal("empty")
	}
}

func TestResolveKubeconfig(t *testing.T) {
	touch := func(t *testing.T, path string, age time.Duration) {
		t.Helper()
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		ts := time.Now().Add(-age)
		if err := os.Chtimes(path, ts, ts); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  string // base name, "" for an error
	}{
		{"stable file", func(t *testing.T, d string) {
			touch(t, filepath.Join(d, "kc"), 0)
			touch(t, filepath.Join(d, "kc-new"), 0)
		}, "kc"},
		{"stable is a directory", func(t *testing.T, d string) {
			os.Mkdir(filepath.Join(d, "kc"), 0o755)
			touch(t, filepath.Join(d, "kc-1"), time.Hour)
		}, "kc-1"},
		{"newest versioned", func(t *testing.T, d string) {
			touch(t, filepath.Join(d, "kc-aaa"), time.Hour)
			touch(t, filepath.Join(d, "kc-zzz"), 2*time.Hour)
			touch(t, filepath.Join(d, "kc-mmm"), time.Minute)
			os.Mkdir(filepath.Join(d, "kc-dir"), 0o755)
		}, "kc-mmm"},
		{"other names ignored", func(t *testing.T, d string) {
			touch(t, filepath.Join(d, "kcx"), 0)
			touch(t, filepath.Join(d, "other-1"), 0)
		}, ""},
		{"nothing", func(t *testing.T, d string) {}, ""},
		{"symbolic link to a file", func(t *testing.T, d string) {
			touch(t, filepath.Join(d, "real"), 0)
			os.Symlink("real", filepath.Join(d, "kc"))
		}, "kc"},
		// Something is there but cannot be used: not absence, so not
		// ErrNoKubeconfig (the plugin fails closed instead of passing
		// pods through).
		{"stable is a directory, nothing else", func(t *testing.T, d string) {
			os.Mkdir(filepath.Join(d, "kc"), 0o755)
		}, "!"},
		{"symbolic link loop", func(t *testing.T, d string) {
			os.Symlink("kc", filepath.Join(d, "kc"))
		}, "!"},
		{"dangling symbolic link", func(t *testing.T, d string) {
			os.Symlink("gone", filepath.Join(d, "kc"))
		}, "!"},
		{"versioned directory only", func(t *testing.T, d string) {
			os.Mkdir(filepath.Join(d, "kc-1"), 0o755)
		}, "!"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, dir)
			got, err := ResolveKubeconfig(dir, "kc")
			if tc.want == "!" {
				if err == nil || errors.Is(err, ErrNoKubeconfig) || !strings.Contains(err.Error(), "cannot be used") {
					t.Fatalf("got %q, %v; want an error that is not ErrNoKubeconfig", got, err)
				}
				return
			}
			if tc.want == "" {
				if !errors.Is(err, ErrNoKubeconfig) || !strings.Contains(err.Error(), "no kubeconfig found") {
					t.Fatalf("got %q, %v", got, err)
				}
				return
			}
			if err != nil || got != filepath.Join(dir, tc.want) {
				t.Fatalf("got %q, %v; want %s", got, err, tc.want)
			}
		})
	}
	abs := filepath.Join(t.TempDir(), "abs")
	touch(t, abs, 0)
	if got, err := ResolveKubeconfig("/nonexistent", abs); err != nil || got != abs {
		t.Fatalf("absolute: %q %v", got, err)
	}
	if _, err := ResolveKubeconfig("/etc/cni/net.d", ""); err == nil || !strings.Contains(err.Error(), `"kubeconfig"`) {
		t.Fatalf("empty name: %v", err)
	}
}

// consul-k8s's kubeconfig names resolve to our installer's kubeconfig
// when nothing of consul-k8s's is there; other names never do.
func TestResolveKubeconfigFallsBackToOurs(t *testing.T) {
	ck := cniconf.ConsulK8sKubeconfigFileName
	for _, tc := range []struct {
		name, kubeconfig string
		files            []string
		want             string // base name, "" for ErrNoKubeconfig
	}{
		{"consul-k8s's entry before its kubeconfig", ck + "-uid", []string{cniconf.KubeconfigFileName}, cniconf.KubeconfigFileName},
		{"consul-k8s's NetworkAttachmentDefinition", ck, []string{cniconf.KubeconfigFileName}, cniconf.KubeconfigFileName},
		{"consul-k8s's kubeconfig there", ck, []string{cniconf.KubeconfigFileName, ck + "-uid"}, ck + "-uid"},
		{"neither", ck, nil, ""},
		{"another name", "other-kubeconfig", []string{cniconf.KubeconfigFileName}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got, err := ResolveKubeconfig(dir, tc.kubeconfig)
			if tc.want == "" {
				if !errors.Is(err, ErrNoKubeconfig) {
					t.Fatalf("got %q, %v; want ErrNoKubeconfig", got, err)
				}
				return
			}
			if err != nil || got != filepath.Join(dir, tc.want) {
				t.Fatalf("got %q, %v; want %s", got, err, tc.want)
			}
		})
	}
}

func TestNewKubeClientHonoursTokenFileAndTimeout(t *testing.T) {
	dir := t.TempDir()
	writeKubeconfig(t, filepath.Join(dir, "kc-1"))
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("t0k3n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseConfig([]byte(`{"cniVersion":"1.0.0","cni_net_dir":"` + dir + `","kubeconfig":"kc","api_timeout":"3s"}`))
	if err != nil {
		t.Fatal(err)
	}
	client, path, err := NewKubeClient(c)
	if err != nil || client == nil || path != filepath.Join(dir, "kc-1") {
		t.Fatalf("%v %q %v", client, path, err)
	}
	if rc := client.(*restPods); rc.client.Timeout != 3*time.Second || rc.tokenFile != filepath.Join(dir, "token") {
		t.Fatalf("timeout %v tokenFile %q", rc.client.Timeout, rc.tokenFile)
	}
}

// The plugin accepts every log level the installer may write.
func TestConfigAcceptsSharedLogLevels(t *testing.T) {
	for _, l := range cniconf.LogLevels {
		c := &Config{}
		c.CNIVersion, c.LogLevel = "1.0.0", l
		if err := c.validate(); err != nil {
			t.Errorf("log_level %q: %v", l, err)
		}
	}
}

// The plugin answers VERSION with every version consul-k8s's plugin
// accepts (version.All): the runtime refuses to call a plugin for a network
// whose version it does not list, so chaining into a 0.1.0 or 0.2.0
// network would otherwise fail every ADD and DEL of the node.
func TestSupportsEveryCNIVersion(t *testing.T) {
	have := map[string]bool{}
	for _, v := range VersionInfo.SupportedVersions() {
		have[v] = true
	}
	for _, v := range cniversion.All.SupportedVersions() {
		if !have[v] {
			t.Errorf("CNI version %s not supported", v)
		}
		if _, err := parseConfig([]byte(conflistEntry(v, ""))); err != nil {
			t.Errorf("CNI version %s: %v", v, err)
		}
	}
}
