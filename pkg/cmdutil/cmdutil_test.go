package cmdutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/configkey"
)

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	body := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "` + server + `"}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRESTConfigSources(t *testing.T) {
	flagFile := writeKubeconfig(t, "https://flag.example:6443")
	envFile := writeKubeconfig(t, "https://env.example:6443")

	t.Setenv("KUBECONFIG", envFile)
	cfg, err := RESTConfig(flagFile)
	if err != nil || cfg.Host != "https://flag.example:6443" {
		t.Fatalf("flag first: host %v, err %v", cfg, err)
	}
	cfg, err = RESTConfig("")
	if err != nil || cfg.Host != "https://env.example:6443" {
		t.Fatalf("then $KUBECONFIG: host %v, err %v", cfg, err)
	}

	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := RESTConfig(""); err == nil || !strings.Contains(err.Error(), "in-cluster") {
		t.Fatalf("then in-cluster, which is not available here: err %v", err)
	}

	missing := filepath.Join(t.TempDir(), "absent")
	if _, err := RESTConfig(missing); err == nil || !strings.Contains(err.Error(), "--kubeconfig "+missing) {
		t.Fatalf("a missing file must be named with its source: err %v", err)
	}
}

func TestFlagError(t *testing.T) {
	flags := map[string]string{"Workers": "workers", "BackoffBase": "backoff-base", "BackoffMax": "backoff-max"}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{configkey.New("Workers", 0, "must be at least 1"), "--workers: 0 must be at least 1"},
		{configkey.Errorf("BackoffBase/BackoffMax", "2s/1s: bad"), "--backoff-base/--backoff-max: 2s/1s: bad"},
		{fmt.Errorf("starting: %w", configkey.New("Workers", 0, "bad")), "starting: --workers: 0 bad"},
		{configkey.New("Unknown", "x", "bad"), `Unknown: "x" bad`},
		{errors.New("plain"), "plain"},
	} {
		if got := FlagError(tc.err, flags).Error(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}
