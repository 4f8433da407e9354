package credentials

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/pkg/install/conflist/conflisttest"
)

func TestFromRESTTakesOnlyTokenCredentials(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.crt")
	os.WriteFile(ca, []byte("CAFILE"), 0o644)
	for _, tc := range []struct {
		name    string
		cfg     *rest.Config
		want    Source
		wantErr string
	}{
		{name: "in-cluster", cfg: &rest.Config{Host: "https://10.96.0.1:443", BearerToken: "t", BearerTokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token",
			TLSClientConfig: rest.TLSClientConfig{CAFile: ca}},
			want: Source{Server: "https://10.96.0.1:443", CAData: []byte("CAFILE"), TokenFile: "/var/run/secrets/kubernetes.io/serviceaccount/token", Token: "t"}},
		{name: "host without scheme", cfg: &rest.Config{Host: "127.0.0.1:6443", BearerToken: "t", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("X"), ServerName: "kubernetes"}},
			want: Source{Server: "https://127.0.0.1:6443", CAData: []byte("X"), Token: "t", TLSServerName: "kubernetes"}},
		{name: "client certificate", cfg: &rest.Config{Host: "https://h", TLSClientConfig: rest.TLSClientConfig{CertData: []byte("c"), KeyData: []byte("k")}},
			wantErr: "client certificate"},
		{name: "no server", cfg: &rest.Config{BearerToken: "t"}, wantErr: "no server"},
		{name: "missing CA file", cfg: &rest.Config{Host: "https://h", BearerToken: "t", TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(dir, "nope")}},
			wantErr: "CA file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromREST(tc.cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestKubeconfigNamesTheTokenFileAndEmbedsNoToken(t *testing.T) {
	b, err := Kubeconfig(Source{Server: "https://10.96.0.1:443", CAData: []byte("CA"), Token: "secret"}, "/etc/cni/net.d/"+cniconf.TokenFileName)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "secret") {
		t.Fatalf("kubeconfig embeds the token:\n%s", b)
	}
	cfg, err := clientcmd.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || cfg.Clusters[ctx.Cluster] == nil || cfg.AuthInfos[ctx.AuthInfo] == nil {
		t.Fatalf("incomplete kubeconfig\n%s", b)
	}
	if cl := cfg.Clusters[ctx.Cluster]; cl.Server != "https://10.96.0.1:443" || string(cl.CertificateAuthorityData) != "CA" {
		t.Errorf("server %q CA %q", cl.Server, cl.CertificateAuthorityData)
	}
	if ai := cfg.AuthInfos[ctx.AuthInfo]; ai.TokenFile != "/etc/cni/net.d/"+cniconf.TokenFileName {
		t.Errorf("tokenFile %q", ai.TokenFile)
	}
	if !Ours(b) {
		t.Error("the rendered kubeconfig is not recognised as ours")
	}
}

func TestOursTellsOurKubeconfigFromConsulK8ss(t *testing.T) {
	withUser := func(mut func(*clientcmdapi.AuthInfo)) string {
		a := &clientcmdapi.AuthInfo{TokenFile: "/etc/cni/net.d/" + cniconf.TokenFileName}
		mut(a)
		b, err := clientcmd.Write(clientcmdapi.Config{AuthInfos: map[string]*clientcmdapi.AuthInfo{"u": a}})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name string
		kc   string
		want bool
	}{
		{"ours", withUser(func(*clientcmdapi.AuthInfo) {}), true},
		{"ours, other host net dir", withUser(func(a *clientcmdapi.AuthInfo) { a.TokenFile = "/var/lib/cni/net.d/" + cniconf.TokenFileName }), true},
		{"consul-k8s's: embedded token", withUser(func(a *clientcmdapi.AuthInfo) { a.TokenFile, a.Token = "", "embedded-token" }), false},
		{"token file and embedded token", withUser(func(a *clientcmdapi.AuthInfo) { a.Token = "x" }), false},
		{"another token file", withUser(func(a *clientcmdapi.AuthInfo) { a.TokenFile = "/var/run/secrets/token" }), false},
		{"client certificate", withUser(func(a *clientcmdapi.AuthInfo) { a.ClientCertificateData = []byte("c") }), false},
		{"no user", "apiVersion: v1\nkind: Config\nclusters: []\n", false},
		{"not a kubeconfig", "{", false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Ours([]byte(tc.kc)); got != tc.want {
				t.Errorf("Ours = %v, want %v for\n%s", got, tc.want, tc.kc)
			}
		})
	}
}

func TestNamedByFindsWhatThePluginWouldResolve(t *testing.T) {
	dir := t.TempDir()
	entry := func(kc string) string {
		return `{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"ptp"},{"type":"consul-cni","kubeconfig":"` + kc + `"}]}`
	}
	conflisttest.WriteFiles(t, dir, map[string]string{
		"10-name.conflist":       entry("ZZZ-consul-cni-kubeconfig"),
		"20-host-path.conflist":  entry("/etc/cni/net.d/ZZZ-consul-cni-kubeconfig"),
		"30-prefix.conflist":     entry("ZZZ-consul-cni"),
		"40-other-dir.conflist":  entry("/elsewhere/ZZZ-consul-cni-kubeconfig"),
		"50-other-name.conflist": entry("consul-cni-kubeconfig"),
		"multus.d/60-deep.conf":  `{"delegates":[{"plugins":[{"kubeconfig":"ZZZ-consul-cni-kubeconfig"}]}]}`,
		"a/b/c/70-too-deep.conf": entry("ZZZ-consul-cni-kubeconfig"),
		"80-not-a-config.txt":    entry("ZZZ-consul-cni-kubeconfig"),
	})
	got, err := NamedBy(dir, "/etc/cni/net.d", "ZZZ-consul-cni-kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10-name.conflist", "20-host-path.conflist", "30-prefix.conflist", filepath.Join("multus.d", "60-deep.conf")}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("NamedBy = %v, want %v", got, want)
	}
}
