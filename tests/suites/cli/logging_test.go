package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/annotations"
)

// jsonLines parses every non-empty line of out as a JSON log entry of
// k8s.io/component-base/logs and returns them; any other line fails.
func jsonLines(t *testing.T, what, out string) []map[string]any {
	t.Helper()
	var entries []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Errorf("%s: line is not JSON (%v): %s", what, err, line)
			continue
		}
		if _, ok := e["ts"]; !ok {
			t.Errorf("%s: entry without ts: %s", what, line)
		}
		if _, ok := e["msg"]; !ok {
			t.Errorf("%s: entry without msg: %s", what, line)
		}
		entries = append(entries, e)
	}
	if len(entries) == 0 {
		t.Errorf("%s: no log entry in %q", what, out)
	}
	return entries
}

// noKube is an environment with no Kubernetes client configuration.
var noKube = []string{"HOME=/nonexistent", "PATH=/usr/bin:/bin"}

func TestJSONLogsCheck(t *testing.T) {
	dir := t.TempDir()
	ann := filepath.Join(dir, "annotations")
	body := fmt.Sprintf("%s=%q\n%s=%q\n", annotations.KeyInjectStatus, annotations.InjectStatusInjected,
		annotations.KeyTransparentProxyStatus, annotations.TProxyStatusComplete)
	if err := os.WriteFile(ann, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runCmd(t, "consul-cni-check", noKube, "", "--logging-format=json", "--annotations-file="+ann, "--api=false", "--termination-log=")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	jsonLines(t, "consul-cni-check", r.stderr)
}

func TestJSONLogsInstallerRun(t *testing.T) {
	dir := t.TempDir()
	// No client configuration: run fails at once, and says so in a JSON entry.
	r := runCmd(t, "consul-cni-installer", noKube, "", "run", "--logging-format=json",
		"--cni-bin-dir="+dir, "--cni-net-dir="+dir, "--plugin-binary="+filepath.Join(build(t), "consul-cni"))
	if r.code != 1 {
		t.Fatalf("exit %d, stderr %q; want 1 (no client configuration)", r.code, r.stderr)
	}
	found := false
	for _, e := range jsonLines(t, "consul-cni-installer run", r.stderr) {
		if e["msg"] == "Installer failed" && strings.Contains(fmt.Sprint(e["err"]), "client configuration") {
			found = true
		}
	}
	if !found {
		t.Errorf("no JSON entry for the failure: %s", r.stderr)
	}
}

// The controller runs until SIGTERM; its first entry names the version.
func TestJSONLogsRepair(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	// An API server that is not there: the controller starts and waits.
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\"}\n" +
		"users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\n"
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(build(t), "repair"), "--logging-format=json", "--kubeconfig="+kc,
		"--leader-elect=false", "--metrics-bind-address=0", "--health-probe-bind-address=0")
	cmd.Env = noKube
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(stderr)
	if !sc.Scan() {
		t.Fatalf("repair wrote no log line: %v", sc.Err())
	}
	first := sc.Text()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	entries := jsonLines(t, "repair", first)
	if len(entries) == 1 && (entries[0]["msg"] != "Starting" || entries[0]["version"] != stamped) {
		t.Errorf("first entry %s: want msg Starting with version %s", first, stamped)
	}
}
