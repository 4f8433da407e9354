package cli

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// stamped is the version the test links into the binaries.
const stamped = "v0.0.0-clitest.7+gabc"

var commands = []string{"consul-cni", "consul-cni-installer", "consul-cni-check", "consul-cni-verifier", "repair"}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// build links every command once, with the Makefile's -X flag.
func build(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir := tmpDir
		args := []string{"build", "-trimpath", "-ldflags",
			"-X github.com/consul-cni-repair/consul-cni-repair/pkg/version.Version=" + stamped, "-o", dir + "/"}
		for _, c := range commands {
			args = append(args, "./cmd/"+c)
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = testbin.RepoRoot()
		cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = errors.New("go build: " + err.Error() + "\n" + string(out))
			return
		}
		binDir = dir
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

type result struct {
	code           int
	stdout, stderr string
}

func runCmd(t *testing.T, name string, env []string, stdin string, args ...string) result {
	t.Helper()
	cmd := exec.Command(filepath.Join(build(t), name), args...)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s %q: %v", name, args, err)
	}
	return r
}

func TestVersion(t *testing.T) {
	for _, c := range commands {
		for _, args := range [][]string{{"--version"}, {"-v=2", "--version"}} {
			if c == "consul-cni" && len(args) > 1 {
				continue
			}
			r := runCmd(t, c, nil, "", args...)
			want := c + " " + stamped + " (go"
			if r.code != 0 || !strings.HasPrefix(r.stdout, want) || strings.Count(r.stdout, "\n") != 1 {
				t.Errorf("%s %q: exit %d, stdout %q, stderr %q; want exit 0 and one line starting %q", c, args, r.code, r.stdout, r.stderr, want)
			}
		}
	}
	// The installer's subcommands share the root's flags.
	for _, sub := range []string{"run", "ready", "uninstall"} {
		r := runCmd(t, "consul-cni-installer", nil, "", sub, "--version")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "consul-cni-installer "+stamped+" ") {
			t.Errorf("consul-cni-installer %s --version: exit %d, stdout %q, stderr %q", sub, r.code, r.stdout, r.stderr)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	type tc struct {
		name string
		args []string
		want string // on stderr
	}
	var cases []tc
	for _, c := range commands {
		cases = append(cases,
			tc{c, []string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
			tc{c, []string{"-Z"}, "-Z"},
		)
	}
	cases = append(cases,
		tc{"consul-cni-installer", []string{"run", "--bogus"}, "unknown flag: --bogus"},
		tc{"consul-cni-installer", []string{"ready", "--resync"}, "--resync"},
		tc{"consul-cni-installer", []string{"install"}, `"install"`},
		tc{"consul-cni-installer", []string{"--log-level=loud"}, "--log-level"},
		tc{"consul-cni-check", []string{"--timeout=soon"}, "--timeout"},
		tc{"consul-cni-check", []string{"extra"}, `"extra"`},
		tc{"repair", []string{"--action=explode"}, "explode"},
		tc{"repair", []string{"--workers=many"}, "--workers"},
		tc{"repair", []string{"extra"}, `"extra"`},
		tc{"consul-cni", []string{"add"}, `"add"`},
		tc{"consul-cni-verifier", []string{"--node-name="}, "--node-name"},
		tc{"consul-cni-verifier", []string{"--node-name=n1", "--interval=1ms"}, "--interval"},
		tc{"consul-cni-verifier", []string{"--node-name=n1", "--cri-socket=relative.sock"}, "--cri-socket"},
		tc{"consul-cni-verifier", []string{"--node-name=n1", "extra"}, `"extra"`},
		tc{"repair", []string{"audit", "--no-such-flag"}, "unknown flag: --no-such-flag"},
		tc{"repair", []string{"audit", "-o", "xml"}, "--output"},
		tc{"repair", []string{"audit", "--min-pod-age=-1s"}, "--min-pod-age"},
		tc{"repair", []string{"audit", "extra"}, `"extra"`},
	)
	for _, c := range []string{"consul-cni-installer", "consul-cni-check", "consul-cni-verifier", "repair"} {
		cases = append(cases, tc{c, []string{"--logging-format=xml"}, "--logging-format=xml"})
	}
	for _, c := range cases {
		r := runCmd(t, c.name, nil, "", c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "--help") || r.stdout != "" {
			t.Errorf("%s %q: exit %d, stdout %q, stderr %q; want exit 2 and %q on stderr", c.name, c.args, r.code, r.stdout, r.stderr, c.want)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, c := range commands {
		r := runCmd(t, c, nil, "", "--help")
		if r.code != 0 || !strings.Contains(r.stderr, "--version") {
			t.Errorf("%s --help: exit %d, stderr %q; want exit 0 and --version listed", c, r.code, r.stderr)
		}
	}
}

// repair audit has its own help and version.
func TestAuditHelpAndVersion(t *testing.T) {
	r := runCmd(t, "repair", nil, "", "audit", "--help")
	if r.code != 0 || !strings.Contains(r.stderr, "repair audit [flags]") || !strings.Contains(r.stderr, "--chunk-size") {
		t.Errorf("repair audit --help: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCmd(t, "repair", nil, "", "audit", "--version")
	if r.code != 0 || !strings.Contains(r.stdout, stamped) {
		t.Errorf("repair audit --version: exit %d, stdout %q", r.code, r.stdout)
	}
}

// Under the kubectl plugin's name (a link, as make build writes it), repair
// runs the audit as "kubectl consul-cni audit" and nothing else.
func TestKubectlPluginName(t *testing.T) {
	link := filepath.Join(build(t), "kubectl-consul_cni")
	if err := os.Symlink("repair", link); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	r := runCmd(t, "kubectl-consul_cni", nil, "", "audit", "--help")
	if r.code != 0 || !strings.Contains(r.stderr, "kubectl consul-cni audit [flags]") {
		t.Errorf("kubectl-consul_cni audit --help: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCmd(t, "kubectl-consul_cni", nil, "", "--leader-elect=false")
	if r.code != 2 || !strings.Contains(r.stderr, "kubectl consul-cni audit") {
		t.Errorf("kubectl-consul_cni without audit: exit %d, stderr %q; want a usage error", r.code, r.stderr)
	}
	r = runCmd(t, "kubectl-consul_cni", nil, "", "--help")
	if r.code != 0 || !strings.Contains(r.stderr, "kubectl consul-cni audit [flags]") {
		t.Errorf("kubectl-consul_cni --help: exit %d, stderr %q; want exit 0 and the usage", r.code, r.stderr)
	}
	r = runCmd(t, "kubectl-consul_cni", nil, "", "--version")
	if r.code != 0 || !strings.Contains(r.stdout, stamped) {
		t.Errorf("kubectl-consul_cni --version: exit %d, stdout %q; want exit 0 and %s", r.code, r.stdout, stamped)
	}
}

// The plugin finds the cluster as kubectl does: ~/.kube/config without
// $KUBECONFIG, and --context picks another of its contexts. Nothing listens
// on the servers it names: the error shows which one was asked.
func TestKubectlPluginReadsHomeKubeconfig(t *testing.T) {
	link := filepath.Join(build(t), "kubectl-consul_cni")
	if err := os.Symlink("repair", link); err != nil && !os.IsExist(err) {
		t.Fatal(err)
	}
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".kube"), 0o700); err != nil {
		t.Fatal(err)
	}
	config := `apiVersion: v1
kind: Config
clusters:
- {name: a, cluster: {server: "https://127.0.0.1:1"}}
- {name: b, cluster: {server: "https://127.0.0.1:2"}}
users:
- {name: u, user: {token: t}}
contexts:
- {name: a, context: {cluster: a, user: u}}
- {name: b, context: {cluster: b, user: u}}
current-context: a
`
	if err := os.WriteFile(filepath.Join(home, ".kube", "config"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"HOME=" + home}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"audit"}, "127.0.0.1:1"},
		{[]string{"audit", "--context", "b"}, "127.0.0.1:2"},
	} {
		r := runCmd(t, "kubectl-consul_cni", env, "", tc.args...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("kubectl-consul_cni %q with ~/.kube/config: exit %d, stderr %q; want exit 1 naming %s", tc.args, r.code, r.stderr, tc.want)
		}
	}
}

// The plugin still speaks CNI when the runtime runs it without arguments.
func TestPluginStillSpeaksCNI(t *testing.T) {
	r := runCmd(t, "consul-cni", []string{"CNI_COMMAND=VERSION"}, `{"cniVersion":"1.0.0"}`)
	if r.code != 0 || !strings.Contains(r.stdout, `"supportedVersions"`) {
		t.Fatalf("CNI_COMMAND=VERSION: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCmd(t, "consul-cni", nil, "")
	if !strings.Contains(r.stderr, "consul-cni "+stamped+" ") {
		t.Fatalf("without CNI_COMMAND the plugin names its version: exit %d, stderr %q", r.code, r.stderr)
	}
}

// tmpDir holds the binaries of this test process; TestMain removes it.
var tmpDir string

func TestMain(m *testing.M) {
	d, err := os.MkdirTemp("", "ccr-cli-")
	if err != nil {
		panic(err)
	}
	tmpDir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}
