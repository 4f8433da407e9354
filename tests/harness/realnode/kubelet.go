package realnode

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"k8s.io/client-go/rest"

	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/cluster"
	"github.com/consul-cni-repair/consul-cni-repair/tests/harness/proc"
)

// KubeletPort is kubelet's API port on the node IP (each node has its own
// network namespace).
const KubeletPort = 10250

// kubeletConfig is the KubeletConfiguration of a node. The settings a test
// node needs: failCgroupV1 false (hosts with hybrid cgroup v1), cgroupfs, no swap
// check, no iptables utility chains (the host's tables are shared), image
// GC at 100 % (local images are never pulled again), a relaxed evictionHard;
// its API on the node IP, no read-only or healthz port.
var kubeletConfig = template.Must(template.New("kubelet").Parse(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: "{{.IP}}"
port: {{.Port}}
readOnlyPort: 0
healthzPort: 0
enableServer: true
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: "{{.CA}}"
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: "/{{.Cgroup}}"
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: "unix://{{.Sock}}"
makeIPTablesUtilChains: false
podLogsDir: "{{.PodLogs}}"
volumePluginDir: "{{.VolumePlugins}}"
resolvConf: "{{.ResolvConf}}"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 87600h
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
  imagefs.inodesFree: "1%"
serializeImagePulls: false
rotateCertificates: false
serverTLSBootstrap: false
protectKernelDefaults: false
nodeStatusUpdateFrequency: 10s
nodeStatusReportFrequency: 1m
syncFrequency: 10s
fileCheckFrequency: 20s
maxPods: 110
{{- if .Taints}}
registerWithTaints:
{{- range .Taints}}
- key: "{{.Key}}"
  value: "{{.Value}}"
  effect: "{{.Effect}}"
{{- end}}
{{- end}}
`))

// startKubelet writes kubelet's configuration and kubeconfig on first use
// and starts kubelet.
func (n *Node) startKubelet() error {
	if n.kubeletArg == nil {
		if err := n.writeKubeletConfig(); err != nil {
			return err
		}
	}
	f, err := os.OpenFile(n.paths.kubeletLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := n.inNode(filepath.Join(n.paths.bin, "kubelet"), n.kubeletArg...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = n.Dir
	n.mu.Lock()
	defer n.mu.Unlock()
	n.KubeletStarted = time.Now()
	p, err := proc.Start(cmd, n.Netns)
	if err != nil {
		return fmt.Errorf("start kubelet: %w", err)
	}
	n.kubelet = p
	return nil
}

// writeKubeletConfiguration writes the node's KubeletConfiguration.
func (n *Node) writeKubeletConfiguration() error {
	var b bytes.Buffer
	if err := kubeletConfig.Execute(&b, map[string]any{
		"IP": n.IP.String(), "Port": KubeletPort, "CA": n.c.CAFile, "Cgroup": n.cgroupName(),
		"Sock": n.paths.containerdSock, "PodLogs": n.paths.podLogs, "VolumePlugins": n.paths.volumePlugins,
		"ResolvConf": n.paths.resolvCfg, "Taints": n.opts.Taints,
	}); err != nil {
		return err
	}
	return os.WriteFile(n.paths.kubeletConfig, b.Bytes(), 0o644)
}

func (n *Node) writeKubeletConfig() error {
	// Pods get no name servers: nothing resolves names here.
	if err := os.WriteFile(n.paths.resolvCfg, nil, 0o644); err != nil {
		return err
	}
	if err := n.writeKubeletConfiguration(); err != nil {
		return err
	}
	// Kubelet acts as the admin: the control plane authorizes with RBAC
	// only (no Node authorizer), so a node identity would need bindings
	// that test nothing of this project. It reaches the apiserver through
	// the node's forward.
	cfg := rest.CopyConfig(n.c.Config)
	cfg.Host = APIServerURL()
	if err := cluster.WriteKubeconfig(n.paths.kubeconfig, cfg, "admin"); err != nil {
		return err
	}
	n.kubeletArg = []string{
		"--config=" + n.paths.kubeletConfig,
		"--kubeconfig=" + n.paths.kubeconfig,
		"--root-dir=" + n.paths.kubeletRoot,
		"--cert-dir=" + n.paths.kubeletCerts,
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP.String(),
		"--v=" + strconv.Itoa(n.opts.Verbosity),
	}
	if len(n.opts.Labels) > 0 {
		n.kubeletArg = append(n.kubeletArg, "--node-labels="+joinLabels(n.opts.Labels))
	}
	return nil
}

func joinLabels(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

func (n *Node) stopKubelet() {
	n.mu.Lock()
	p := n.kubelet
	n.kubelet = nil // stopped on purpose: not reported by exited
	n.mu.Unlock()
	if p != nil {
		p.Stop(10 * time.Second)
	}
}

// KubeletLog and ContainerdLog are the paths of the two daemons' logs.
func (n *Node) KubeletLog() string    { return n.paths.kubeletLog }
func (n *Node) ContainerdLog() string { return n.paths.containerdLog }
