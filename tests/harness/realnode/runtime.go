package realnode

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/template"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
)

// paths are the files and directories of a node (package documentation).
type paths struct {
	bin                                  string
	containerdRoot, containerdState      string
	containerdSock, containerdConfig     string
	containerdLog, containerdOpt         string
	runcRoot                             string
	cniConf, cniBin, cniNetworks         string
	kubeletRoot, kubeletCerts, podLogs   string
	kubeletConfig, kubeconfig            string
	kubeletLog, volumePlugins, resolvCfg string
}

func newPaths(dir, bin string) paths {
	j := func(p ...string) string { return filepath.Join(append([]string{dir}, p...)...) }
	return paths{
		bin:              bin,
		containerdRoot:   j("containerd", "root"),
		containerdState:  j("containerd", "state"),
		containerdSock:   j("containerd.sock"),
		containerdConfig: j("containerd.toml"),
		containerdLog:    j("containerd.log"),
		containerdOpt:    j("containerd", "opt"),
		runcRoot:         j("runc"),
		cniConf:          j("cni", "net.d"),
		cniBin:           j("cni", "bin"),
		cniNetworks:      j("cni", "networks"),
		kubeletRoot:      j("kubelet"),
		kubeletCerts:     j("kubelet", "pki"),
		podLogs:          j("pod-logs"),
		kubeletConfig:    j("kubelet.yaml"),
		kubeconfig:       j("kubelet.kubeconfig"),
		kubeletLog:       j("kubelet.log"),
		volumePlugins:    j("volume-plugins"),
		resolvCfg:        j("resolv.conf"),
	}
}

func (p paths) dirs() []string {
	return []string{p.containerdRoot, p.containerdState, p.containerdOpt, p.runcRoot, p.cniConf, p.cniBin,
		p.cniNetworks, p.kubeletRoot, p.kubeletCerts, p.podLogs, p.volumePlugins}
}

// PauseImage is the sandbox image every node's containerd is configured
// with (BuildImages makes it from tests/cmd/pause).
const PauseImage = "ccr.test/pause:v1"

// containerdConfig is containerd's configuration (version 3). The settings
// a test node needs: restrict_oom_score_adj (the tests may run without
// CAP_SYS_RESOURCE), disable_apparmor, the netns under the node's state
// dir, the snapshotters that need more than a plain directory and NRI
// disabled, the sandbox image pinned to the
// imported pause image; every path in the node's directory.
var containerdConfig = template.Must(template.New("containerd").Parse(`version = 3
root = "{{.Root}}"
state = "{{.State}}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{{.Sock}}"

[ttrpc]
  address = "{{.Sock}}.ttrpc"

[plugins.'io.containerd.internal.v1.opt']
  path = "{{.Opt}}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{{.Pause}}"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{{.Runc}}"
        SystemdCgroup = false
        Root = "{{.RuncRoot}}"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{{.CNIBin}}"]
    conf_dir = "{{.CNIConf}}"
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`))

func (n *Node) writeContainerdConfig() error {
	var b bytes.Buffer
	err := containerdConfig.Execute(&b, map[string]string{
		"Root": n.paths.containerdRoot, "State": n.paths.containerdState, "Sock": n.paths.containerdSock,
		"Opt": n.paths.containerdOpt, "Pause": PauseImage, "Runc": filepath.Join(n.paths.bin, "runc"),
		"RuncRoot": n.paths.runcRoot, "CNIBin": n.paths.cniBin, "CNIConf": n.paths.cniConf,
	})
	if err != nil {
		return err
	}
	return os.WriteFile(n.paths.containerdConfig, b.Bytes(), 0o644)
}

// startRuntime starts containerd, waits until it answers on its socket and
// binds that socket at HostCRISocket in the node.
func (n *Node) startRuntime(ctx context.Context) error {
	if err := n.writeContainerdConfig(); err != nil {
		return err
	}
	f, err := os.OpenFile(n.paths.containerdLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := n.inNode(filepath.Join(n.paths.bin, "containerd"), "--config", n.paths.containerdConfig)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = n.Dir
	// The shim is found on PATH.
	cmd.Env = append(os.Environ(), "PATH="+n.paths.bin+":"+os.Getenv("PATH"))
	p, err := proc.Start(cmd, n.Netns)
	if err != nil {
		return fmt.Errorf("start containerd: %w", err)
	}
	n.mu.Lock()
	n.containerd = p
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := n.exited(); err != nil {
			return false, err
		}
		c, err := net.Dial("unix", n.paths.containerdSock)
		if err != nil {
			return false, nil
		}
		c.Close()
		_, err = n.Ctr(ctx, "version")
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("containerd not serving on %s: %w\n--- containerd log:\n%s", n.paths.containerdSock, err, tailFile(n.paths.containerdLog, 25))
	}
	return n.bindCRISocket()
}

// Ctr runs ctr against the node's containerd in namespace k8s.io and
// returns its standard output.
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	a := append([]string{"--address", n.paths.containerdSock, "--namespace", "k8s.io"}, args...)
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(n.paths.bin, "ctr"), a...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// ImportImage imports an OCI archive (this machine's platform) into the
// node's containerd, unpacked for the CRI plugin's snapshotter, under the
// name the archive gives it.
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	_, err := n.Ctr(ctx, "images", "import", "--snapshotter", "overlayfs", archive)
	return err
}

func (n *Node) stopContainerd() {
	n.mu.Lock()
	p := n.containerd
	n.containerd = nil // stopped on purpose: not reported by exited
	n.mu.Unlock()
	if p != nil {
		p.Stop(10 * time.Second)
	}
}

// ShimSockets are the paths of the shim sockets of the node's containers
// and sandboxes (containerd names them by a hash of its address, the
// namespace and the id, under /run/containerd/s whatever its state dir).
func (n *Node) ShimSockets(ctx context.Context) ([]string, error) {
	out, err := n.Ctr(ctx, "containers", "ls", "-q")
	if err != nil {
		return nil, err
	}
	var socks []string
	for _, id := range strings.Fields(out) {
		sum := sha256.Sum256([]byte(filepath.Join(n.paths.containerdSock, "k8s.io", id)))
		socks = append(socks, filepath.Join(shimSocketDir, hex.EncodeToString(sum[:])))
	}
	return socks, nil
}

// CRISocket is the node's containerd CRI socket (the node's own path: it is
// not at containerd's default /run/containerd/containerd.sock).
func (n *Node) CRISocket() string { return n.paths.containerdSock }

// Command returns a command that runs bin in the node's mount namespace,
// where the runtime's netns bind mounts and the node's CNI directories are
// (the view a DaemonSet pod's hostPath mounts have); start it with
// tests/harness/proc.
func (n *Node) Command(bin string, args ...string) *exec.Cmd { return n.inNode(bin, args...) }
