// Package consulk8s runs consul-k8s's own CNI installer (`install-cni`)
// and plugin (`consul-cni`) as the oracle of the tests that stand for
// consul-k8s: coexistence, migration and repair-only.
//
// The binaries are not part of the project. $CCR_CONSUL_K8S_DIR names a
// directory holding them xz-compressed (install-cni.xz, consul-cni.xz) with
// a SHA256SUMS file of the uncompressed programs; Unpack decompresses them
// into the test binaries' cache, checks the sums and returns their paths.
// Without the directory the tests that need them skip and say why.
//
// Start runs install-cni the way consul-k8s's chart runs its CNI DaemonSet
// (charts/consul/templates/cni-daemonset.yaml): the flags -log-level,
// -cni-bin-dir, -cni-net-dir, -multus, -installation-id=$(POD_UID) and,
// when set, -autorotate-token; the environment POD_UID,
// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT; the pod's
// service-account token and CA at /var/run/secrets/kubernetes.io/
// serviceaccount (inside a mount namespace of its own, so the host never
// sees that mount); the plugin in -bin-source-dir, as consul-k8s's image
// holds it in /bin. It runs on the host against plain directories, or
// inside a node's mount and network namespaces against the node's CNI
// directories.
package consulk8s

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/cniconf"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/testbin"
)

// EnvDir names the directory holding consul-k8s's binaries.
const EnvDir = "CCR_CONSUL_K8S_DIR"

// Names of the programs, compressed (with ".xz") and in SHA256SUMS.
const (
	InstallCNIName = "install-cni"
	PluginName     = cniconf.PluginType
)

// KubeconfigPrefix starts the name of the kubeconfig consul-k8s's
// installer writes into the CNI net dir: since consul-k8s 1.8 it is
// "ZZZ-consul-cni-kubeconfig-<installation id>".
const KubeconfigPrefix = cniconf.ConsulK8sKubeconfigFileName + "-"

// Binaries are consul-k8s's programs, unpacked and checked.
type Binaries struct {
	// InstallCNI is the installer (consul-k8s-control-plane install-cni).
	InstallCNI string
	// SourceDir holds the plugin as consul-cni, as /bin does in
	// consul-k8s's image (install-cni's -bin-source-dir).
	SourceDir string
}

// Plugin is the path of consul-k8s's plugin.
func (b Binaries) Plugin() string { return filepath.Join(b.SourceDir, PluginName) }

// SkipTB is what Unpack needs of a test.
type SkipTB interface {
	testbin.TB
	Skipf(format string, args ...any)
}

var (
	unpackMu  sync.Mutex
	unpacked  *Binaries
	unpackErr error
)

// Unpack returns consul-k8s's binaries, decompressed once per test process
// into the test binaries' cache and checked against SHA256SUMS. Without
// $CCR_CONSUL_K8S_DIR (or with the directory absent) the test is skipped
// with the reason; a sum that does not match fails it.
func Unpack(tb SkipTB) Binaries {
	tb.Helper()
	src := os.Getenv(EnvDir)
	if src == "" {
		tb.Skipf("consul-k8s's install-cni and consul-cni are not available: set $%s to a directory with install-cni.xz, consul-cni.xz and SHA256SUMS", EnvDir)
	}
	if _, err := os.Stat(filepath.Join(src, "SHA256SUMS")); err != nil {
		tb.Skipf("consul-k8s's install-cni and consul-cni are not available: $%s=%s: %v", EnvDir, src, err)
	}
	unpackMu.Lock()
	defer unpackMu.Unlock()
	if unpacked == nil && unpackErr == nil {
		var b Binaries
		b, unpackErr = unpack(src, filepath.Join(testbin.Dir(), "consul-k8s"))
		unpacked = &b
	}
	if unpackErr != nil {
		tb.Fatalf("consul-k8s binaries from %s: %v", src, unpackErr)
	}
	return *unpacked
}

func unpack(src, dst string) (Binaries, error) {
	sums, err := readSums(filepath.Join(src, "SHA256SUMS"))
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{InstallCNI: filepath.Join(dst, "bin", InstallCNIName), SourceDir: filepath.Join(dst, "source")}
	for name, out := range map[string]string{InstallCNIName: b.InstallCNI, PluginName: b.Plugin()} {
		want, ok := sums[name]
		if !ok {
			return Binaries{}, fmt.Errorf("SHA256SUMS has no line for %s", name)
		}
		if got, err := fileSum(out); err == nil && got == want {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return Binaries{}, err
		}
		tmp := out + ".tmp"
		if err := xzDecompress(filepath.Join(src, name+".xz"), tmp); err != nil {
			return Binaries{}, err
		}
		got, err := fileSum(tmp)
		if err != nil {
			return Binaries{}, err
		}
		if got != want {
			os.Remove(tmp)
			return Binaries{}, fmt.Errorf("%s.xz decompresses to sha256 %s, SHA256SUMS says %s", name, got, want)
		}
		if err := os.Rename(tmp, out); err != nil {
			return Binaries{}, err
		}
	}
	return b, nil
}

func readSums(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 {
			sums[strings.TrimPrefix(fields[1], "*")] = fields[0]
		}
	}
	return sums, sc.Err()
}

func fileSum(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func xzDecompress(src, dst string) error {
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd := exec.Command("xz", "-dc", src)
	cmd.Stdout, cmd.Stderr = out, &stderr
	err = cmd.Run()
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("xz -dc %s: %v: %s", src, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Options are what consul-k8s's chart and kubelet give the installer's
// container.
type Options struct {
	// BinDir and NetDir are the CNI directories as the installer sees them
	// (-cni-bin-dir, -cni-net-dir; the chart's cniBinDir and cniNetDir,
	// /opt/cni/bin and /etc/cni/net.d by default).
	BinDir, NetDir string
	// InstallationID is the pod's UID (-installation-id=$(POD_UID)).
	InstallationID string
	// Multus, AutorotateToken and LogLevel are the chart's values
	// connectInject.cni.multus, .autorotateToken and .logLevel [info].
	Multus, AutorotateToken bool
	LogLevel                string
	// Server is the API server as the installer reaches it; it becomes
	// KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT.
	Server string
	// CA is the API server's CA (ca.crt of the service-account volume).
	CA []byte
	// TokenFile is the pod's service-account token; its directory is what
	// the installer sees at /var/run/secrets/kubernetes.io/serviceaccount,
	// so a token rotated there is seen as kubelet's rotation.
	TokenFile string
	// MountNS and NetNS, when set, are the mount namespace (a
	// /proc/<pid>/ns/mnt path) and network namespace the installer runs in,
	// as a hostNetwork container of a node does.
	MountNS, NetNS string
	// Log receives the installer's output [discarded].
	Log io.Writer
}

// Installer is a running install-cni.
type Installer struct {
	p    *proc.Process
	opts Options
}

// saDir is where a pod's container finds its service-account volume.
const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// mountScript makes the service-account volume inside the installer's own
// mount namespace: a tmpfs over /run (only in that namespace) holding
// secrets/kubernetes.io/serviceaccount bound to the token's directory.
const mountScript = `set -e
mount -t tmpfs -o mode=0755 ccr-consulk8s /run
mkdir -p ` + saDir + `
mount --bind "$0" ` + saDir + `
exec "$@"`

// Start runs install-cni with opts; it stops (SIGTERM, its cleanup, then
// SIGKILL after 10 s) when the test ends unless Stop ran first.
func Start(b Binaries, opts Options) (*Installer, error) {
	if opts.LogLevel == "" {
		opts.LogLevel = "info"
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	host, port, err := serverHostPort(opts.Server)
	if err != nil {
		return nil, err
	}
	tokenDir := filepath.Dir(opts.TokenFile)
	if filepath.Base(opts.TokenFile) != "token" {
		return nil, fmt.Errorf("token file %s: the service-account volume names it token", opts.TokenFile)
	}
	if len(opts.CA) > 0 {
		if err := os.WriteFile(filepath.Join(tokenDir, "ca.crt"), opts.CA, 0o644); err != nil {
			return nil, err
		}
	}
	args := []string{
		"-log-level=" + opts.LogLevel,
		"-cni-bin-dir=" + opts.BinDir,
		"-cni-net-dir=" + opts.NetDir,
		"-multus=" + strconv.FormatBool(opts.Multus),
		"-installation-id=" + opts.InstallationID,
		"-bin-source-dir=" + b.SourceDir,
	}
	if opts.AutorotateToken {
		args = append(args, "-autorotate-token=true")
	}
	argv := append([]string{"--mount", "--propagation", "private", "sh", "-c", mountScript, tokenDir, b.InstallCNI}, args...)
	cmd := exec.Command("unshare", argv...)
	if opts.MountNS != "" {
		cmd = exec.Command("nsenter", append([]string{"--mount=" + opts.MountNS, "--", "unshare"}, argv...)...)
	}
	cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"POD_UID=" + opts.InstallationID,
		"KUBERNETES_SERVICE_HOST=" + host,
		"KUBERNETES_SERVICE_PORT=" + port,
	}
	cmd.Stdout, cmd.Stderr = opts.Log, opts.Log
	p, err := proc.Start(cmd, opts.NetNS)
	if err != nil {
		return nil, fmt.Errorf("starting install-cni: %w", err)
	}
	return &Installer{p: p, opts: opts}, nil
}

func serverHostPort(server string) (string, string, error) {
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return "", "", fmt.Errorf("API server URL %q: %v", server, err)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return u.Hostname(), "443", nil
	}
	return host, port, nil
}

// Kubeconfig is the file the installer writes for its plugin (inside
// NetDir).
func (i *Installer) Kubeconfig() string {
	return filepath.Join(i.opts.NetDir, KubeconfigPrefix+i.opts.InstallationID)
}

// Pid is the installer's process id.
func (i *Installer) Pid() int { return i.p.Cmd.Process.Pid }

// Done is closed when the installer has exited.
func (i *Installer) Done() <-chan struct{} { return i.p.Done() }

// Terminate sends SIGTERM, as kubelet does when the pod is deleted: the
// installer removes its entry, the plugin binary, its token copy and its
// kubeconfig, then exits. It does not wait.
func (i *Installer) Terminate() error { return i.p.Signal(syscall.SIGTERM) }

// Stop sends SIGTERM and waits for the cleanup (SIGKILL after grace, as
// kubelet does after terminationGracePeriodSeconds); it returns the exit
// code (-1 when killed).
func (i *Installer) Stop(grace time.Duration) int {
	i.p.Stop(grace)
	code, _ := i.p.ExitCode()
	return code
}

// Kill ends the installer without its cleanup (a node that loses power, an
// OOM kill).
func (i *Installer) Kill() {
	_ = i.p.Signal(syscall.SIGKILL)
	<-i.p.Done()
}
