package cmdutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// writeFile writes body to a new file and returns its path.
func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// twoContexts has contexts one (current) and two, on different servers.
const twoContexts = `apiVersion: v1
kind: Config
clusters:
- {name: c1, cluster: {server: "https://one.example:6443"}}
- {name: c2, cluster: {server: "https://two.example:6443"}}
users:
- {name: u, user: {token: t}}
contexts:
- {name: one, context: {cluster: c1, user: u}}
- {name: two, context: {cluster: c2, user: u}}
current-context: one
`

// noKubeconfig leaves the test without $KUBECONFIG, in-cluster settings and
// a home kubeconfig.
func noKubeconfig(t *testing.T) {
	t.Helper()
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	home := filepath.Join(t.TempDir(), "absent", "config")
	old := clientcmd.RecommendedHomeFile
	clientcmd.RecommendedHomeFile = home
	t.Cleanup(func() { clientcmd.RecommendedHomeFile = old })
}

func host(t *testing.T, k KubectlConfig) string {
	t.Helper()
	cfg, err := k.RESTConfig()
	if err != nil {
		t.Fatalf("%+v: %v", k, err)
	}
	return cfg.Host
}

// $KUBECONFIG is a list whose files are merged as kubectl merges them: here
// the first names the current context, the second defines it.
func TestKubectlConfigMergesTheKubeconfigList(t *testing.T) {
	noKubeconfig(t)
	first := writeFile(t, "apiVersion: v1\nkind: Config\ncurrent-context: two\n")
	second := writeFile(t, twoContexts)
	t.Setenv("KUBECONFIG", first+string(os.PathListSeparator)+second)
	if got := host(t, KubectlConfig{}); got != "https://two.example:6443" {
		t.Errorf("KUBECONFIG=%s:%s: host %s, want the second file's context two", first, second, got)
	}
	if got := host(t, KubectlConfig{Context: "one"}); got != "https://one.example:6443" {
		t.Errorf("--context one: host %s", got)
	}
}

// --context picks a context of the file; --kubeconfig wins over
// $KUBECONFIG; an unknown context is an error naming it.
func TestKubectlConfigFlags(t *testing.T) {
	noKubeconfig(t)
	file := writeFile(t, twoContexts)
	t.Setenv("KUBECONFIG", writeKubeconfig(t, "https://env.example:6443"))
	if got := host(t, KubectlConfig{}); got != "https://env.example:6443" {
		t.Errorf("$KUBECONFIG: host %s", got)
	}
	if got := host(t, KubectlConfig{Kubeconfig: file}); got != "https://one.example:6443" {
		t.Errorf("--kubeconfig: host %s, want its current context", got)
	}
	if got := host(t, KubectlConfig{Kubeconfig: file, Context: "two"}); got != "https://two.example:6443" {
		t.Errorf("--context two: host %s", got)
	}
	_, err := (&KubectlConfig{Kubeconfig: file, Context: "three"}).RESTConfig()
	if err == nil || !strings.Contains(err.Error(), "three") || !strings.Contains(err.Error(), "--kubeconfig "+file) {
		t.Errorf("--context three: err %v, want one naming the context and the file", err)
	}
}

// Without --kubeconfig and $KUBECONFIG, ~/.kube/config; without any file,
// the in-cluster configuration (not available here: the error says what
// was tried).
func TestKubectlConfigHomeThenInCluster(t *testing.T) {
	noKubeconfig(t)
	if _, err := (&KubectlConfig{}).RESTConfig(); err == nil || !strings.Contains(err.Error(), "~/.kube/config") {
		t.Errorf("no configuration at all: err %v", err)
	}
	clientcmd.RecommendedHomeFile = writeFile(t, twoContexts)
	if got := host(t, KubectlConfig{}); got != "https://one.example:6443" {
		t.Errorf("~/.kube/config: host %s", got)
	}
}
